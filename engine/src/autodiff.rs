//! Reverse-mode autodiff on the graph IR: appends the backward of a forward graph.
//!
//! Walks the forward nodes in reverse, sums the gradient contributions of each output (several
//! when a tensor is used more than once — tied weights, residuals), and applies the op's gradient
//! rule, which emits backward nodes. The loss is seeded with 1.0 (a `fill` node, which the loss
//! scaler can later replace). Each parameter's total gradient is recorded in
//! [`Graph::param_grad`]; the executor writes it at the parameter's (offset, len) of the flat
//! gradient buffer. Aux outputs (layer_norm's mean/rstd, attention's probabilities) and masks are
//! constants to the backward; an op without a rule is an error, never skipped.

use crate::graph::{Graph, GraphError, TensorId, TensorKind};
use crate::ops::def::GradCtx;
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
        let mut cx = GradCtx { g: &mut g, node: &node, gout: &out_grads, need: &need };
        let in_grads = node.op.def().grad(&mut cx)?;
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
            for &o in &node.outputs[..node.op.def().differentiable_outputs(node.outputs.len())] {
                req[o.index()] = true;
            }
        }
    }
    req
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

#[cfg(test)]
mod tests;
