//! The op set of the IR: small and explicit. Each op's operands are the node's `inputs` (in the
//! order documented here) and its results are the node's `outputs`; the enum carries only
//! attributes. Backward ops exist only where a gradient cannot be written with forward ops.

pub use crate::ops::add::{Add, BiasAdd, ReduceSumLeading, Scale};
pub use crate::ops::attention::{Attention, AttentionBackward};
pub use crate::ops::cross_entropy::{CrossEntropy, CrossEntropyBackward};
pub use crate::ops::def::OpDef;
pub use crate::ops::dropout::Dropout;
pub use crate::ops::embedding::{Embedding, EmbeddingBackward};
pub use crate::ops::fill::Fill;
pub use crate::ops::gelu::GeluApprox;
pub use crate::ops::gelu::{Gelu, GeluBackward};
pub use crate::ops::layernorm::{AddLayerNorm, LayerNorm, LayerNormBackward};
pub use crate::ops::layout::{Concat, Permute, Reshape, Split};
pub use crate::ops::linear::Linear;
pub use crate::ops::linear_cross_entropy::{LinearCrossEntropy, LinearCrossEntropyBackward};
pub use crate::ops::matmul::MatMul;
pub use crate::ops::pointwise::{Binary, Unary, UnaryBackward};
pub use crate::ops::pointwise::{BinaryFn, UnaryFn};
pub use crate::ops::rmsnorm::{AddRmsNorm, RmsNorm, RmsNormBackward};
pub use crate::ops::rotary::Rotary;
pub use crate::ops::softmax::{Softmax, SoftmaxBackward};
pub use crate::ops::swiglu::{SwiGlu, SwiGluBackward};
pub use crate::ops::tanh::{Tanh, TanhBackward};

/// Cross-entropy's default ignore index, as PyTorch's and HF's labels (-100 = padding).
pub const IGNORE_INDEX: i64 = -100;

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Fill(Fill),
    Embedding,
    MatMul(MatMul),
    BiasAdd,
    Add,
    Scale(Scale),
    Gelu(Gelu),
    Tanh,
    Unary(Unary),
    Binary(Binary),
    LayerNorm(LayerNorm),
    RmsNorm(RmsNorm),
    Rotary(Rotary),
    Softmax(Softmax),
    Dropout(Dropout),
    Reshape,
    Permute(Permute),
    Split(Split),
    Concat,
    Attention(Attention),
    CrossEntropy(CrossEntropy),

    // ---- fused forward ops (emitted by `passes`) ----
    Linear(Linear),
    AddLayerNorm(AddLayerNorm),
    AddRmsNorm(AddRmsNorm),
    LinearCrossEntropy(LinearCrossEntropy),
    SwiGlu,

    // ---- backward-only ops (emitted by autodiff) ----
    EmbeddingBackward,
    ReduceSumLeading,
    GeluBackward(GeluBackward),
    TanhBackward,
    UnaryBackward(UnaryBackward),
    LayerNormBackward,
    RmsNormBackward,
    SoftmaxBackward(SoftmaxBackward),
    AttentionBackward(AttentionBackward),
    CrossEntropyBackward(CrossEntropyBackward),
    LinearCrossEntropyBackward(LinearCrossEntropyBackward),
    SwiGluBackward,
}

impl Op {
    /// The op's definition: its name, attributes and memory needs (see [`OpDef`]). The one
    /// match over every op; everything else asks the definition.
    pub fn def(&self) -> &dyn OpDef {
        match self {
            Op::Fill(o) => o,
            Op::Embedding => &Embedding,
            Op::MatMul(o) => o,
            Op::BiasAdd => &BiasAdd,
            Op::Add => &Add,
            Op::Scale(o) => o,
            Op::Gelu(o) => o,
            Op::Tanh => &Tanh,
            Op::Unary(o) => o,
            Op::Binary(o) => o,
            Op::LayerNorm(o) => o,
            Op::RmsNorm(o) => o,
            Op::Rotary(o) => o,
            Op::Softmax(o) => o,
            Op::Dropout(o) => o,
            Op::Reshape => &Reshape,
            Op::Permute(o) => o,
            Op::Split(o) => o,
            Op::Concat => &Concat,
            Op::Attention(o) => o,
            Op::CrossEntropy(o) => o,
            Op::Linear(o) => o,
            Op::AddLayerNorm(o) => o,
            Op::AddRmsNorm(o) => o,
            Op::LinearCrossEntropy(o) => o,
            Op::SwiGlu => &SwiGlu,
            Op::EmbeddingBackward => &EmbeddingBackward,
            Op::ReduceSumLeading => &ReduceSumLeading,
            Op::GeluBackward(o) => o,
            Op::TanhBackward => &TanhBackward,
            Op::UnaryBackward(o) => o,
            Op::LayerNormBackward => &LayerNormBackward,
            Op::RmsNormBackward => &RmsNormBackward,
            Op::SoftmaxBackward(o) => o,
            Op::AttentionBackward(o) => o,
            Op::CrossEntropyBackward(o) => o,
            Op::LinearCrossEntropyBackward(o) => o,
            Op::SwiGluBackward => &SwiGluBackward,
        }
    }

    /// The op's name as printed in graphs and errors.
    pub fn name(&self) -> &'static str {
        self.def().name()
    }

    /// Attributes as printed after the operands: `ta=false tb=true`.
    pub fn attrs(&self) -> String {
        self.def().attrs()
    }
}
