//! Linear + cross-entropy: the mean cross-entropy of the logits x·wᵀ [+ bias] over the rows
//! whose label is not the ignore index, and its gradients, row by row without a (rows, V)
//! logits buffer.
//!
//! The numerical definition of [`crate::graph::Op::LinearCrossEntropy`] and its backward: the
//! same function as `ops::matmul` (x·wᵀ), `ops::add` (bias) and `ops::cross_entropy` composed
//! (tested against that composition below), as `torch.nn.functional.cross_entropy(x @ w.T + b,
//! labels, ignore_index=-100)`. Rows with an ignored label cost nothing and get dx = 0, as
//! their logits' gradient is 0 in the composition. References: Liger-Kernel's
//! `fused_linear_cross_entropy`, Apple's Cut Cross-Entropy (Wijmans et al., 2024).

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::{OpError, Real};
use crate::backend::cpu::kernels::cross_entropy::check_labels;
use crate::graph::builder::shape_err;
use crate::graph::GraphError;
use crate::graph::{ElemType, Graph, Node, Op, TensorId};
use crate::plan::split::LossHead;
use crate::DType;

/// (x (…, C), w (V, C), labels (…) i64 [, bias (V)]) → () the mean cross-entropy of the
/// logits x·wᵀ + bias over labels != ignore_index, without the (…, V) logits ever being
/// stored: the kernels compute them a chunk of rows at a time (the pass
/// `fuse_linear_cross_entropy` makes it from an LM head's matmul [+ bias add] and its
/// cross-entropy). Liger-Kernel's `LigerFusedLinearCrossEntropy`, Apple's Cut Cross-Entropy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearCrossEntropy {
    pub ignore_index: i64,
    /// The logits soft-capped before the loss (Gemma 2's `final_logit_softcapping`).
    pub softcap: Option<SoftCap>,
}

/// A tanh soft-cap of the logits, z ↦ cap·tanh(inv·z), as HF's Gemma 2 writes it
/// (`logits / cap`, `tanh`, `* cap`): `inv` and `cap` are the unfused graph's two scales, each
/// as it holds it (inv = 1/cap rounded to f32), so the fused op computes what those three ops do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftCap {
    pub inv: f32,
    pub cap: f32,
}

impl SoftCap {
    /// The capped logit and tanh(inv·z).
    pub fn apply<T: Real>(self, z: T) -> (T, T) {
        let t = (T::from_f64(self.inv.into()) * z).tanh();
        (T::from_f64(self.cap.into()) * t, t)
    }

    /// The gradient of z from that of the capped logit `d` and t = tanh(inv·z), in the unfused
    /// backward's order: ·cap (the outer scale), ·(1 − t²) (tanh), ·inv (the inner scale).
    pub fn grad<T: Real>(self, d: T, t: T) -> T {
        let (inv, cap) = (T::from_f64(self.inv.into()), T::from_f64(self.cap.into()));
        d * cap * (T::ONE - t * t) * inv
    }

    fn attrs(cap: Option<Self>) -> String {
        cap.map_or(String::new(), |s| format!(" softcap={}*tanh({}*z)", s.cap, s.inv))
    }
}

impl Reference for LinearCrossEntropy {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let bias = (a.operands() > 3).then(|| a.f(3));
        let (x, w, labels, c) = (a.f(0), a.f(1), a.ids(2), a.last(0));
        outs[0][0] = linear_cross_entropy(x, w, labels, bias, c, *self, None)?;
        Ok(())
    }
}

impl OpDef for LinearCrossEntropy {
    fn name(&self) -> &'static str {
        "linear_cross_entropy"
    }

    fn attrs(&self) -> String {
        format!("ignore_index={}{}", self.ignore_index, SoftCap::attrs(self.softcap))
    }

    // The fused head never stores the logits: what it holds of them is its chunk of logits in
    // the kernel's scratch. Its outputs are the loss and the gradients of the hidden states and
    // weights: activations and gradients.
    fn loss_head(&self) -> Option<LossHead> {
        Some(LossHead { inputs: &[], outputs: &[], scratch: true })
    }

    fn check_ids<'a>(
        &self,
        g: &Graph,
        node: &Node,
        ids: &dyn Fn(usize) -> Option<&'a [i64]>,
    ) -> Result<(), OpError> {
        labels_in_range(g, node, ids, 0, self.ignore_index)
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        // One node gives dx, dw and dbias (and the loss again, unused here: the training pass
        // `fuse_linear_cross_entropy_backward` makes it the loss and drops the forward).
        let (ins, dy) = (cx.ins(), cx.gy()?);
        let bias = ins.get(3).copied();
        let d = cx.g.linear_cross_entropy_backward(dy, ins[0], ins[1], ins[2], bias, *self)?;
        let mut grads = vec![Some(d[1]), Some(d[2]), None];
        if bias.is_some() {
            grads.push(Some(d[3]));
        }
        Ok(grads)
    }
}

