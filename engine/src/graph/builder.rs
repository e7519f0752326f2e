//! Builder methods: declare inputs and parameters, add ops. Every method infers its output shape
//! and returns a [`GraphError`] naming the op and the operand shapes when they are inconsistent,
//! so a model that the engine cannot run fails when it is built, not when it runs.

use super::error::{fmt_shapes, GraphError};
use super::{
    ElemType, GeluApprox, Graph, Op, Param, TensorId, TensorInfo, TensorKind, IGNORE_INDEX,
};
use crate::graph::op::{
    AddLayerNorm, AddRmsNorm, Attention, Binary, CrossEntropy, CrossEntropyBackward, Dropout, Fill,
    Gelu, GeluBackward, LayerNorm, Linear, LinearCrossEntropy, LinearCrossEntropyBackward, MatMul,
    Permute, RmsNorm, Rotary, Scale, Softmax, SoftmaxBackward, Split, Unary, UnaryBackward,
};
use crate::ops::pointwise::{BinaryFn, UnaryFn};
use crate::DType;

type Result<T> = std::result::Result<T, GraphError>;

/// Options of [`Graph::attention`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionOpts {
    /// Query i attends to keys j ≤ i (GPT-2).
    pub causal: bool,
    /// Multiplier of Q·Kᵀ; `None` means 1/√D, as PyTorch's default.
    pub scale: Option<f32>,
    /// Dropout on the attention probabilities.
    pub dropout_p: f32,
    /// Additive mask broadcastable to (B, H, Tq, Tk), e.g. BERT's (B, 1, 1, T) padding mask.
    pub mask: Option<TensorId>,
}

impl Default for AttentionOpts {
    fn default() -> Self {
        AttentionOpts { causal: false, scale: None, dropout_p: 0.0, mask: None }
    }
}

fn shape_err(op: &'static str, msg: impl Into<String>, named: &[(&str, &[usize])]) -> GraphError {
    GraphError::Shape { op, msg: msg.into(), shapes: fmt_shapes(named) }
}

/// numpy broadcasting of `mask` against `full`, right-aligned, without growing `full`.
fn broadcastable(mask: &[usize], full: &[usize]) -> bool {
    mask.len() <= full.len()
        && mask.iter().rev().zip(full.iter().rev()).all(|(&m, &f)| m == 1 || m == f)
}

fn check_p(op: &'static str, p: f32) -> Result<()> {
    if !(0.0..=1.0).contains(&p) {
        return Err(GraphError::Attr {
            op,
            msg: format!("dropout probability {p} is outside [0, 1]"),
        });
    }
    Ok(())
}

impl Graph {
    // ---------------------------------------------------------------- declarations

    /// An integer input (token ids, labels, position ids), fed as i64 on every step.
    pub fn input_ids(&mut self, name: &str, shape: &[usize]) -> Result<TensorId> {
        self.input(name, shape, ElemType::I64)
    }

    /// A float input (e.g. an additive attention mask), fed as f32 on every step.
    pub fn input_float(&mut self, name: &str, shape: &[usize]) -> Result<TensorId> {
        self.input(name, shape, ElemType::Float(self.dtype))
    }

    fn input(&mut self, name: &str, shape: &[usize], elem: ElemType) -> Result<TensorId> {
        if self.inputs.iter().any(|&t| self.input_name(t) == Some(name)) {
            return Err(GraphError::Duplicate { kind: "input", name: name.to_string() });
        }
        let t = self.new_tensor(shape.to_vec(), elem, TensorKind::Input { name: name.to_string() });
        self.inputs.push(t);
        Ok(t)
    }

    /// Registers a parameter: `numel(shape)` elements of the flat parameter buffer, after the
    /// previous parameter at the next offset aligned to [`super::PARAM_ALIGN_ELEMS`].
    /// To tie weights, register once and use the returned tensor in both places.
    pub fn param(&mut self, name: &str, shape: &[usize]) -> Result<TensorId> {
        if self.param_by_name(name).is_some() {
            return Err(GraphError::Duplicate { kind: "parameter", name: name.to_string() });
        }
        let len: usize = shape.iter().product();
        if len == 0 {
            return Err(shape_err(
                "param",
                format!("parameter '{name}' has no elements"),
                &[("shape", shape)],
            ));
        }
        let t = self.new_tensor(
            shape.to_vec(),
            ElemType::Float(self.dtype),
            TensorKind::Param(self.params.len()),
        );
        let offset = self.num_param_elems.next_multiple_of(super::PARAM_ALIGN_ELEMS);
        self.params.push(Param {
            name: name.to_string(),
            shape: shape.to_vec(),
            offset,
            len,
            tensor: t,
        });
        self.num_param_elems = offset + len;
        Ok(t)
    }

    /// Marks the scalar the executor reports as the loss (autodiff also sets it).
    pub fn set_loss(&mut self, loss: TensorId) -> Result<()> {
        let (shape, _) = self.float_arg("loss", "loss", loss)?;
        if !shape.is_empty() {
            return Err(shape_err("loss", "the loss must be a scalar", &[("loss", &shape)]));
        }
        self.loss = Some(loss);
        Ok(())
    }

    // ---------------------------------------------------------------- forward ops

    /// A constant tensor (the loss seed, zero gradients).
    pub fn fill(&mut self, shape: &[usize], value: f32) -> TensorId {
        self.push(
            Op::Fill(Fill { value }),
            vec![],
            vec![(shape.to_vec(), ElemType::Float(self.dtype))],
        )[0]
    }

