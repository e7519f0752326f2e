//! Reverse-mode autodiff on the graph IR: appends the backward of a forward graph.
//!
//! Walks the forward nodes in reverse, sums the gradient contributions of each output (several
//! when a tensor is used more than once — tied weights, residuals), and applies the op's gradient
//! rule, which emits backward nodes. The loss is seeded with 1.0 (a `fill` node, which the loss
//! scaler can later replace). Each parameter's total gradient is recorded in
//! [`Graph::param_grad`]; the executor writes it at the parameter's (offset, len) of the flat
//! gradient buffer. Aux outputs (LayerNorm's mean/rstd, attention's probabilities) and masks are
//! constants to the backward; an op without a rule is an error, never skipped.

use crate::graph::{Graph, GraphError, Node, Op, TensorId, TensorKind};
use crate::ops::layout::inverse_perm;
use std::collections::HashMap;

/// Returns the training graph: `forward` with the backward appended and `loss` set.
pub fn backward(forward: &Graph, loss: TensorId) -> Result<Graph, GraphError> {
    if forward.is_training() {
        return Err(GraphError::Autodiff("the graph already has a backward".into()));
    }
    let mut g = forward.clone();
    g.set_loss(loss)?;
    let n_forward = g.nodes.len();
    let requires = requires_grad(&g);

    let mut contribs: HashMap<TensorId, Vec<TensorId>> = HashMap::new();
    let seed = g.fill(&[], 1.0);
    contribs.entry(loss).or_default().push(seed);

    for ni in (0..n_forward).rev() {
        let node = g.nodes[ni].clone();
        let mut out_grads = Vec::with_capacity(node.outputs.len());
        for &o in &node.outputs {
            let parts = contribs.remove(&o).unwrap_or_default();
            out_grads.push(sum_grads(&mut g, o, parts)?);
        }
        if out_grads.iter().all(Option::is_none) {
            continue;
        }
        let need: Vec<bool> = node.inputs.iter().map(|t| requires[t.index()]).collect();
        let in_grads = rule(&mut g, &node, &out_grads, &need)?;
        for ((&inp, grad), &needed) in node.inputs.iter().zip(in_grads).zip(&need) {
            if let (Some(d), true) = (grad, needed) {
                contribs.entry(inp).or_default().push(d);
            }
        }
    }

    let params: Vec<TensorId> = g.params.iter().map(|p| p.tensor).collect();
    let mut grads = Vec::with_capacity(params.len());
    for p in params {
        let parts = contribs.remove(&p).unwrap_or_default();
        grads.push(sum_grads(&mut g, p, parts)?);
    }
    g.param_grads = grads;
    g.is_training = true;
    Ok(g)
}

/// Which tensors depend on a parameter through differentiable outputs.
fn requires_grad(g: &Graph) -> Vec<bool> {
    let mut req = vec![false; g.tensors.len()];
    for p in &g.params {
        req[p.tensor.index()] = true;
    }
    for node in &g.nodes {
        if node.inputs.iter().any(|t| req[t.index()]) {
            for &o in &node.outputs[..differentiable_outputs(node)] {
                req[o.index()] = true;
            }
        }
    }
    req
}