/// (dloss (), x (…, C), w (V, C), labels (…) [, bias (V)]) → (loss (), dx (…, C),
/// dw (V, C) [, dbias (V)]): [`Op::LinearCrossEntropy`]'s gradients, each chunk's logits
/// recomputed and turned into dloss/count·(softmax − onehot) in place, then dx += g·w and
/// dw += gᵀ·x (accumulated in f32). It outputs the loss too (the same sweep computes it):
/// the training pass `fuse_linear_cross_entropy_backward` drops the forward node and
/// lets this one sweep give both — the unfused graph's three head GEMMs, not four.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearCrossEntropyBackward {
    pub ignore_index: i64,
    pub softcap: Option<SoftCap>,
}

impl Reference for LinearCrossEntropyBackward {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let bias = (a.operands() > 4).then(|| a.f(4));
        let (loss, grads) = outs.split_at_mut(1);
        let (dx, rest) = grads.split_at_mut(1);
        let (dw, db) = rest.split_at_mut(1);
        let grads = LceGrads {
            dloss: a.f(0)[0],
            dx: &mut dx[0],
            dw: &mut dw[0],
            db: db.first_mut().map(|d| &mut d[..]),
        };
        let (x, w, labels, c) = (a.f(1), a.f(2), a.ids(3), a.last(1));
        let head = LinearCrossEntropy { ignore_index: self.ignore_index, softcap: self.softcap };
        loss[0][0] = linear_cross_entropy(x, w, labels, bias, c, head, Some(grads))?;
        Ok(())
    }
}

impl OpDef for LinearCrossEntropyBackward {
    fn name(&self) -> &'static str {
        "linear_cross_entropy_backward"
    }

    fn attrs(&self) -> String {
        format!("ignore_index={}{}", self.ignore_index, SoftCap::attrs(self.softcap))
    }

    // The fused head never stores the logits: what it holds of them is its chunk of logits in
    // the kernel's scratch. Its outputs are the loss and the gradients of the hidden states and
    // weights: activations and gradients.
    fn loss_head(&self) -> Option<LossHead> {
        Some(LossHead { inputs: &[], outputs: &[], scratch: true })
    }

    fn check_ids<'a>(
        &self,
        g: &Graph,
        node: &Node,
        ids: &dyn Fn(usize) -> Option<&'a [i64]>,
    ) -> Result<(), OpError> {
        labels_in_range(g, node, ids, 1, self.ignore_index)
    }
}

/// The labels (operand `at + 2`) index w's rows (operand `at + 1`, (V, C)): `at` is 1 in the
/// backward, whose operands start with dloss.
fn labels_in_range<'a>(
    g: &Graph,
    node: &Node,
    ids: &dyn Fn(usize) -> Option<&'a [i64]>,
    at: usize,
    ignore_index: i64,
) -> Result<(), OpError> {
    let v = g.shape(node.inputs[at + 1])[0];
    ids(at + 2).map_or(Ok(()), |l| check_labels(l, v, ignore_index).map(|_| ()))
}

/// Rows of a vocabulary of `v` whose f32 logits fill `bytes`: what a backend sizes its chunk of
/// rows by, to its own target (`backend::cpu::kernels::linear_cross_entropy::CHUNK_LOGITS_BYTES`,
/// `exec::gpu::support::LCE_CHUNK_BYTES`) — small next to the (R, V) logits it replaces (0.82 GB
/// for gpt2 at b8×s512 in f32, 3.3 GB at b16×s1024), large enough that the dw GEMM's K (the
/// chunk's rows) keeps its re-reads of dw (V, C), once per chunk, a small part of its time.
pub fn rows_of_logits(bytes: usize, v: usize) -> usize {
    bytes / (4 * v.max(1))
}

/// Where the gradients go: dx (R, C), dw (V, C), dbias (V) when there is a bias.
pub struct LceGrads<'a, T> {
    pub dloss: T,
    pub dx: &'a mut [T],
    pub dw: &'a mut [T],
    pub db: Option<&'a mut [T]>,
}

