//! The reference executor: runs a graph's nodes in order with the reference ops, allocating every
//! result on the heap and keeping all of them.
//!
//! It is the engine's definition of "correct": simple loops, no memory plan, no fusion. The
//! planned executor on fast backends replaces it for speed and is tested against it. Everything
//! computes in `T` (f32 in training, f64 in gradient checks); storage dtypes are ignored here.

use crate::graph::op::{
    AddLayerNorm, AddRmsNorm, Attention, AttentionBackward, Binary, CrossEntropy,
    CrossEntropyBackward, Dropout, Fill, Gelu, GeluBackward, LayerNorm, Linear, LinearCrossEntropy,
    LinearCrossEntropyBackward, MatMul, Permute, RmsNorm, Rotary, Scale, Softmax, SoftmaxBackward,
    Split, Unary, UnaryBackward,
};
use crate::graph::{Graph, Node, Op, TensorId, TensorKind};
use crate::ops::attention::{attention_backward, attention_forward, AttnCfg, AttnDims};
use crate::ops::matmul::{matmul_forward, MatMulDims};
use crate::ops::{
    add, cross_entropy, dropout, embedding, gelu, layernorm, layout, linear, linear_cross_entropy,
    pointwise, rmsnorm, rotary, softmax, tanh,
};
use crate::ops::{MaskView, OpError, Real};
use std::borrow::Cow;

pub mod gpu;
pub mod planned;
pub mod profile;

/// Data for one graph input.
#[derive(Debug, Clone, Copy)]
pub enum InputData<'a> {
    Ids(&'a [i64]),
    Floats(&'a [f32]),
}

/// A step's inputs, by the names the graph declared them under.
#[derive(Debug, Clone, Default)]
pub struct Inputs<'a> {
    entries: Vec<(String, InputData<'a>)>,
}

impl<'a> Inputs<'a> {
    pub fn new() -> Self {
        Inputs::default()
    }

    /// Token ids or labels, row-major in the input's declared shape.
    pub fn ids(mut self, name: &str, data: &'a [i64]) -> Self {
        self.entries.push((name.to_string(), InputData::Ids(data)));
        self
    }

    /// The names given, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    /// A float input (e.g. an additive attention mask).
    pub fn floats(mut self, name: &str, data: &'a [f32]) -> Self {
        self.entries.push((name.to_string(), InputData::Floats(data)));
        self
    }

    /// The data given under `name`.
    pub fn get(&self, name: &str) -> Option<InputData<'a>> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, d)| *d)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    #[error("missing input '{0}': the graph declares it, add it to the Inputs")]
    MissingInput(String),
    #[error("unknown input '{name}': the graph declares only {declared}")]
    UnknownInput { name: String, declared: String },
    #[error("input '{name}': expected {expected}, got {got}")]
    BadInput { name: String, expected: String, got: String },
    #[error("the parameter buffer has {got} elements but the graph's parameters need {expected}")]
    ParamLen { expected: usize, got: usize },
    #[error("the gradient buffer has {got} elements but the graph's parameters need {expected}")]
    GradLen { expected: usize, got: usize },
    #[error("node {node} ({op}): {source}")]
    Op { node: usize, op: &'static str, source: OpError },
    #[error("GPU: {0}")]
    Device(String),
    #[error("train_step needs a training graph with a loss: run autodiff::backward on the forward graph")]
    NotTraining,
    #[error(
        "node {node} ({op}) reads {tensor} before any node computes it: the graph is out of order"
    )]
    NotComputed { node: usize, op: &'static str, tensor: TensorId },
}

/// A tensor's data during a run: borrowed parameters and inputs, owned results.
#[derive(Debug, Clone)]
enum Value<'a, T: Real> {
    Float(Cow<'a, [T]>),
    Ids(&'a [i64]),
}

/// Every tensor computed by a run.
#[derive(Debug, Clone)]
pub struct Values<'a, T: Real> {
    vals: Vec<Option<Value<'a, T>>>,
    loss: Option<TensorId>,
}

impl<T: Real> Values<'_, T> {
    /// The data of a float tensor (row-major in its shape).
    pub fn get(&self, t: TensorId) -> Option<&[T]> {
        match self.vals.get(t.index())? {
            Some(Value::Float(v)) => Some(v),
            _ => None,
        }
    }

    /// The graph's loss, if it has one.
    pub fn loss(&self) -> Option<T> {
        self.get(self.loss?).map(|v| v[0])
    }
}