/// How many leading outputs carry gradients (the rest are saved statistics).
fn differentiable_outputs(node: &Node) -> usize {
    match node.op {
        // (y, saved statistics…), (out, probs), (y, pre-activation)
        Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Attention { .. } | Op::Linear { .. } => 1,
        // (sum, y, mean, rstd)
        Op::AddLayerNorm { .. } | Op::AddRmsNorm { .. } => 2,
        Op::Fill { .. }
        | Op::Embedding
        | Op::MatMul { .. }
        | Op::BiasAdd
        | Op::Add
        | Op::Scale { .. }
        | Op::Gelu { .. }
        | Op::Tanh
        | Op::Softmax { .. }
        | Op::Rotary { .. }
        | Op::Dropout { .. }
        | Op::Reshape
        | Op::Permute { .. }
        | Op::Split { .. }
        | Op::Concat
        | Op::CrossEntropy { .. }
        | Op::LinearCrossEntropy { .. }
        | Op::EmbeddingBackward
        | Op::ReduceSumLeading
        | Op::GeluBackward { .. }
        | Op::TanhBackward
        | Op::LayerNormBackward
        | Op::RmsNormBackward
        | Op::SoftmaxBackward { .. }
        | Op::AttentionBackward { .. }
        | Op::CrossEntropyBackward { .. }
        | Op::LinearCrossEntropyBackward { .. }
        | Op::Unary { .. }
        | Op::Binary { .. }
        | Op::UnaryBackward { .. } => node.outputs.len(),
    }
}

/// The total gradient of `of`: the sum of its contributions, None when there are none.
fn sum_grads(
    g: &mut Graph,
    of: TensorId,
    parts: Vec<TensorId>,
) -> Result<Option<TensorId>, GraphError> {
    let mut it = parts.into_iter();
    let Some(mut total) = it.next() else {
        return Ok(None);
    };
    for p in it {
        total = g.add(total, p)?;
    }
    if g.tensor(total).kind == TensorKind::Activation {
        g.set_kind(total, TensorKind::Grad(of));
    }
    Ok(Some(total))
}

