//! The ops of the graph IR, one module each: the op's attribute struct and [`def::OpDef`] (name,
//! gradient rule, memory needs), its `impl Graph` constructor (operand checks, shape rule) and
//! its reference semantics — plain-loop forward and backward functions on contiguous row-major
//! slices, bound to the op by [`def::Reference`].
//!
//! The reference functions are the numerical definition of every op (as llm.c's train_gpt2.c is
//! for its CUDA kernels): the reference executor runs them, and every fast kernel and fusion is
//! tested against them. They follow PyTorch's formulas (erf GELU, biased layer-norm variance with
//! eps inside the sqrt, max-subtracted softmax, log-sum-exp cross-entropy).
//!
//! Conventions: every function *overwrites* its outputs (never accumulates), takes its sizes
//! explicitly, and documents each tensor argument's shape in a comment. Compute type is the
//! generic [`Real`] (f32 in the executor, f64 in the gradient-check tests).

pub mod add;
pub mod attention;
pub mod cross_entropy;
pub mod def;
pub mod dropout;
pub mod embedding;
pub mod fill;
pub mod gelu;
pub mod layernorm;
pub mod layout;
pub mod linear;
pub mod linear_cross_entropy;
pub mod matmul;
pub mod pointwise;
pub mod real;
pub mod rmsnorm;
pub mod rotary;
pub mod softmax;
pub mod swiglu;
pub mod tanh;

#[cfg(test)]
pub(crate) mod testutil;

pub use real::Real;

/// A data-dependent failure of an op (shapes are checked when the graph is built; ids and labels
/// only exist at run time).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpError {
    #[error("{op}: index {index} at position {position} is out of range 0..{limit}")]
    IndexOutOfRange { op: &'static str, index: i64, position: usize, limit: usize },
}

/// An additive mask broadcast (numpy rules, right-aligned; each mask dim is 1 or equal) against
/// the rows of a tensor of shape `full`: gives the mask offset of each row of `full` and the
/// stride of the last dim (0 when broadcast), so kernels can read `mask[row_off + j * last]`.
#[derive(Debug, Clone)]
pub struct MaskView<'a, T> {
    pub data: &'a [T],
    strides: Vec<usize>,
    row_dims: Vec<usize>,
    last_stride: usize,
}

impl<'a, T: Copy> MaskView<'a, T> {
    /// mask: broadcastable to full (checked by the graph builder; panics otherwise).
    pub fn new(data: &'a [T], mask_shape: &[usize], full: &[usize]) -> Self {
        let rank = full.len();
        assert!(mask_shape.len() <= rank && rank >= 1, "mask rank exceeds tensor rank");
        // Right-align the mask shape and compute its strides, 0 on broadcast dims.
        let pad = rank - mask_shape.len();
        let shape: Vec<usize> =
            (0..rank).map(|d| if d < pad { 1 } else { mask_shape[d - pad] }).collect();
        let mut strides = vec![0; rank];
        let mut s = 1;
        for d in (0..rank).rev() {
            assert!(shape[d] == 1 || shape[d] == full[d], "mask not broadcastable");
            strides[d] = if shape[d] == 1 { 0 } else { s };
            s *= shape[d];
        }
        assert_eq!(s, data.len(), "mask data length");
        MaskView {
            data,
            last_stride: strides[rank - 1],
            strides: strides[..rank - 1].to_vec(),
            row_dims: full[..rank - 1].to_vec(),
        }
    }

    /// Offset into `data` of row `row` (a flat index over all but the last dim of `full`).
    pub fn row_offset(&self, mut row: usize) -> usize {
        let mut off = 0;
        for d in (0..self.row_dims.len()).rev() {
            off += (row % self.row_dims[d]) * self.strides[d];
            row /= self.row_dims[d];
        }
        off
    }

    pub fn at(&self, row_off: usize, j: usize) -> T {
        self.data[row_off + j * self.last_stride]
    }
}