    /// Rows of `table` (V, C) gathered by `ids` (…) → (…, C).
    pub fn embedding(&mut self, table: TensorId, ids: TensorId) -> Result<TensorId> {
        let op = "embedding";
        let (ts, dt) = self.float_arg(op, "table", table)?;
        let is = self.ids_arg(op, "ids", ids)?;
        if ts.len() != 2 {
            return Err(shape_err(op, "table must be 2-D (V, C)", &[("table", &ts), ("ids", &is)]));
        }
        let mut out = is;
        out.push(ts[1]);
        Ok(self.push(Op::Embedding, vec![table, ids], vec![(out, ElemType::Float(dt))])[0])
    }

    /// op(a) · op(b) over the last two dims, op = transpose when the flag is set. b is either a
    /// shared 2-D matrix (a weight) or has exactly a's batch dims.
    pub fn matmul(&mut self, a: TensorId, b: TensorId, ta: bool, tb: bool) -> Result<TensorId> {
        let op = "matmul";
        let (sa, dt) = self.float_arg(op, "a", a)?;
        let (sb, _) = self.float_arg(op, "b", b)?;
        let named: &[(&str, &[usize])] = &[("a", &sa), ("b", &sb)];
        let (ra, rb) = (sa.len(), sb.len());
        if ra < 2 || rb < 2 {
            return Err(shape_err(op, "both operands must be at least 2-D", named));
        }
        let (m, ka) = if ta { (sa[ra - 1], sa[ra - 2]) } else { (sa[ra - 2], sa[ra - 1]) };
        let (kb, n) = if tb { (sb[rb - 1], sb[rb - 2]) } else { (sb[rb - 2], sb[rb - 1]) };
        if ka != kb {
            return Err(shape_err(
                op,
                format!("inner dims differ: K={ka} from a (ta={ta}), K={kb} from b (tb={tb})"),
                named,
            ));
        }
        let (batch_a, batch_b) = (&sa[..ra - 2], &sb[..rb - 2]);
        if !batch_b.is_empty() && batch_b != batch_a {
            return Err(shape_err(
                op,
                "b must be 2-D (shared across the batch) or have exactly a's batch dims",
                named,
            ));
        }
        if ta && batch_b.is_empty() && !batch_a.is_empty() {
            return Err(shape_err(
                op,
                "ta=true with a shared 2-D b is not supported (its gradient needs a batched reduction); permute a first",
                named,
            ));
        }
        let mut out = batch_a.to_vec();
        out.extend([m, n]);
        Ok(self.push(Op::MatMul(MatMul { ta, tb }), vec![a, b], vec![(out, ElemType::Float(dt))])
            [0])
    }

    /// HF `nn.Linear`: x · wᵀ (+ bias), w of shape (out, in).
    pub fn linear(&mut self, x: TensorId, w: TensorId, bias: Option<TensorId>) -> Result<TensorId> {
        let y = self.matmul(x, w, false, true)?;
        match bias {
            Some(b) => self.bias_add(y, b),
            None => Ok(y),
        }
    }

    /// x (…, C) + bias (C).
    pub fn bias_add(&mut self, x: TensorId, bias: TensorId) -> Result<TensorId> {
        let op = "bias_add";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let (sb, _) = self.float_arg(op, "bias", bias)?;
        if sx.is_empty() || sb.len() != 1 || sb[0] != sx[sx.len() - 1] {
            return Err(shape_err(
                op,
                "bias must be 1-D with the size of x's last dim",
                &[("x", &sx), ("bias", &sb)],
            ));
        }
        Ok(self.push(Op::BiasAdd, vec![x, bias], vec![(sx, ElemType::Float(dt))])[0])
    }