/// The mean loss over labelled rows (NaN when none is, as torch's 0/0) of the logits x·wᵀ
/// [+ bias] [soft-capped]; with `grads`, writes dx = G·w, dw = Gᵀ·x, dbias = G's row sum,
/// G = dloss/count·(softmax − onehot) [· the soft-cap's derivative] (ignored rows contribute
/// nothing).
// x: (R, C); w: (V, C); labels: (R); bias: (V)
pub fn linear_cross_entropy<T: Real>(
    x: &[T],
    w: &[T],
    labels: &[i64],
    bias: Option<&[T]>,
    c: usize,
    LinearCrossEntropy { ignore_index, softcap }: LinearCrossEntropy,
    mut grads: Option<LceGrads<'_, T>>,
) -> Result<T, OpError> {
    let v = w.len() / c;
    let mut count = 0usize;
    for (position, &l) in labels.iter().enumerate() {
        if l == ignore_index {
            continue;
        }
        if l < 0 || l as usize >= v {
            return Err(OpError::IndexOutOfRange {
                op: "linear_cross_entropy",
                index: l,
                position,
                limit: v,
            });
        }
        count += 1;
    }
    let scale = |dloss: T| dloss / T::from_f64(count.max(1) as f64);
    if let Some(gr) = grads.as_mut() {
        gr.dx.fill(T::ZERO);
        gr.dw.fill(T::ZERO);
        if let Some(db) = gr.db.as_deref_mut() {
            db.fill(T::ZERO);
        }
    }
    let mut z = vec![T::ZERO; v]; // one row's logits (soft-capped)
    let mut t = vec![T::ZERO; v]; // tanh(inv·z) of the soft-cap
    let mut sum = T::ZERO;
    for (r, (xr, &label)) in x.chunks_exact(c).zip(labels).enumerate() {
        if label == ignore_index {
            continue;
        }
        let y = label as usize;
        for (j, (zj, wj)) in z.iter_mut().zip(w.chunks_exact(c)).enumerate() {
            let mut acc = bias.map_or(T::ZERO, |b| b[j]);
            for (&a, &b) in xr.iter().zip(wj) {
                acc += a * b;
            }
            *zj = acc;
        }
        if let Some(cap) = softcap {
            for (zj, tj) in z.iter_mut().zip(&mut t) {
                (*zj, *tj) = cap.apply(*zj);
            }
        }
        let mut max = T::NEG_INFINITY;
        for &s in &z {
            max = max.max(s);
        }
        let mut se = T::ZERO;
        for &s in &z {
            se += (s - max).exp();
        }
        let lse = max + se.ln();
        sum += lse - z[y];
        let Some(gr) = grads.as_mut() else { continue };
        // g_j = dloss/count·(softmax_j − [j = y]), then its products with w and x.
        let gs = scale(gr.dloss);
        let dxr = &mut gr.dx[r * c..(r + 1) * c];
        for (j, &zj) in z.iter().enumerate() {
            let mut gj = gs * (zj - lse).exp();
            if j == y {
                gj -= gs;
            }
            if let Some(cap) = softcap {
                gj = cap.grad(gj, t[j]);
            }
            let wj = &w[j * c..(j + 1) * c];
            for (d, &b) in dxr.iter_mut().zip(wj) {
                *d += gj * b;
            }
            for (d, &a) in gr.dw[j * c..(j + 1) * c].iter_mut().zip(xr) {
                *d += gj * a;
            }
            if let Some(db) = gr.db.as_deref_mut() {
                db[j] += gj;
            }
        }
    }
    Ok(sum / T::from_f64(count as f64))
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// [`Op::LinearCrossEntropy`]: the mean cross-entropy of x·wᵀ [+ bias] against labels,
    /// the logits never stored. Returns the loss (f32, as [`Graph::cross_entropy`]'s).
    // x: (…, C), w: (V, C), labels: (…), bias: (V) -> ()
    pub fn linear_cross_entropy(
        &mut self,
        x: TensorId,
        w: TensorId,
        labels: TensorId,
        bias: Option<TensorId>,
        head: LinearCrossEntropy,
    ) -> Result<TensorId, GraphError> {
        let op = "linear_cross_entropy";
        self.linear_cross_entropy_operands(op, x, w, labels, bias)?;
        let mut inputs = vec![x, w, labels];
        inputs.extend(bias);
        let loss = (vec![], ElemType::Float(DType::F32));
        Ok(self.push(Op::LinearCrossEntropy(head), inputs, vec![loss])[0])
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
        LinearCrossEntropy { ignore_index, softcap }: LinearCrossEntropy,
    ) -> Result<Vec<TensorId>, GraphError> {
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
            Op::LinearCrossEntropyBackward(LinearCrossEntropyBackward { ignore_index, softcap }),
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
    ) -> Result<(Vec<usize>, Vec<usize>, DType), GraphError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cross_entropy;
    use crate::ops::testutil::*;

    const IGNORE: i64 = -100;
    const PLAIN: LinearCrossEntropy = LinearCrossEntropy { ignore_index: IGNORE, softcap: None };

    /// (loss, dlogits) of the composition: logits = x·wᵀ + b [then cap·tanh(inv·logits), as
    /// `ops::scale` and `ops::tanh` compute it], then `ops::cross_entropy`.
    fn composed(
        x: &[f64],
        w: &[f64],
        b: &[f64],
        labels: &[i64],
        c: usize,
        softcap: Option<SoftCap>,
    ) -> (f64, Vec<f64>, Vec<f64>) {
        let (r, v) = (labels.len(), b.len());
        let mut logits = vec![0.0; r * v];
        for i in 0..r {
            for j in 0..v {
                logits[i * v + j] = b[j] + (0..c).map(|k| x[i * c + k] * w[j * c + k]).sum::<f64>();
            }
        }
        let tanh: Vec<f64> = match softcap {
            Some(s) => logits.iter().map(|&z| (f64::from(s.inv) * z).tanh()).collect(),
            None => vec![],
        };
        let capped: Vec<f64> = match softcap {
            Some(s) => tanh.iter().map(|&t| f64::from(s.cap) * t).collect(),
            None => logits.clone(),
        };
        let l = cross_entropy::cross_entropy_forward(&capped, labels, v, IGNORE).unwrap();
        let mut d = vec![0.0; r * v];
        cross_entropy::cross_entropy_backward(&mut d, 1.3, &capped, labels, v, IGNORE).unwrap();
        if let Some(s) = softcap {
            // d(cap·t)/dz = cap·(1 − t²)·inv (`ops::tanh`'s backward between the two scales').
            for (dj, &t) in d.iter_mut().zip(&tanh) {
                *dj *= f64::from(s.cap) * (1.0 - t * t) * f64::from(s.inv);
            }
        }
        (l, d, logits)
    }

    /// The fused reference against matmul + bias [+ soft-cap] + cross-entropy (f64, 1e-12):
    /// loss, dx, dw, dbias, with ignored rows; and its gradient against finite differences of
    /// its loss. The soft-cap at 0.8 bends the logits (|z| up to ~3).
    #[test]
    fn matches_matmul_bias_then_cross_entropy_and_finite_differences() {
        for softcap in [None, Some(SoftCap { inv: 1.25, cap: 0.8 })] {
            matches_the_composition(softcap);
        }
    }

    fn matches_the_composition(softcap: Option<SoftCap>) {
        let head = LinearCrossEntropy { ignore_index: IGNORE, softcap };
        let (r, c, v) = (7, 5, 11);
        let mut rng = Rng::new(41);
        let x: Vec<f64> = rng.vec(r * c).iter().map(|a| 2.0 * a).collect();
        let w: Vec<f64> = rng.vec(v * c).iter().map(|a| 1.5 * a).collect();
        let b: Vec<f64> = rng.vec(v);
        let labels = [3, IGNORE, 0, 10, IGNORE, 7, 7];
        let (want, dlogits, _) = composed(&x, &w, &b, &labels, c, softcap);
        let (mut dx, mut dw, mut db) = (vec![0.0; r * c], vec![0.0; v * c], vec![0.0; v]);
        let grads = LceGrads { dloss: 1.3, dx: &mut dx, dw: &mut dw, db: Some(&mut db) };
        let l = linear_cross_entropy(&x, &w, &labels, Some(&b), c, head, Some(grads)).unwrap();
        assert!((l - want).abs() <= 1e-12 * want.abs(), "loss {l} vs {want}");
        // dx = dlogits·w, dw = dlogitsᵀ·x, db = Σ_rows dlogits.
        let mut want_dx = vec![0.0; r * c];
        let mut want_dw = vec![0.0; v * c];
        let mut want_db = vec![0.0; v];
        for i in 0..r {
            for j in 0..v {
                let g = dlogits[i * v + j];
                want_db[j] += g;
                for k in 0..c {
                    want_dx[i * c + k] += g * w[j * c + k];
                    want_dw[j * c + k] += g * x[i * c + k];
                }
            }
        }
        assert_close(&dx, &want_dx, 1e-12, "dx");
        assert_close(&dw, &want_dw, 1e-12, "dw");
        assert_close(&db, &want_db, 1e-12, "dbias");
        assert!(dx[c..2 * c].iter().all(|&g| g == 0.0), "an ignored row gets no gradient");
        let loss = |x: &[f64]| {
            1.3 * linear_cross_entropy(x, &w, &labels, Some(&b), c, head, None).unwrap()
        };
        assert_close(&dx, &fd_grad(&x, FD_STEP, loss), FD_TOL, "dx vs finite differences");
    }

    #[test]
    fn bad_label_is_an_error_and_all_ignored_is_nan() {
        let (x, w) = ([0.5f32; 6], [0.25f32; 12]);
        assert!(linear_cross_entropy(&x, &w, &[4, 0], None, 3, PLAIN, None).is_err());
        assert!(linear_cross_entropy(&x, &w, &[-1, 0], None, 3, PLAIN, None).is_err());
        let l = linear_cross_entropy(&x, &w, &[IGNORE, IGNORE], None, 3, PLAIN, None).unwrap();
        assert!(l.is_nan());
    }
}
