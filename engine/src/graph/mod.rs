//! The graph IR: tensors with static shapes and a dtype, and a list of nodes in execution order.
//!
//! A model builder declares inputs and parameters, then adds ops through the builder methods
//! (`builder.rs`), each of which infers and checks shapes. Parameters live in one flat f32
//! buffer: registering one assigns it (offset, len) in declaration order, and its gradient lands
//! at the same (offset, len) of one flat gradient buffer — the layout the fused AdamW and ZeRO-1
//! work on. A parameter used twice (tied weights) is simply the same tensor used twice.
//!
//! ```
//! use ortbench_engine::{autodiff, graph::*, Inputs, RefExecutor};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (b, t, c, v) = (2, 4, 8, 16);
//! let mut g = Graph::new();
//! let ids = g.input_ids("input_ids", &[b, t])?;
//! let labels = g.input_ids("labels", &[b, t])?;
//! let wte = g.param("transformer.wte.weight", &[v, c])?;
//! let (ln_w, ln_b) = (g.param("ln_f.weight", &[c])?, g.param("ln_f.bias", &[c])?);
//! let x = g.embedding(wte, ids)?;
//! let x = g.layer_norm(x, ln_w, ln_b, 1e-5)?;
//! let logits = g.matmul(x, wte, false, true)?; // tied LM head
//! let loss = g.cross_entropy(logits, labels)?; // ignores label -100
//! let train = autodiff::backward(&g, loss)?;
//!
//! let params = vec![0.1f32; train.num_param_elems()];
//! let mut grads = vec![0.0f32; train.num_param_elems()];
//! let (id_data, label_data) = ([1i64, 2, 3, 4, 5, 6, 7, 8], [2i64, 3, 4, -100, 6, 7, 8, -100]);
//! let inputs = Inputs::new().ids("input_ids", &id_data).ids("labels", &label_data);
//! let loss = RefExecutor::new(&train).train_step(&params, &inputs, /* dropout seed */ 0, &mut grads)?;
//! assert!((loss - (v as f32).ln()).abs() < 1e-5); // equal weights: uniform logits
//! # Ok(()) }
//! ```

pub(crate) mod builder;
mod display;
mod error;
pub mod op;

pub use crate::ops::attention::AttentionOpts;
pub use error::{fmt_shape, GraphError};
pub use op::{GeluApprox, Op, OpDef, IGNORE_INDEX};

use crate::DType;
use std::fmt;

/// A tensor of a graph, printed `%7`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl TensorId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Element type of a tensor: a float storage dtype, or i64 for token ids and labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemType {
    Float(DType),
    I64,
}

impl ElemType {
    pub fn is_float(self) -> bool {
        matches!(self, ElemType::Float(_))
    }

    /// Short name used in printed graphs: f32, f16, bf16, i64.
    pub fn short_name(self) -> &'static str {
        match self {
            ElemType::Float(DType::F32) => "f32",
            ElemType::Float(DType::F16) => "f16",
            ElemType::Float(DType::BF16) => "bf16",
            ElemType::I64 => "i64",
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// What a tensor is, which decides where its data comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorKind {
    /// Fed by the caller on every step, by name.
    Input { name: String },
    /// A view of the flat parameter buffer; the index into [`Graph::params`].
    Param(usize),
    /// Produced by a forward node.
    Activation,
    /// The gradient of the loss w.r.t. the given tensor (produced by the backward).
    Grad(TensorId),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub shape: Vec<usize>,
    pub elem: ElemType,
    pub kind: TensorKind,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Every parameter's offset in the flat buffers is a multiple of this many elements: 16 bytes
/// in the narrowest storage (the f16/bf16 compute copy), 32 in the f32 masters and gradients.
/// cuBLASLt's kernels load operands with 16-byte vector loads (and TMA on sm90): an operand at
/// an address ≡ 4 mod 16 makes them unusable (PyTorch's PR 98975 met the same). The pads
/// between parameters are zero in every flat buffer and stay zero: no gradient is written
/// there, so AdamW leaves them at 0 and they add nothing to the gradient norm.
pub const PARAM_ALIGN_ELEMS: usize = 8;

/// Offsets of parameters of lengths `lens` laid out in order with [`PARAM_ALIGN_ELEMS`]
/// alignment, and the flat buffer's length (pads between parameters included, none after the
/// last). The one layout rule of the flat buffers: the graph builder and every flat buffer
/// made outside a graph (`Weights::flat`) use it.
pub fn flat_offsets(lens: impl IntoIterator<Item = usize>) -> (Vec<usize>, usize) {
    let mut end = 0usize;
    let offsets = lens
        .into_iter()
        .map(|len| {
            let offset = end.next_multiple_of(PARAM_ALIGN_ELEMS);
            end = offset + len;
            offset
        })
        .collect();
    (offsets, end)
}

/// A parameter: a named slice of the flat parameter buffer (and of the flat gradient buffer),
/// at an offset aligned to [`PARAM_ALIGN_ELEMS`].
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// The checkpoint name, e.g. `bert.encoder.layer.0.attention.self.query.weight`.
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
    pub len: usize,
    pub tensor: TensorId,
}

/// One op applied to input tensors, producing output tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<TensorId>,
    pub outputs: Vec<TensorId>,
}