/// Runs graphs with the reference ops.
#[derive(Debug, Clone, Copy)]
pub struct RefExecutor<'g> {
    graph: &'g Graph,
}

impl<'g> RefExecutor<'g> {
    pub fn new(graph: &'g Graph) -> Self {
        RefExecutor { graph }
    }

    /// Runs every node. `params` is the flat parameter buffer; `seed` is this step's dropout seed
    /// (use a new one per step; the backward of the same run reuses it).
    pub fn run<'a, T: Real>(
        &self,
        params: &'a [T],
        inputs: &Inputs<'a>,
        seed: u64,
    ) -> Result<Values<'a, T>, ExecError> {
        let g = self.graph;
        if params.len() != g.num_param_elems() {
            return Err(ExecError::ParamLen { expected: g.num_param_elems(), got: params.len() });
        }
        let mut vals: Vec<Option<Value<'a, T>>> = vec![None; g.tensors().len()];
        for p in g.params() {
            vals[p.tensor.index()] =
                Some(Value::Float(Cow::Borrowed(&params[p.offset..p.offset + p.len])));
        }
        self.bind_inputs(inputs, &mut vals)?;
        for (i, node) in g.nodes().iter().enumerate() {
            // A pass that breaks the execution order is reported, not a panic.
            if let Some(&t) = node.inputs.iter().find(|t| vals[t.index()].is_none()) {
                return Err(ExecError::NotComputed { node: i, op: node.op.name(), tensor: t });
            }
            let t0 = profile::enabled().then(std::time::Instant::now);
            let outs = eval(g, node, &vals, seed).map_err(|source| ExecError::Op {
                node: i,
                op: node.op.name(),
                source,
            })?;
            if let Some(t0) = t0 {
                let key = match &node.op {
                    Op::MatMul(_) => format!("matmul {}", node.op.attrs()),
                    // Not a dispatch: every other op's profile row is its name.
                    op => op.name().to_string(),
                };
                profile::record(key, t0.elapsed());
            }
            for (&t, data) in node.outputs.iter().zip(outs) {
                debug_assert_eq!(data.len(), g.tensor(t).numel(), "{} output size", node.op.name());
                vals[t.index()] = Some(Value::Float(Cow::Owned(data)));
            }
        }
        Ok(Values { vals, loss: g.loss() })
    }

    /// One training step: runs forward and backward, writes every parameter's gradient into
    /// `grads` at its (offset, len) — overwriting, zero for parameters the loss does not depend
    /// on —, zeroes the pads between parameters, and returns the loss.
    pub fn train_step<T: Real>(
        &self,
        params: &[T],
        inputs: &Inputs<'_>,
        seed: u64,
        grads: &mut [T],
    ) -> Result<T, ExecError> {
        let g = self.graph;
        if !g.is_training() || g.loss().is_none() {
            return Err(ExecError::NotTraining);
        }
        if grads.len() != g.num_param_elems() {
            return Err(ExecError::GradLen { expected: g.num_param_elems(), got: grads.len() });
        }
        let values = self.run(params, inputs, seed)?;
        for pad in g.param_pads() {
            grads[pad].fill(T::ZERO);
        }
        for (i, p) in g.params().iter().enumerate() {
            let dst = &mut grads[p.offset..p.offset + p.len];
            match g.param_grad(i).and_then(|t| values.get(t)) {
                Some(src) => dst.copy_from_slice(src),
                None => dst.fill(T::ZERO),
            }
        }
        Ok(values.loss().expect("a training graph computes its loss"))
    }

    fn bind_inputs<'a, T: Real>(
        &self,
        inputs: &Inputs<'a>,
        vals: &mut [Option<Value<'a, T>>],
    ) -> Result<(), ExecError> {
        let g = self.graph;
        let declared: Vec<&str> = g.inputs().iter().filter_map(|&t| g.input_name(t)).collect();
        if let Some((name, _)) =
            inputs.entries.iter().find(|(n, _)| !declared.contains(&n.as_str()))
        {
            return Err(ExecError::UnknownInput {
                name: name.clone(),
                declared: declared.join(", "),
            });
        }
        for &t in g.inputs() {
            let info = g.tensor(t);
            let TensorKind::Input { name } = &info.kind else {
                unreachable!("graph inputs are Input tensors")
            };
            let data = inputs.get(name).ok_or_else(|| ExecError::MissingInput(name.clone()))?;
            let expected = format!(
                "{} {} ({} elements)",
                crate::graph::fmt_shape(&info.shape),
                info.elem,
                info.numel()
            );
            let (value, got) = match data {
                InputData::Ids(d) if !info.elem.is_float() => (Value::Ids(d), d.len()),
                InputData::Floats(d) if info.elem.is_float() => {
                    (Value::Float(T::from_f32_slice(d)), d.len())
                }
                InputData::Ids(d) => {
                    return Err(ExecError::BadInput {
                        name: name.clone(),
                        expected,
                        got: format!("{} i64 ids", d.len()),
                    })
                }
                InputData::Floats(d) => {
                    return Err(ExecError::BadInput {
                        name: name.clone(),
                        expected,
                        got: format!("{} floats", d.len()),
                    })
                }
            };
            if got != info.numel() {
                return Err(ExecError::BadInput {
                    name: name.clone(),
                    expected,
                    got: format!("{got} elements"),
                });
            }
            vals[t.index()] = Some(value);
        }
        Ok(())
    }
}

