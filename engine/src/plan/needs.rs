//! What a kernel of each op needs from the memory plan — the layout of each operand it reads
//! and writes, and the inputs its output may overwrite — stated once for every backend: the CPU
//! kernels (`backend/cpu/kernels`) and the GPU kernels (`engine/kernels/*.cu`) are written to
//! the same contract. A backend states only where its kernel differs, through [`KernelSupport`]:
//! an optional input its kernel does not read ([`KernelSupport::reads`]), or a dtype rule that
//! forbids an in-place merge. Scratch space is the kernel's own and stays with each backend
//! ([`KernelSupport::workspace`]).
//!
//! Every function here matches every op with no catch-all arm: an op added to
//! [`crate::graph::Op`] does not compile until it says what its kernels need.
//!
//! [`KernelSupport`]: super::KernelSupport
//! [`KernelSupport::reads`]: super::KernelSupport::reads
//! [`KernelSupport::workspace`]: super::KernelSupport::workspace

use super::Req;
use crate::graph::Op;

impl Op {
    /// The layout a kernel of this op needs for its input `slot` (operand order as
    /// [`Op`] documents it).
    pub fn read_req(&self, slot: usize) -> Req {
        match self {
            // GEMM operands: transposes fold into the GEMM's flags.
            Op::MatMul { .. } => Req::Matrix,
            Op::Linear { .. } => {
                if slot < 2 {
                    Req::Matrix
                } else {
                    Req::Contig
                }
            }
            // q, k, v: a head's rows inside a (B, T, C) row; the mask is dense.
            Op::Attention { .. } => {
                if slot < 3 {
                    Req::Rows
                } else {
                    Req::Contig
                }
            }
            // (dout, q, k, v) and the forward's output (slot 5) by rows; the saved statistics
            // (slot 4) and the mask (slot 6) dense.
            Op::AttentionBackward { .. } => {
                if slot < 4 || slot == 5 {
                    Req::Rows
                } else {
                    Req::Contig
                }
            }
            // Views and strided copies read any strides.
            Op::Reshape | Op::Permute { .. } | Op::Split { .. } | Op::Concat => Req::Any,
            Op::Fill { .. }
            | Op::Embedding
            | Op::BiasAdd
            | Op::Add
            | Op::Scale { .. }
            | Op::Gelu { .. }
            | Op::Tanh
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Rotary { .. }
            | Op::Softmax { .. }
            | Op::Dropout { .. }
            | Op::CrossEntropy { .. }
            | Op::LinearCrossEntropy { .. }
            | Op::LinearCrossEntropyBackward { .. }
            | Op::AddLayerNorm { .. }
            | Op::AddRmsNorm { .. }
            | Op::EmbeddingBackward
            | Op::ReduceSumLeading
            | Op::GeluBackward { .. }
            | Op::TanhBackward
            | Op::LayerNormBackward
            | Op::RmsNormBackward
            | Op::SoftmaxBackward { .. }
            | Op::CrossEntropyBackward { .. }
            | Op::Unary { .. }
            | Op::Binary { .. }
            | Op::UnaryBackward { .. } => Req::Contig,
        }
    }

    /// The layout a kernel of this op can write its output `slot` in.
    pub fn write_req(&self, slot: usize) -> Req {
        match self {
            // A GEMM's output with a leading dimension; attention's per-head outputs inside a
            // (B, T, C) row.
            Op::MatMul { .. } | Op::AttentionBackward { .. } => Req::Rows,
            Op::Attention { .. } => {
                if slot == 0 {
                    Req::Rows
                } else {
                    Req::Contig
                }
            }
            Op::Fill { .. } | Op::Reshape | Op::Permute { .. } | Op::Split { .. } | Op::Concat => {
                Req::Any
            }
            Op::Embedding
            | Op::Linear { .. }
            | Op::BiasAdd
            | Op::Add
            | Op::Scale { .. }
            | Op::Gelu { .. }
            | Op::Tanh
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Rotary { .. }
            | Op::Softmax { .. }
            | Op::Dropout { .. }
            | Op::CrossEntropy { .. }
            | Op::LinearCrossEntropy { .. }
            | Op::LinearCrossEntropyBackward { .. }
            | Op::AddLayerNorm { .. }
            | Op::AddRmsNorm { .. }
            | Op::EmbeddingBackward
            | Op::ReduceSumLeading
            | Op::GeluBackward { .. }
            | Op::TanhBackward
            | Op::LayerNormBackward
            | Op::RmsNormBackward
            | Op::SoftmaxBackward { .. }
            | Op::CrossEntropyBackward { .. }
            | Op::Unary { .. }
            | Op::Binary { .. }
            | Op::UnaryBackward { .. } => Req::Contig,
        }
    }

    /// Input slots whose buffer output 0 may overwrite, in order of preference: the kernels
    /// read an element (or, for a row kernel, its whole row) before they write it (see the
    /// aliasing notes in `engine/kernels/*.cu` and `backend/cpu/kernels`).
    pub fn inplace_inputs(&self) -> &'static [usize] {
        match self {
            Op::Add | Op::Binary { .. } | Op::AddLayerNorm { .. } | Op::AddRmsNorm { .. } => {
                &[0, 1]
            }
            Op::BiasAdd
            | Op::Scale { .. }
            | Op::Gelu { .. }
            | Op::Tanh
            | Op::Unary { .. }
            | Op::Dropout { .. } => &[0],
            // Rotary reads the pair (x[i], x[i + D/2]) before it writes (y[i], y[i + D/2]);
            // its backward is the same op over dy.
            Op::Rotary { .. } => &[0],
            // Backward ops over dy.
            Op::GeluBackward { .. }
            | Op::TanhBackward
            | Op::UnaryBackward { .. }
            | Op::SoftmaxBackward { .. }
            | Op::CrossEntropyBackward { .. } => &[1],
            Op::Fill { .. }
            | Op::Embedding
            | Op::MatMul { .. }
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Softmax { .. }
            | Op::Reshape
            | Op::Permute { .. }
            | Op::Split { .. }
            | Op::Concat
            | Op::Attention { .. }
            | Op::CrossEntropy { .. }
            | Op::LinearCrossEntropy { .. }
            | Op::LinearCrossEntropyBackward { .. }
            | Op::Linear { .. }
            | Op::EmbeddingBackward
            | Op::ReduceSumLeading
            | Op::LayerNormBackward
            | Op::RmsNormBackward
            | Op::AttentionBackward { .. } => &[],
        }
    }
}