    /// a + b, where b's shape equals a's or a trailing part of it (e.g. (B, T, C) + (T, C)).
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let op = "add";
        let (sa, dt) = self.float_arg(op, "a", a)?;
        let (sb, _) = self.float_arg(op, "b", b)?;
        if !sa.ends_with(&sb) {
            return Err(shape_err(
                op,
                "b's shape must equal a's or a trailing part of it (broadcast over a's leading dims)",
                &[("a", &sa), ("b", &sb)],
            ));
        }
        Ok(self.push(Op::Add, vec![a, b], vec![(sa, ElemType::Float(dt))])[0])
    }

    /// s · x
    pub fn scale(&mut self, x: TensorId, s: f32) -> Result<TensorId> {
        self.unary("scale", Op::Scale(Scale { s }), x)
    }

    pub fn gelu(&mut self, x: TensorId, approx: GeluApprox) -> Result<TensorId> {
        self.unary("gelu", Op::Gelu(Gelu { approx }), x)
    }

    pub fn tanh(&mut self, x: TensorId) -> Result<TensorId> {
        self.unary("tanh", Op::Tanh, x)
    }

    /// f(x) for a pointwise function of `ops::pointwise`.
    pub fn apply(&mut self, f: UnaryFn, x: TensorId) -> Result<TensorId> {
        self.unary(f.name(), Op::Unary(Unary { f }), x)
    }

    /// f(a, b) for a pointwise function of `ops::pointwise`; b's shape equals a's or a trailing
    /// part of it (broadcast over a's leading dims, as `add`).
    pub fn apply2(&mut self, f: BinaryFn, a: TensorId, b: TensorId) -> Result<TensorId> {
        let op = f.name();
        let (sa, dt) = self.float_arg(op, "a", a)?;
        let (sb, _) = self.float_arg(op, "b", b)?;
        if !sa.ends_with(&sb) {
            return Err(shape_err(
                op,
                "b's shape must equal a's or a trailing part of it (broadcast over a's leading dims)",
                &[("a", &sa), ("b", &sb)],
            ));
        }
        Ok(self.push(Op::Binary(Binary { f }), vec![a, b], vec![(sa, ElemType::Float(dt))])[0])
    }

    /// dx = dy·f'(x), f's backward from the forward's input.
    pub(crate) fn apply_backward(
        &mut self,
        f: UnaryFn,
        x: TensorId,
        dy: TensorId,
    ) -> Result<TensorId> {
        self.binary_same(
            f.backward_name(),
            Op::UnaryBackward(UnaryBackward { f }),
            [("x", x), ("dy", dy)],
        )
    }

    /// LayerNorm over the last dim: w, b of shape (C). Returns y; the node also outputs the row
    /// mean and rstd (kept for the backward).
    pub fn layer_norm(
        &mut self,
        x: TensorId,
        w: TensorId,
        b: TensorId,
        eps: f32,
    ) -> Result<TensorId> {
        let op = "layernorm";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        let (sb, _) = self.float_arg(op, "bias", b)?;
        let named: &[(&str, &[usize])] = &[("x", &sx), ("weight", &sw), ("bias", &sb)];
        if sx.is_empty() || sw != [sx[sx.len() - 1]] || sb != sw {
            return Err(shape_err(
                op,
                "weight and bias must be 1-D with the size of x's last dim",
                named,
            ));
        }
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(GraphError::Attr {
                op,
                msg: format!("eps must be finite and >= 0, got {eps}"),
            });
        }
        let rows = sx[..sx.len() - 1].to_vec();
        let stats = ElemType::Float(DType::F32);
        let outs = vec![(sx, ElemType::Float(dt)), (rows.clone(), stats), (rows, stats)];
        Ok(self.push(Op::LayerNorm(LayerNorm { eps }), vec![x, w, b], outs)[0])
    }

    /// HF `LlamaRMSNorm` over the last dim: y = w·(x·rstd), rstd = 1/√(mean(x²) + eps), computed
    /// in f32; w of shape (C). Returns y; the node also outputs the row rstd (f32, kept for the
    /// backward).
    // x: (…, C), w: (C) -> y (…, C), rstd (…)
    pub fn rms_norm(&mut self, x: TensorId, w: TensorId, eps: f32) -> Result<TensorId> {
        let op = "rms_norm";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        if sx.is_empty() || sw != [sx[sx.len() - 1]] {
            return Err(shape_err(
                op,
                "weight must be 1-D with the size of x's last dim",
                &[("x", &sx), ("weight", &sw)],
            ));
        }
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(GraphError::Attr {
                op,
                msg: format!("eps must be finite and >= 0, got {eps}"),
            });
        }
        let rows = sx[..sx.len() - 1].to_vec();
        let outs = vec![(sx, ElemType::Float(dt)), (rows, ElemType::Float(DType::F32))];
        Ok(self.push(Op::RmsNorm(RmsNorm { eps }), vec![x, w], outs)[0])
    }

    /// HF's `apply_rotary_pos_emb` on one of q, k: x·cos + rotate_half(x)·sin, with
    /// rotate_half(x) = cat(−x[D/2:], x[:D/2]). cos and sin are (T, D) graph inputs (HF's
    /// cos/sin of `cat(freqs, freqs)`: equal halves, which the backward relies on), no gradient.
    // x: (…, T, D), cos, sin: (T, D) -> (…, T, D)
    pub fn rotary(&mut self, x: TensorId, cos: TensorId, sin: TensorId) -> Result<TensorId> {
        self.rotary_op(x, cos, sin, false)
    }

    /// [`Graph::rotary`] with sin negated when `inverse` (its backward).
    pub(crate) fn rotary_op(
        &mut self,
        x: TensorId,
        cos: TensorId,
        sin: TensorId,
        inverse: bool,
    ) -> Result<TensorId> {
        let op = "rotary";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let (sc, _) = self.float_arg(op, "cos", cos)?;
        let (ss, _) = self.float_arg(op, "sin", sin)?;
        let named: &[(&str, &[usize])] = &[("x", &sx), ("cos", &sc), ("sin", &ss)];
        if sx.len() < 2 || sc.len() != 2 || sc != ss || sc[..] != sx[sx.len() - 2..] {
            return Err(shape_err(op, "need x (…, T, D) with cos and sin (T, D)", named));
        }
        if !sc[1].is_multiple_of(2) {
            return Err(shape_err(op, "the rotated dim D must be even", named));
        }
        Ok(self.push(
            Op::Rotary(Rotary { inverse }),
            vec![x, cos, sin],
            vec![(sx, ElemType::Float(dt))],
        )[0])
    }

    /// HF's `repeat_kv` written with reshape and concat: x (B, Hkv, T, D) → (B, Hkv, 1, T·D)
    /// → concat of `n_rep` copies of that tensor along the last dim → (B, Hkv·n_rep, T, D), so
    /// head h of the result is head h / n_rep of x. `n_rep` = 1 returns x. `fuse_attention`
    /// sees through it: a fused attention reads x with Hkv heads.
    // x: (B, Hkv, T, D) -> (B, Hkv·n_rep, T, D)
    pub fn repeat_kv(&mut self, x: TensorId, n_rep: usize) -> Result<TensorId> {
        let op = "repeat_kv";
        let (sx, _) = self.float_arg(op, "x", x)?;
        if sx.len() != 4 || n_rep == 0 {
            return Err(shape_err(
                op,
                format!("x must be 4-D (B, Hkv, T, D) and n_rep >= 1, got n_rep={n_rep}"),
                &[("x", &sx)],
            ));
        }
        if n_rep == 1 {
            return Ok(x);
        }
        let (b, hkv, t, d) = (sx[0], sx[1], sx[2], sx[3]);
        let flat = self.reshape(x, &[b, hkv, 1, t * d])?;
        let rep = self.concat(&vec![flat; n_rep])?;
        self.reshape(rep, &[b, hkv * n_rep, t, d])
    }

    /// softmax(x·scale + mask) over the last dim; `causal` masks j > i over the last two dims;
    /// `mask` is additive and broadcastable to x (it gets no gradient).
    pub fn softmax(
        &mut self,
        x: TensorId,
        scale: f32,
        causal: bool,
        mask: Option<TensorId>,
    ) -> Result<TensorId> {
        let op = "softmax";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        if sx.is_empty() || (causal && sx.len() < 2) {
            return Err(shape_err(op, "x must be at least 1-D (2-D when causal)", &[("x", &sx)]));
        }
        let mut inputs = vec![x];
        if let Some(m) = mask {
            let (sm, _) = self.float_arg(op, "mask", m)?;
            if !broadcastable(&sm, &sx) {
                return Err(shape_err(
                    op,
                    "mask must broadcast to x",
                    &[("x", &sx), ("mask", &sm)],
                ));
            }
            inputs.push(m);
        }
        Ok(self.push(
            Op::Softmax(Softmax { scale, causal }),
            inputs,
            vec![(sx, ElemType::Float(dt))],
        )[0])
    }

    /// Inverted dropout with probability `p`; the site gets its own range of RNG counters.
    pub fn dropout(&mut self, x: TensorId, p: f32) -> Result<TensorId> {
        let op = "dropout";
        check_p(op, p)?;
        let numel = self.info(x)?.numel() as u64;
        let offset = self.rng_offset;
        // A p = 0 site draws no counters, so eliminating it (`passes::eliminate`) leaves every
        // other site's mask unchanged.
        if p > 0.0 {
            self.rng_offset += numel;
        }
        self.unary(op, Op::Dropout(Dropout { p, offset }), x)
    }

    /// The same data under a new shape with the same number of elements.
    pub fn reshape(&mut self, x: TensorId, shape: &[usize]) -> Result<TensorId> {
        let op = "reshape";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        if sx.iter().product::<usize>() != shape.iter().product::<usize>() {
            return Err(shape_err(
                op,
                "the element count changes",
                &[("x", &sx), ("shape", shape)],
            ));
        }
        Ok(self.push(Op::Reshape, vec![x], vec![(shape.to_vec(), ElemType::Float(dt))])[0])
    }

    /// x.permute(perm): output dim `i` is input dim `perm[i]`.
    pub fn permute(&mut self, x: TensorId, perm: &[usize]) -> Result<TensorId> {
        let op = "permute";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let mut seen = vec![false; sx.len()];
        let valid = perm.len() == sx.len()
            && perm.iter().all(|&p| p < sx.len() && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(GraphError::Attr {
                op,
                msg: format!(
                    "{perm:?} is not a permutation of the {} dims of x {}",
                    sx.len(),
                    super::fmt_shape(&sx)
                ),
            });
        }
        let out = perm.iter().map(|&p| sx[p]).collect();
        Ok(self.push(
            Op::Permute(Permute { perm: perm.to_vec() }),
            vec![x],
            vec![(out, ElemType::Float(dt))],
        )[0])
    }

    /// Swaps dims d0 and d1 (a permute).
    pub fn transpose(&mut self, x: TensorId, d0: usize, d1: usize) -> Result<TensorId> {
        let rank = self.info(x)?.shape.len();
        let mut perm: Vec<usize> = (0..rank).collect();
        if d0 < rank && d1 < rank {
            perm.swap(d0, d1);
        } else {
            return Err(GraphError::Attr {
                op: "permute",
                msg: format!("transpose of dims {d0}, {d1} of a {rank}-D tensor"),
            });
        }
        self.permute(x, &perm)
    }

    /// Splits the last dim into pieces of `sizes` (which must add up to it).
    pub fn split(&mut self, x: TensorId, sizes: &[usize]) -> Result<Vec<TensorId>> {
        let op = "split";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        if sx.is_empty()
            || sizes.is_empty()
            || sizes.contains(&0)
            || sizes.iter().sum::<usize>() != sx[sx.len() - 1]
        {
            return Err(shape_err(
                op,
                format!("sizes {sizes:?} must be positive and add up to x's last dim"),
                &[("x", &sx)],
            ));
        }
        let outs = sizes
            .iter()
            .map(|&s| {
                let mut o = sx.clone();
                *o.last_mut().expect("checked non-empty") = s;
                (o, ElemType::Float(dt))
            })
            .collect();
        Ok(self.push(Op::Split(Split { sizes: sizes.to_vec() }), vec![x], outs))
    }

    /// Concatenates along the last dim; all other dims must agree.
    pub fn concat(&mut self, xs: &[TensorId]) -> Result<TensorId> {
        let op = "concat";
        let mut shapes = Vec::with_capacity(xs.len());
        let mut dt = self.dtype;
        for &x in xs {
            let (s, d) = self.float_arg(op, "input", x)?;
            dt = d;
            shapes.push(s);
        }
        let names: Vec<String> = (0..xs.len()).map(|i| format!("x{i}")).collect();
        let named: Vec<(&str, &[usize])> =
            names.iter().map(|n| n.as_str()).zip(shapes.iter().map(|s| s.as_slice())).collect();
        let Some(first) = shapes.first() else {
            return Err(GraphError::Attr { op, msg: "needs at least one input".into() });
        };
        let lead = &first[..first.len().saturating_sub(1)];
        if shapes.iter().any(|s| s.is_empty() || &s[..s.len() - 1] != lead) {
            return Err(shape_err(op, "inputs must agree on all but the last dim", &named));
        }
        let mut out = lead.to_vec();
        out.push(shapes.iter().map(|s| s[s.len() - 1]).sum());
        Ok(self.push(Op::Concat, xs.to_vec(), vec![(out, ElemType::Float(dt))])[0])
    }

    /// softmax(Q·Kᵀ·scale + mask)·V with optional causal mask and dropout on the probabilities.
    /// q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) → (B, H, Tq, Dv).
    pub fn attention(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        opts: AttentionOpts,
    ) -> Result<TensorId> {
        self.attention_at(q, k, v, opts, None)
    }

    /// [`Graph::attention`] whose dropout uses the counters at `offset` (a fused dropout site
    /// keeps its counters: `passes::fuse_attention`), or fresh ones when None.
    pub(crate) fn attention_at(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        opts: AttentionOpts,
        offset: Option<u64>,
    ) -> Result<TensorId> {
        let op = "attention";
        let (sq, dt) = self.float_arg(op, "q", q)?;
        let (sk, _) = self.float_arg(op, "k", k)?;
        let (sv, _) = self.float_arg(op, "v", v)?;
        let named: &[(&str, &[usize])] = &[("q", &sq), ("k", &sk), ("v", &sv)];
        if sq.len() != 4 || sk.len() != 4 || sv.len() != 4 {
            return Err(shape_err(op, "q, k, v must be 4-D (B, H, T, D)", named));
        }
        // Grouped-query / multi-query attention: Hkv kv heads, each read by H/Hkv query heads.
        if sk[0] != sq[0]
            || sk[1] == 0
            || sq[1] % sk[1] != 0
            || sk[3] != sq[3]
            || sv[..3] != sk[..3]
        {
            return Err(shape_err(
                op,
                "need q (B,H,Tq,D), k (B,Hkv,Tk,D), v (B,Hkv,Tk,Dv) with Hkv dividing H",
                named,
            ));
        }
        check_p(op, opts.dropout_p)?;
        let probs_shape = vec![sq[0], sq[1], sq[2], sk[2]];
        let mut inputs = vec![q, k, v];
        if let Some(m) = opts.mask {
            let (sm, _) = self.float_arg(op, "mask", m)?;
            if !broadcastable(&sm, &probs_shape) {
                return Err(shape_err(
                    op,
                    "mask must broadcast to (B, H, Tq, Tk)",
                    &[("q", &sq), ("k", &sk), ("mask", &sm)],
                ));
            }
            inputs.push(m);
        }
        let scale = opts.scale.unwrap_or(1.0 / (sq[3] as f32).sqrt());
        let offset = match offset {
            Some(o) => o,
            None => {
                let o = self.rng_offset;
                if opts.dropout_p > 0.0 {
                    self.rng_offset += probs_shape.iter().product::<usize>() as u64;
                }
                o
            }
        };
        let out = vec![sq[0], sq[1], sq[2], sv[3]];
        let attrs = Op::Attention(Attention {
            scale,
            causal: opts.causal,
            dropout_p: opts.dropout_p,
            offset,
        });
        Ok(self.push(
            attrs,
            inputs,
            vec![(out, ElemType::Float(dt)), (probs_shape, ElemType::Float(dt))],
        )[0])
    }

    /// Mean cross-entropy of `logits` (…, V) against `labels` (…), ignoring label -100.
    pub fn cross_entropy(&mut self, logits: TensorId, labels: TensorId) -> Result<TensorId> {
        self.cross_entropy_with_ignore(logits, labels, IGNORE_INDEX)
    }

    pub fn cross_entropy_with_ignore(
        &mut self,
        logits: TensorId,
        labels: TensorId,
        ignore_index: i64,
    ) -> Result<TensorId> {
        let op = "cross_entropy";
        let (sl, _) = self.float_arg(op, "logits", logits)?;
        let sy = self.ids_arg(op, "labels", labels)?;
        if sl.is_empty() || sy[..] != sl[..sl.len() - 1] {
            return Err(shape_err(
                op,
                "labels must have logits' shape without its last (class) dim",
                &[("logits", &sl), ("labels", &sy)],
            ));
        }
        // The loss stays f32 whatever the storage dtype, as in PyTorch autocast.
        Ok(self.push(
            Op::CrossEntropy(CrossEntropy { ignore_index }),
            vec![logits, labels],
            vec![(vec![], ElemType::Float(DType::F32))],
        )[0])
    }

    // ---------------------------------------------------------------- fused ops (passes)

    /// [`Op::Linear`]: [gelu](x·op(w) + bias) with w a shared 2-D weight, (N, K) when `tb`
    /// else (K, N). Returns y; with `gelu` the node also outputs the pre-activation.
    // x: (…, K), bias: (N) -> (…, N)
    pub fn fused_linear(
        &mut self,
        x: TensorId,
        w: TensorId,
        bias: TensorId,
        tb: bool,
        gelu: Option<GeluApprox>,
    ) -> Result<TensorId> {
        let op = "linear";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let (sw, _) = self.float_arg(op, "w", w)?;
        let (sb, _) = self.float_arg(op, "bias", bias)?;
        let named: &[(&str, &[usize])] = &[("x", &sx), ("w", &sw), ("bias", &sb)];
        if sx.len() < 2 || sw.len() != 2 {
            return Err(shape_err(op, "x must be at least 2-D and w 2-D", named));
        }
        let (k, n) = if tb { (sw[1], sw[0]) } else { (sw[0], sw[1]) };
        if sx[sx.len() - 1] != k || sb != [n] {
            return Err(shape_err(
                op,
                format!("need x (…, {k}) and bias ({n}) for w (tb={tb})"),
                named,
            ));
        }
        let mut out = sx.clone();
        *out.last_mut().expect("checked >= 2-D") = n;
        let f = ElemType::Float(dt);
        let outs = match gelu {
            Some(_) => vec![(out.clone(), f), (out, f)],
            None => vec![(out, f)],
        };
        Ok(self.push(Op::Linear(Linear { tb, gelu }), vec![x, w, bias], outs)[0])
    }

    /// [`Op::LinearCrossEntropy`]: the mean cross-entropy of x·wᵀ [+ bias] against labels,
    /// the logits never stored. Returns the loss (f32, as [`Graph::cross_entropy`]'s).
    // x: (…, C), w: (V, C), labels: (…), bias: (V) -> ()
    pub fn linear_cross_entropy(
        &mut self,
        x: TensorId,
        w: TensorId,
        labels: TensorId,
        bias: Option<TensorId>,
        ignore_index: i64,
    ) -> Result<TensorId> {
        let op = "linear_cross_entropy";
        self.linear_cross_entropy_operands(op, x, w, labels, bias)?;
        let mut inputs = vec![x, w, labels];
        inputs.extend(bias);
        let loss = (vec![], ElemType::Float(DType::F32));
        Ok(self.push(
            Op::LinearCrossEntropy(LinearCrossEntropy { ignore_index }),
            inputs,
            vec![loss],
        )[0])
    }

    /// [`Op::LinearCrossEntropyBackward`]: returns (loss, dx, dw, dbias when there is a bias);
    /// dx, dw and dbias in x's dtype, the loss f32.
    // dloss: (), x: (…, C), w: (V, C), labels: (…), bias: (V) -> (), (…, C), (V, C), (V)
    pub fn linear_cross_entropy_backward(
        &mut self,
        dloss: TensorId,
        x: TensorId,
        w: TensorId,
        labels: TensorId,
        bias: Option<TensorId>,
        ignore_index: i64,
    ) -> Result<Vec<TensorId>> {
        let op = "linear_cross_entropy_backward";
        let (sd, _) = self.float_arg(op, "dloss", dloss)?;
        if !sd.is_empty() {
            return Err(shape_err(op, "dloss must be a scalar", &[("dloss", &sd)]));
        }
        let (sx, sw, dt) = self.linear_cross_entropy_operands(op, x, w, labels, bias)?;
        let f = ElemType::Float(dt);
        let mut outs = vec![(vec![], ElemType::Float(DType::F32)), (sx, f), (sw.clone(), f)];
        if bias.is_some() {
            outs.push((vec![sw[0]], f));
        }
        let mut inputs = vec![dloss, x, w, labels];
        inputs.extend(bias);
        Ok(self.push(
            Op::LinearCrossEntropyBackward(LinearCrossEntropyBackward { ignore_index }),
            inputs,
            outs,
        ))
    }

    /// Checks (x (…, C), w (V, C), labels (…), [bias (V)]); returns x's and w's shapes and
    /// x's dtype.
    fn linear_cross_entropy_operands(
        &self,
        op: &'static str,
        x: TensorId,
        w: TensorId,
        labels: TensorId,
        bias: Option<TensorId>,
    ) -> Result<(Vec<usize>, Vec<usize>, DType)> {
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let (sw, _) = self.float_arg(op, "w", w)?;
        let sy = self.ids_arg(op, "labels", labels)?;
        let sb = match bias {
            Some(b) => Some(self.float_arg(op, "bias", b)?.0),
            None => None,
        };
        let named: &[(&str, &[usize])] =
            &[("x", &sx), ("w", &sw), ("labels", &sy), ("bias", sb.as_deref().unwrap_or(&[]))];
        if sx.is_empty() || sw.len() != 2 || sx[sx.len() - 1] != sw[1] {
            return Err(shape_err(op, "need x (…, C) and w (V, C)", named));
        }
        if sy[..] != sx[..sx.len() - 1] || sb.as_ref().is_some_and(|b| b[..] != [sw[0]]) {
            return Err(shape_err(op, "need labels (…) of x's rows and bias (V)", named));
        }
        Ok((sx, sw, dt))
    }

    /// [`Op::AddLayerNorm`]: (sum = a + b, LayerNorm(sum)) over the last dim; a and b of the
    /// same shape. Returns (sum, y); the node also outputs the row mean and rstd.
    // a, b: (…, C); w, bias: (C) -> (…, C), (…, C)
    pub fn add_layer_norm(
        &mut self,
        a: TensorId,
        b: TensorId,
        w: TensorId,
        bias: TensorId,
        eps: f32,
    ) -> Result<(TensorId, TensorId)> {
        let op = "add_layernorm";
        let (sa, dt) = self.float_arg(op, "a", a)?;
        let (sb, _) = self.float_arg(op, "b", b)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        let (sbias, _) = self.float_arg(op, "bias", bias)?;
        let named: &[(&str, &[usize])] =
            &[("a", &sa), ("b", &sb), ("weight", &sw), ("bias", &sbias)];
        if sa != sb || sa.is_empty() || sw != [sa[sa.len() - 1]] || sbias != sw {
            return Err(shape_err(
                op,
                "a and b must have the same shape, weight and bias the size of its last dim",
                named,
            ));
        }
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(GraphError::Attr {
                op,
                msg: format!("eps must be finite and >= 0, got {eps}"),
            });
        }
        let rows = sa[..sa.len() - 1].to_vec();
        let (f, stats) = (ElemType::Float(dt), ElemType::Float(DType::F32));
        let outs = vec![(sa.clone(), f), (sa, f), (rows.clone(), stats), (rows, stats)];
        let o = self.push(Op::AddLayerNorm(AddLayerNorm { eps }), vec![a, b, w, bias], outs);
        Ok((o[0], o[1]))
    }

    /// [`Op::AddRmsNorm`]: (sum = a + b, RmsNorm(sum)) over the last dim; a and b of the same
    /// shape. Returns (sum, y); the node also outputs the row rstd.
    // a, b: (…, C); w: (C) -> (…, C), (…, C)
    pub fn add_rms_norm(
        &mut self,
        a: TensorId,
        b: TensorId,
        w: TensorId,
        eps: f32,
    ) -> Result<(TensorId, TensorId)> {
        let op = "add_rms_norm";
        let (sa, dt) = self.float_arg(op, "a", a)?;
        let (sb, _) = self.float_arg(op, "b", b)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        if sa != sb || sa.is_empty() || sw != [sa[sa.len() - 1]] {
            return Err(shape_err(
                op,
                "a and b must have the same shape, weight the size of its last dim",
                &[("a", &sa), ("b", &sb), ("weight", &sw)],
            ));
        }
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(GraphError::Attr {
                op,
                msg: format!("eps must be finite and >= 0, got {eps}"),
            });
        }
        let rows = sa[..sa.len() - 1].to_vec();
        let (f, stats) = (ElemType::Float(dt), ElemType::Float(DType::F32));
        let outs = vec![(sa.clone(), f), (sa, f), (rows, stats)];
        let o = self.push(Op::AddRmsNorm(AddRmsNorm { eps }), vec![a, b, w], outs);
        Ok((o[0], o[1]))
    }

    // ---------------------------------------------------------------- backward ops (autodiff)

    /// A dropout reusing a forward site's counters: the backward regenerates its mask.
    pub(crate) fn dropout_at(&mut self, x: TensorId, p: f32, offset: u64) -> Result<TensorId> {
        self.unary("dropout", Op::Dropout(Dropout { p, offset }), x)
    }

    pub(crate) fn embedding_backward(
        &mut self,
        ids: TensorId,
        dy: TensorId,
        vocab: usize,
    ) -> Result<TensorId> {
        let op = "embedding_backward";
        let is = self.ids_arg(op, "ids", ids)?;
        let (sd, dt) = self.float_arg(op, "dy", dy)?;
        if sd.len() != is.len() + 1 || sd[..is.len()] != is[..] {
            return Err(shape_err(op, "dy must be (ids…, C)", &[("ids", &is), ("dy", &sd)]));
        }
        let c = sd[sd.len() - 1];
        Ok(self.push(
            Op::EmbeddingBackward,
            vec![ids, dy],
            vec![(vec![vocab, c], ElemType::Float(dt))],
        )[0])
    }

    /// Sums x over its leading dims down to `shape` (a trailing part of x's shape).
    pub(crate) fn reduce_sum_leading(&mut self, x: TensorId, shape: &[usize]) -> Result<TensorId> {
        let op = "reduce_sum_leading";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        if !sx.ends_with(shape) {
            return Err(shape_err(
                op,
                "target must be a trailing part of x's shape",
                &[("x", &sx), ("target", shape)],
            ));
        }
        Ok(self.push(Op::ReduceSumLeading, vec![x], vec![(shape.to_vec(), ElemType::Float(dt))])[0])
    }

    pub(crate) fn gelu_backward(
        &mut self,
        x: TensorId,
        dy: TensorId,
        approx: GeluApprox,
    ) -> Result<TensorId> {
        self.binary_same(
            "gelu_backward",
            Op::GeluBackward(GeluBackward { approx }),
            [("x", x), ("dy", dy)],
        )
    }

    pub(crate) fn tanh_backward(&mut self, y: TensorId, dy: TensorId) -> Result<TensorId> {
        self.binary_same("tanh_backward", Op::TanhBackward, [("y", y), ("dy", dy)])
    }

    pub(crate) fn softmax_backward(
        &mut self,
        y: TensorId,
        dy: TensorId,
        scale: f32,
    ) -> Result<TensorId> {
        self.binary_same(
            "softmax_backward",
            Op::SoftmaxBackward(SoftmaxBackward { scale }),
            [("y", y), ("dy", dy)],
        )
    }

    /// (dy, x, w, mean, rstd) → [dx, dw, db]
    pub(crate) fn layer_norm_backward(
        &mut self,
        dy: TensorId,
        x: TensorId,
        w: TensorId,
        mean: TensorId,
        rstd: TensorId,
    ) -> Result<Vec<TensorId>> {
        let op = "layernorm_backward";
        let (sd, dt) = self.float_arg(op, "dy", dy)?;
        let (sx, _) = self.float_arg(op, "x", x)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        let (sm, _) = self.float_arg(op, "mean", mean)?;
        let (sr, _) = self.float_arg(op, "rstd", rstd)?;
        if sd != sx
            || sx.is_empty()
            || sw != [sx[sx.len() - 1]]
            || sm[..] != sx[..sx.len() - 1]
            || sr != sm
        {
            let named: &[(&str, &[usize])] =
                &[("dy", &sd), ("x", &sx), ("weight", &sw), ("mean", &sm), ("rstd", &sr)];
            return Err(shape_err(op, "inconsistent operands", named));
        }
        let f = ElemType::Float(dt);
        Ok(self.push(
            Op::LayerNormBackward,
            vec![dy, x, w, mean, rstd],
            vec![(sx, f), (sw.clone(), f), (sw, f)],
        ))
    }

    /// (dy, x, w, rstd) → [dx, dw]
    pub(crate) fn rms_norm_backward(
        &mut self,
        dy: TensorId,
        x: TensorId,
        w: TensorId,
        rstd: TensorId,
    ) -> Result<Vec<TensorId>> {
        let op = "rms_norm_backward";
        let (sd, dt) = self.float_arg(op, "dy", dy)?;
        let (sx, _) = self.float_arg(op, "x", x)?;
        let (sw, _) = self.float_arg(op, "weight", w)?;
        let (sr, _) = self.float_arg(op, "rstd", rstd)?;
        if sd != sx || sx.is_empty() || sw != [sx[sx.len() - 1]] || sr[..] != sx[..sx.len() - 1] {
            let named: &[(&str, &[usize])] =
                &[("dy", &sd), ("x", &sx), ("weight", &sw), ("rstd", &sr)];
            return Err(shape_err(op, "inconsistent operands", named));
        }
        let f = ElemType::Float(dt);
        Ok(self.push(Op::RmsNormBackward, vec![dy, x, w, rstd], vec![(sx, f), (sw, f)]))
    }

    /// (dout, q, k, v, probs, out[, mask]) → [dq, dk, dv], attributes copied from the forward
    /// node. The CPU kernels read the saved probabilities; the GPU kernels save the rows'
    /// log-sum-exp in `probs`' place instead and recompute the probabilities, for which they
    /// need the forward's output (FlashAttention-2's D = rowsum(dO ∘ O)) and its mask.
    #[allow(
        clippy::too_many_arguments,
        reason = "the attention node's inputs and attributes, as ops/attention.rs defines them"
    )]
    pub(crate) fn attention_backward(
        &mut self,
        attrs: Op,
        dout: TensorId,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        probs: TensorId,
        out: TensorId,
        mask: Option<TensorId>,
    ) -> Result<Vec<TensorId>> {
        let op = "attention_backward";
        let (so, dt) = self.float_arg(op, "dout", dout)?;
        let (sq, _) = self.float_arg(op, "q", q)?;
        let (sk, _) = self.float_arg(op, "k", k)?;
        let (sv, _) = self.float_arg(op, "v", v)?;
        let (sp, _) = self.float_arg(op, "probs", probs)?;
        let (sout, _) = self.float_arg(op, "out", out)?;
        if let Some(m) = mask {
            self.float_arg(op, "mask", m)?;
        }
        let ok = sout == so
            && sq.len() == 4
            && sk.len() == 4
            && sv.len() == 4
            && so[..] == [sq[0], sq[1], sq[2], sv[3]]
            && sp[..] == [sq[0], sq[1], sq[2], sk[2]];
        if !ok || !matches!(attrs, Op::AttentionBackward(_)) {
            let named: &[(&str, &[usize])] =
                &[("dout", &so), ("q", &sq), ("k", &sk), ("v", &sv), ("probs", &sp)];
            return Err(shape_err(op, "inconsistent operands", named));
        }
        let f = ElemType::Float(dt);
        let mut inputs = vec![dout, q, k, v, probs, out];
        inputs.extend(mask);
        Ok(self.push(attrs, inputs, vec![(sq, f), (sk, f), (sv, f)]))
    }

    pub(crate) fn cross_entropy_backward(
        &mut self,
        dloss: TensorId,
        logits: TensorId,
        labels: TensorId,
        ignore_index: i64,
    ) -> Result<TensorId> {
        let op = "cross_entropy_backward";
        let (sd, _) = self.float_arg(op, "dloss", dloss)?;
        let (sl, dt) = self.float_arg(op, "logits", logits)?;
        let sy = self.ids_arg(op, "labels", labels)?;
        if !sd.is_empty() || sl.is_empty() || sy[..] != sl[..sl.len() - 1] {
            return Err(shape_err(
                op,
                "inconsistent operands",
                &[("dloss", &sd), ("logits", &sl), ("labels", &sy)],
            ));
        }
        let attrs = Op::CrossEntropyBackward(CrossEntropyBackward { ignore_index });
        Ok(self.push(attrs, vec![dloss, logits, labels], vec![(sl, ElemType::Float(dt))])[0])
    }

    // ---------------------------------------------------------------- helpers

    pub(crate) fn info(&self, t: TensorId) -> Result<&TensorInfo> {
        self.tensors.get(t.index()).ok_or(GraphError::UnknownTensor(t))
    }

    /// The shape and dtype of a float operand, or a type error naming the op and argument.
    fn float_arg(
        &self,
        op: &'static str,
        arg: &'static str,
        t: TensorId,
    ) -> Result<(Vec<usize>, DType)> {
        let info = self.info(t)?;
        match info.elem {
            ElemType::Float(d) => Ok((info.shape.clone(), d)),
            other => Err(GraphError::Type {
                op,
                arg,
                expected: "a float tensor",
                got: format!("{other} {}", super::fmt_shape(&info.shape)),
            }),
        }
    }

    fn ids_arg(&self, op: &'static str, arg: &'static str, t: TensorId) -> Result<Vec<usize>> {
        let info = self.info(t)?;
        match info.elem {
            ElemType::I64 => Ok(info.shape.clone()),
            other => Err(GraphError::Type {
                op,
                arg,
                expected: "an i64 tensor",
                got: format!("{other} {}", super::fmt_shape(&info.shape)),
            }),
        }
    }

    fn unary(&mut self, name: &'static str, op: Op, x: TensorId) -> Result<TensorId> {
        let (sx, dt) = self.float_arg(name, "x", x)?;
        Ok(self.push(op, vec![x], vec![(sx, ElemType::Float(dt))])[0])
    }

    /// Two operands of the same shape → one output of that shape.
    fn binary_same(
        &mut self,
        name: &'static str,
        op: Op,
        args: [(&'static str, TensorId); 2],
    ) -> Result<TensorId> {
        let (s0, dt) = self.float_arg(name, args[0].0, args[0].1)?;
        let (s1, _) = self.float_arg(name, args[1].0, args[1].1)?;
        if s0 != s1 {
            return Err(shape_err(
                name,
                "operands must have the same shape",
                &[(args[0].0, &s0), (args[1].0, &s1)],
            ));
        }
        Ok(self.push(op, vec![args[0].1, args[1].1], vec![(s0, ElemType::Float(dt))])[0])
    }
}