/// Evaluates one node from the values of its inputs; returns its outputs' data.
fn eval<T: Real>(
    g: &Graph,
    node: &Node,
    vals: &[Option<Value<'_, T>>],
    seed: u64,
) -> Result<Vec<Vec<T>>, OpError> {
    let f = |i: usize| -> &[T] {
        match &vals[node.inputs[i].index()] {
            Some(Value::Float(v)) => v,
            _ => unreachable!("{}: input {i} is not a computed float tensor", node.op.name()),
        }
    };
    let ids = |i: usize| -> &[i64] {
        match &vals[node.inputs[i].index()] {
            Some(Value::Ids(v)) => v,
            _ => unreachable!("{}: input {i} is not an id tensor", node.op.name()),
        }
    };
    let shape = |i: usize| g.shape(node.inputs[i]);
    let last = |i: usize| *shape(i).last().unwrap_or(&1);
    let mut outs: Vec<Vec<T>> =
        node.outputs.iter().map(|&t| vec![T::ZERO; g.tensor(t).numel()]).collect();
    let t = |x: f32| T::from_f64(x as f64);
    let mask = |i: usize, full: &[usize]| {
        (node.inputs.len() > i).then(|| MaskView::new(f(i), shape(i), full))
    };

    match &node.op {
        Op::Fill(Fill { value }) => outs[0].fill(t(*value)),
        Op::Embedding => embedding::embedding_forward(&mut outs[0], ids(1), f(0), shape(0)[1])?,
        Op::MatMul(MatMul { ta, tb }) => {
            let (sa, sb) = (shape(0), shape(1));
            let r = sa.len();
            let (m, k) = if *ta { (sa[r - 1], sa[r - 2]) } else { (sa[r - 2], sa[r - 1]) };
            let n = if *tb { sb[sb.len() - 2] } else { sb[sb.len() - 1] };
            let batch = sa[..r - 2].iter().product();
            let dims = MatMulDims { batch, m, n, k, ta: *ta, tb: *tb, b_batched: sb.len() > 2 };
            matmul_forward(&mut outs[0], f(0), f(1), &dims);
        }
        Op::BiasAdd | Op::Add => add::add_forward(&mut outs[0], f(0), f(1)),
        Op::Scale(Scale { s }) => add::scale_forward(&mut outs[0], f(0), t(*s)),
        Op::Gelu(Gelu { approx }) => gelu::gelu_forward(&mut outs[0], f(0), *approx),
        Op::Tanh => tanh::tanh_forward(&mut outs[0], f(0)),
        Op::Unary(Unary { f: fun }) => pointwise::unary_forward(*fun, &mut outs[0], f(0)),
        Op::Binary(Binary { f: fun }) => pointwise::binary_forward(*fun, &mut outs[0], f(0), f(1)),
        Op::LayerNorm(LayerNorm { eps }) => {
            let [y, mean, rstd] = &mut outs[..] else { unreachable!("layernorm has 3 outputs") };
            layernorm::layernorm_forward(y, mean, rstd, f(0), f(1), f(2), t(*eps));
        }
        Op::RmsNorm(RmsNorm { eps }) => {
            let [y, rstd] = &mut outs[..] else { unreachable!("rms_norm has 2 outputs") };
            rmsnorm::rmsnorm_forward(y, rstd, f(0), f(1), t(*eps));
        }
        Op::Rotary(Rotary { inverse }) => {
            rotary::rotary_forward(&mut outs[0], f(0), f(1), f(2), last(0), *inverse)
        }
        Op::Softmax(Softmax { scale, causal }) => {
            let s = shape(0);
            let tq = if s.len() >= 2 { s[s.len() - 2] } else { 1 };
            let m = mask(1, s);
            softmax::softmax_forward(
                &mut outs[0],
                f(0),
                last(0),
                t(*scale),
                *causal,
                tq,
                m.as_ref(),
            );
        }
        Op::Dropout(Dropout { p, offset }) => {
            dropout::dropout_forward(&mut outs[0], f(0), *p, seed, *offset)
        }
        Op::Reshape => outs[0].copy_from_slice(f(0)),
        Op::Permute(Permute { perm }) => {
            layout::permute_forward(&mut outs[0], f(0), shape(0), perm)
        }
        Op::Split(Split { sizes }) => {
            let mut views: Vec<&mut [T]> = outs.iter_mut().map(|o| &mut o[..]).collect();
            layout::split_forward(&mut views, f(0), sizes);
        }
        Op::Concat => {
            let xs: Vec<&[T]> = (0..node.inputs.len()).map(f).collect();
            let sizes: Vec<usize> = (0..node.inputs.len()).map(last).collect();
            layout::concat_forward(&mut outs[0], &xs, &sizes);
        }
        Op::Attention(Attention { scale, causal, dropout_p, offset }) => {
            let dims = attn_dims(shape(0), shape(1), shape(2));
            let cfg = AttnCfg {
                scale: *scale,
                causal: *causal,
                dropout_p: *dropout_p,
                seed,
                offset: *offset,
            };
            let full = g.shape(node.outputs[1]);
            let m = mask(3, full);
            let [out, probs] = &mut outs[..] else { unreachable!("attention has 2 outputs") };
            attention_forward(out, probs, f(0), f(1), f(2), &dims, &cfg, m.as_ref());
        }
        Op::CrossEntropy(CrossEntropy { ignore_index }) => {
            outs[0][0] =
                cross_entropy::cross_entropy_forward(f(0), ids(1), last(0), *ignore_index)?;
        }
        Op::LinearCrossEntropy(LinearCrossEntropy { ignore_index }) => {
            let bias = (node.inputs.len() > 3).then(|| f(3));
            outs[0][0] = linear_cross_entropy::linear_cross_entropy(
                f(0),
                f(1),
                ids(2),
                bias,
                last(0),
                *ignore_index,
                None,
            )?;
        }
        Op::Linear(Linear { tb, gelu }) => {
            let k = last(0);
            let (y, pre) = match &mut outs[..] {
                [y] => (y, &mut Vec::new()),
                [y, pre] => (y, pre),
                _ => unreachable!("linear has 1 or 2 outputs"),
            };
            linear::linear_forward(y, pre, f(0), f(1), f(2), k, *tb, *gelu);
        }
        Op::AddLayerNorm(AddLayerNorm { eps }) => {
            let [sum, y, mean, rstd] = &mut outs[..] else {
                unreachable!("add_layernorm has 4 outputs")
            };
            layernorm::add_layernorm_forward(sum, y, mean, rstd, f(0), f(1), f(2), f(3), t(*eps));
        }
        Op::AddRmsNorm(AddRmsNorm { eps }) => {
            let [sum, y, rstd] = &mut outs[..] else { unreachable!("add_rms_norm has 3 outputs") };
            rmsnorm::add_rmsnorm_forward(sum, y, rstd, f(0), f(1), f(2), t(*eps));
        }
        Op::EmbeddingBackward => {
            let c = g.shape(node.outputs[0])[1];
            embedding::embedding_backward(&mut outs[0], ids(0), f(1), c)?;
        }
        Op::ReduceSumLeading => add::reduce_sum_leading(&mut outs[0], f(0)),
        Op::GeluBackward(GeluBackward { approx }) => {
            gelu::gelu_backward(&mut outs[0], f(0), f(1), *approx)
        }
        Op::TanhBackward => tanh::tanh_backward(&mut outs[0], f(0), f(1)),
        Op::UnaryBackward(UnaryBackward { f: fun }) => {
            pointwise::unary_backward(*fun, &mut outs[0], f(0), f(1));
        }
        Op::LayerNormBackward => {
            let [dx, dw, db] = &mut outs[..] else {
                unreachable!("layernorm_backward has 3 outputs")
            };
            layernorm::layernorm_backward(dx, dw, db, f(0), f(1), f(2), f(3), f(4));
        }
        Op::RmsNormBackward => {
            let [dx, dw] = &mut outs[..] else { unreachable!("rms_norm_backward has 2 outputs") };
            rmsnorm::rmsnorm_backward(dx, dw, f(0), f(1), f(2), f(3));
        }
        Op::SoftmaxBackward(SoftmaxBackward { scale }) => {
            softmax::softmax_backward(&mut outs[0], f(0), f(1), last(0), t(*scale))
        }
        Op::AttentionBackward(AttentionBackward { scale, causal, dropout_p, offset }) => {
            let dims = attn_dims(shape(1), shape(2), shape(3));
            let cfg = AttnCfg {
                scale: *scale,
                causal: *causal,
                dropout_p: *dropout_p,
                seed,
                offset: *offset,
            };
            let [dq, dk, dv] = &mut outs[..] else {
                unreachable!("attention_backward has 3 outputs")
            };
            attention_backward(dq, dk, dv, f(0), f(1), f(2), f(3), f(4), &dims, &cfg);
        }
        Op::CrossEntropyBackward(CrossEntropyBackward { ignore_index }) => {
            cross_entropy::cross_entropy_backward(
                &mut outs[0],
                f(0)[0],
                f(1),
                ids(2),
                last(1),
                *ignore_index,
            )?;
        }
        Op::LinearCrossEntropyBackward(LinearCrossEntropyBackward { ignore_index }) => {
            let bias = (node.inputs.len() > 4).then(|| f(4));
            let (loss, grads) = outs.split_at_mut(1);
            let (dx, rest) = grads.split_at_mut(1);
            let (dw, db) = rest.split_at_mut(1);
            let grads = linear_cross_entropy::LceGrads {
                dloss: f(0)[0],
                dx: &mut dx[0],
                dw: &mut dw[0],
                db: db.first_mut().map(|d| &mut d[..]),
            };
            loss[0][0] = linear_cross_entropy::linear_cross_entropy(
                f(1),
                f(2),
                ids(3),
                bias,
                last(1),
                *ignore_index,
                Some(grads),
            )?;
        }
    }
    Ok(outs)
}

/// q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) → the kernel's sizes.
fn attn_dims(q: &[usize], k: &[usize], v: &[usize]) -> AttnDims {
    AttnDims { bh: q[0] * q[1], rep: q[1] / k[1], tq: q[2], tk: k[2], d: q[3], dv: v[3] }
}

#[cfg(test)]
mod tests;