/// A static graph. Nodes are in execution order (every input is produced before it is used).
#[derive(Debug, Clone)]
pub struct Graph {
    pub(crate) dtype: DType,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) nodes: Vec<Node>,
    pub(crate) params: Vec<Param>,
    pub(crate) inputs: Vec<TensorId>,
    pub(crate) loss: Option<TensorId>,
    /// After autodiff: per parameter, the tensor holding its total gradient (None when the loss
    /// does not depend on it: its gradient is zero).
    pub(crate) param_grads: Vec<Option<TensorId>>,
    pub(crate) is_training: bool,
    pub(crate) num_param_elems: usize,
    /// Next free dropout counter: every dropout site gets a disjoint counter range.
    pub(crate) rng_offset: u64,
}

impl Default for Graph {
    fn default() -> Self {
        Graph::new()
    }
}

impl Graph {
    /// An empty graph computing in f32.
    pub fn new() -> Self {
        Graph::with_dtype(DType::F32)
    }

    /// An empty graph whose activations and parameters are stored as `dtype` (the flat parameter
    /// buffer itself is f32 master weights).
    pub fn with_dtype(dtype: DType) -> Self {
        Graph {
            dtype,
            tensors: Vec::new(),
            nodes: Vec::new(),
            params: Vec::new(),
            inputs: Vec::new(),
            loss: None,
            param_grads: Vec::new(),
            is_training: false,
            num_param_elems: 0,
            rng_offset: 0,
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Panics on a tensor of another graph; builder methods return [`GraphError::UnknownTensor`].
    pub fn tensor(&self, t: TensorId) -> &TensorInfo {
        &self.tensors[t.index()]
    }

    pub fn shape(&self, t: TensorId) -> &[usize] {
        &self.tensor(t).shape
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// The parameter registered under `name`.
    pub fn param_by_name(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }

    /// The graph inputs, in declaration order.
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }

    /// Name of an input tensor.
    pub fn input_name(&self, t: TensorId) -> Option<&str> {
        match &self.tensor(t).kind {
            TensorKind::Input { name } => Some(name),
            _ => None,
        }
    }

    /// Length of the flat parameter (and gradient) buffer, the pads between parameters
    /// included ([`PARAM_ALIGN_ELEMS`]).
    pub fn num_param_elems(&self) -> usize {
        self.num_param_elems
    }

    /// The pads of the flat buffers: the ranges between consecutive parameters.
    pub fn param_pads(&self) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        self.params
            .windows(2)
            .map(|w| w[0].offset + w[0].len..w[1].offset)
            .filter(|r| !r.is_empty())
    }

    /// Parameters (Ψ): the elements of every parameter, the pads excluded.
    pub fn param_count(&self) -> usize {
        self.params.iter().map(|p| p.len).sum()
    }

    pub fn loss(&self) -> Option<TensorId> {
        self.loss
    }

    /// Whether autodiff has appended the backward.
    pub fn is_training(&self) -> bool {
        self.is_training
    }

    /// After autodiff: the tensor holding parameter `i`'s total gradient, None if it is zero.
    pub fn param_grad(&self, i: usize) -> Option<TensorId> {
        self.param_grads.get(i).copied().flatten()
    }

    /// The node producing each tensor (None for inputs and parameters).
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut p = vec![None; self.tensors.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &o in &n.outputs {
                p[o.index()] = Some(i);
            }
        }
        p
    }

    /// The node that writes tensor `t` and `t`'s slot among its outputs (None for an input or
    /// a parameter). A walk over the nodes: for a question asked once per tensor at build time.
    pub fn output_slot(&self, t: TensorId) -> Option<(&Node, usize)> {
        self.nodes.iter().find_map(|n| Some((n, n.outputs.iter().position(|&o| o == t)?)))
    }

    /// Appends a node without checks; builder methods check shapes before calling it.
    pub(crate) fn push(
        &mut self,
        op: Op,
        inputs: Vec<TensorId>,
        outputs: Vec<(Vec<usize>, ElemType)>,
    ) -> Vec<TensorId> {
        let outs: Vec<TensorId> = outputs
            .into_iter()
            .map(|(shape, elem)| self.new_tensor(shape, elem, TensorKind::Activation))
            .collect();
        self.nodes.push(Node { op, inputs, outputs: outs.clone() });
        outs
    }

    pub(crate) fn new_tensor(
        &mut self,
        shape: Vec<usize>,
        elem: ElemType,
        kind: TensorKind,
    ) -> TensorId {
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(TensorInfo { shape, elem, kind });
        id
    }

    pub(crate) fn set_kind(&mut self, t: TensorId, kind: TensorKind) {
        self.tensors[t.index()].kind = kind;
    }
}

#[cfg(test)]
mod tests;