/// The gradient rule of one forward node: gradients of its inputs (None where not needed) from
/// the gradients of its outputs.
fn rule(
    g: &mut Graph,
    node: &Node,
    gout: &[Option<TensorId>],
    need: &[bool],
) -> Result<Vec<Option<TensorId>>, GraphError> {
    let ins = &node.inputs;
    let outs = &node.outputs;
    let gy = || {
        gout[0].ok_or_else(|| {
            GraphError::Autodiff(format!("{}: missing output gradient", node.op.name()))
        })
    };
    let shape = |g: &Graph, t: TensorId| g.shape(t).to_vec();
    let grads = match &node.op {
        Op::Fill { .. } => vec![],
        Op::Embedding => {
            let vocab = g.shape(ins[0])[0];
            vec![need[0].then(|| g.embedding_backward(ins[1], gy()?, vocab)).transpose()?, None]
        }
        Op::MatMul { ta, tb } => matmul_rule(g, ins[0], ins[1], gy()?, *ta, *tb, need)?,
        Op::BiasAdd => {
            let c = shape(g, ins[1]);
            let dy = gy()?;
            vec![Some(dy), need[1].then(|| g.reduce_sum_leading(dy, &c)).transpose()?]
        }
        Op::Add => {
            let dy = gy()?;
            let (sa, sb) = (shape(g, ins[0]), shape(g, ins[1]));
            let db =
                if sa == sb || !need[1] { Some(dy) } else { Some(g.reduce_sum_leading(dy, &sb)?) };
            vec![Some(dy), db]
        }
        Op::Scale { s } => vec![Some(g.scale(gy()?, *s)?)],
        Op::Gelu { approx } => vec![Some(g.gelu_backward(ins[0], gy()?, *approx)?)],
        Op::Tanh => vec![Some(g.tanh_backward(outs[0], gy()?)?)],
        Op::Unary { f } => vec![Some(g.apply_backward(*f, ins[0], gy()?)?)],
        // The function's own rule (`ops::pointwise`), broadcast included.
        Op::Binary { f } => {
            let [da, db] = f.gradient(g, ins[0], ins[1], gy()?, [need[0], need[1]])?;
            vec![da, db]
        }
        Op::LayerNorm { .. } => {
            let d = g.layer_norm_backward(gy()?, ins[0], ins[1], outs[1], outs[2])?;
            d.into_iter().map(Some).collect()
        }
        Op::RmsNorm { .. } => {
            let d = g.rms_norm_backward(gy()?, ins[0], ins[1], outs[1])?;
            d.into_iter().map(Some).collect()
        }
        // cos and sin have equal halves (HF's cat(freqs, freqs)), so the transposed Jacobian
        // is the rotation by the opposite angle: the same op with sin negated (ops/rotary.rs).
        Op::Rotary { inverse } => {
            if need[1] || need[2] {
                return Err(GraphError::Autodiff(
                    "rotary: cos or sin depends on a parameter; they are fed inputs without gradient"
                        .into(),
                ));
            }
            vec![Some(g.rotary_op(gy()?, ins[1], ins[2], !inverse)?), None, None]
        }
        Op::Softmax { scale, .. } => {
            no_mask_grad(node, need, 1)?;
            vec![Some(g.softmax_backward(outs[0], gy()?, *scale)?), None]
        }
        Op::Dropout { p, offset } => vec![Some(g.dropout_at(gy()?, *p, *offset)?)],
        Op::Reshape => {
            let sx = shape(g, ins[0]);
            vec![Some(g.reshape(gy()?, &sx)?)]
        }
        Op::Permute { perm } => vec![Some(g.permute(gy()?, &inverse_perm(perm))?)],
        Op::Split { .. } => {
            // Unused pieces contribute zeros.
            let mut pieces = Vec::with_capacity(outs.len());
            for (&o, d) in outs.iter().zip(gout) {
                pieces.push(match d {
                    Some(d) => *d,
                    None => {
                        let s = shape(g, o);
                        g.fill(&s, 0.0)
                    }
                });
            }
            vec![Some(g.concat(&pieces)?)]
        }
        Op::Concat => {
            let sizes: Vec<usize> = ins
                .iter()
                .map(|&t| *g.shape(t).last().expect("concat inputs are >= 1-D"))
                .collect();
            g.split(gy()?, &sizes)?.into_iter().map(Some).collect()
        }
        Op::Attention { scale, causal, dropout_p, offset } => {
            no_mask_grad(node, need, 3)?;
            let attrs = Op::AttentionBackward {
                scale: *scale,
                causal: *causal,
                dropout_p: *dropout_p,
                offset: *offset,
            };
            let d = g.attention_backward(
                attrs,
                gy()?,
                ins[0],
                ins[1],
                ins[2],
                outs[1],
                outs[0],
                ins.get(3).copied(),
            )?;
            d.into_iter().map(Some).chain([None]).collect()
        }
        Op::CrossEntropy { ignore_index } => {
            vec![Some(g.cross_entropy_backward(gy()?, ins[0], ins[1], *ignore_index)?), None]
        }
        Op::LinearCrossEntropy { ignore_index } => {
            // One node gives dx, dw and dbias (and the loss again, unused here: the training
            // pass `fuse_linear_cross_entropy_backward` makes it the loss and drops the forward).
            let bias = ins.get(3).copied();
            let d = g.linear_cross_entropy_backward(
                gy()?,
                ins[0],
                ins[1],
                ins[2],
                bias,
                *ignore_index,
            )?;
            let mut grads = vec![Some(d[1]), Some(d[2]), None];
            if bias.is_some() {
                grads.push(Some(d[3]));
            }
            grads
        }
        Op::Linear { tb, gelu } => {
            // GELU's backward from the saved pre-activation, then what MatMul and BiasAdd
            // would emit: the same backward nodes as the unfused graph.
            let dpre = match gelu {
                Some(approx) => g.gelu_backward(outs[1], gy()?, *approx)?,
                None => gy()?,
            };
            let n = shape(g, ins[2]);
            let dbias = need[2].then(|| g.reduce_sum_leading(dpre, &n)).transpose()?;
            let mut d = matmul_rule(g, ins[0], ins[1], dpre, false, *tb, need)?;
            d.push(dbias);
            d
        }
        Op::AddLayerNorm { .. } => {
            // LayerNorm's backward on the saved sum, plus the gradient reaching the sum from
            // its other uses (the residual stream); both addends get that total.
            let (mut dsum, mut dw, mut db) = (gout[0], None, None);
            if let Some(dy) = gout[1] {
                let d = g.layer_norm_backward(dy, outs[0], ins[2], outs[2], outs[3])?;
                dsum = Some(match dsum {
                    Some(other) => g.add(other, d[0])?,
                    None => d[0],
                });
                (dw, db) = (Some(d[1]), Some(d[2]));
            }
            vec![dsum, dsum, dw, db]
        }
        Op::AddRmsNorm { .. } => {
            // RMSNorm's backward on the saved sum, plus the gradient reaching the sum from its
            // other uses (the residual stream); both addends get that total.
            let (mut dsum, mut dw) = (gout[0], None);
            if let Some(dy) = gout[1] {
                let d = g.rms_norm_backward(dy, outs[0], ins[2], outs[2])?;
                dsum = Some(match dsum {
                    Some(other) => g.add(other, d[0])?,
                    None => d[0],
                });
                dw = Some(d[1]);
            }
            vec![dsum, dsum, dw]
        }
        // Backward-only ops: no double backward.
        op @ (Op::EmbeddingBackward
        | Op::ReduceSumLeading
        | Op::GeluBackward { .. }
        | Op::TanhBackward
        | Op::UnaryBackward { .. }
        | Op::LayerNormBackward
        | Op::RmsNormBackward
        | Op::SoftmaxBackward { .. }
        | Op::AttentionBackward { .. }
        | Op::CrossEntropyBackward { .. }
        | Op::LinearCrossEntropyBackward { .. }) => {
            return Err(GraphError::Autodiff(format!(
                "{} has no gradient rule (double backward is not supported)",
                op.name()
            )));
        }
    };
    Ok(grads)
}

