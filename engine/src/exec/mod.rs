//! The reference executor: runs a graph's nodes in order with the reference ops, allocating every
//! result on the heap and keeping all of them.
//!
//! It is the engine's definition of "correct": simple loops, no memory plan, no fusion. The
//! planned executor on fast backends replaces it for speed and is tested against it. Everything
//! computes in `T` (f32 in training, f64 in gradient checks); storage dtypes are ignored here.

use crate::graph::{Graph, Node, Op, TensorId, TensorKind};
use crate::ops::def::{Arg, EvalArgs};
use crate::ops::{OpError, Real};
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

/// Evaluates one node from the values of its inputs with the op's reference semantics
/// ([`crate::ops::def::Reference`]); returns its outputs' data.
fn eval<'a, T: Real>(
    g: &'a Graph,
    node: &'a Node,
    vals: &'a [Option<Value<'_, T>>],
    seed: u64,
) -> Result<Vec<Vec<T>>, OpError> {
    let args = node
        .inputs
        .iter()
        .enumerate()
        .map(|(i, t)| match &vals[t.index()] {
            Some(Value::Float(v)) => Arg::Float(&v[..]),
            Some(Value::Ids(v)) => Arg::Ids(v),
            None => unreachable!("{}: input {i} is not computed", node.op.name()),
        })
        .collect();
    let a = EvalArgs { g, node, args, seed };
    let mut outs: Vec<Vec<T>> =
        node.outputs.iter().map(|&t| vec![T::ZERO; g.tensor(t).numel()]).collect();
    T::eval_op(node.op.def(), &a, &mut outs)?;
    Ok(outs)
}

#[cfg(test)]
mod tests;