/// The gradients of a matmul as two more matmuls. With a shared 2-D b and a batched a, dB sums
/// over the batch, which the row-flattened a and dC express as one 2-D matmul (the builder
/// rejects ta=true in that case, where flattening would not be a reshape).
fn matmul_rule(
    g: &mut Graph,
    a: TensorId,
    b: TensorId,
    dc: TensorId,
    ta: bool,
    tb: bool,
    need: &[bool],
) -> Result<Vec<Option<TensorId>>, GraphError> {
    let da = if need[0] {
        Some(match (ta, tb) {
            (false, false) => g.matmul(dc, b, false, true)?,
            (false, true) => g.matmul(dc, b, false, false)?,
            (true, false) => g.matmul(b, dc, false, true)?,
            (true, true) => g.matmul(b, dc, true, true)?,
        })
    } else {
        None
    };
    let db = if need[1] {
        let (sa, sb) = (g.shape(a).to_vec(), g.shape(b).to_vec());
        let (a2, dc2) = if sb.len() == 2 && sa.len() > 2 {
            let k = sa[sa.len() - 1];
            let rows = sa.iter().product::<usize>() / k;
            let n = *g.shape(dc).last().expect("matmul output is >= 2-D");
            (g.reshape(a, &[rows, k])?, g.reshape(dc, &[rows, n])?)
        } else {
            (a, dc)
        };
        Some(match (ta, tb) {
            (false, false) => g.matmul(a2, dc2, true, false)?,
            (false, true) => g.matmul(dc2, a2, true, false)?,
            (true, false) => g.matmul(a2, dc2, false, false)?,
            (true, true) => g.matmul(dc2, a2, true, true)?,
        })
    } else {
        None
    };
    Ok(vec![da, db])
}

/// Masks are inputs to the model, not trained: a mask that depends on a parameter is an error.
fn no_mask_grad(node: &Node, need: &[bool], mask_index: usize) -> Result<(), GraphError> {
    if need.get(mask_index).copied().unwrap_or(false) {
        return Err(GraphError::Autodiff(format!(
            "{}: the additive mask depends on a parameter; gradients w.r.t. masks are not supported",
            node.op.name()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
