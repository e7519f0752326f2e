//! Launchers of `engine/kernels/softmax.cu`: row softmax with scale, causal cut and a broadcast
//! additive mask, and its backward, one warp per row (the attention probabilities when
//! attention is not fused). CPU counterparts: `backend/cpu/kernels/softmax.rs`.

use super::{kernel_name, mask_args, warp_rows, Arg, Device, Launch, Mask};
use crate::DType;

/// `softmax_forward_<T>`: y = softmax(x·scale + mask) per row of n; the rows are viewed as
/// (B, H, tq, n) for the mask and the causal cut (row r is query r mod tq); y may be x.
// y, x: (rows, n) T, rows = B·h·tq; mask: broadcast to (B, h, tq, n) T, or none
pub struct SoftmaxForward<P> {
    pub dtype: DType,
    pub y: P,
    pub x: P,
    pub mask: Option<Mask<P>>,
    pub rows: usize,
    pub n: usize,
    pub scale: f32,
    pub causal: bool,
    pub h: usize,
    pub tq: usize,
}

impl<P> SoftmaxForward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let (mask, ms) = mask_args(self.mask);
        let mut args = vec![
            Arg::Ptr(self.y),
            Arg::Ptr(self.x),
            mask,
            Arg::I64(self.rows as i64),
            Arg::I32(self.n as i32),
            Arg::F32(self.scale),
            Arg::I32(i32::from(self.causal)),
            Arg::I32(self.h as i32),
            Arg::I32(self.tq as i32),
        ];
        args.extend(ms);
        warp_rows(kernel_name("softmax_forward", self.dtype), self.rows, dev, args)
    }
}

/// `softmax_backward_<T>`: dx = scale·y·(dy − Σ dy·y) per row of n; dx may be dy.
// dx, y, dy: (rows, n) T
pub struct SoftmaxBackward<P> {
    pub dtype: DType,
    pub dx: P,
    pub y: P,
    pub dy: P,
    pub rows: usize,
    pub n: usize,
    pub scale: f32,
}

impl<P> SoftmaxBackward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        warp_rows(
            kernel_name("softmax_backward", self.dtype),
            self.rows,
            dev,
            vec![
                Arg::Ptr(self.dx),
                Arg::Ptr(self.y),
                Arg::Ptr(self.dy),
                Arg::I64(self.rows as i64),
                Arg::I32(self.n as i32),
                Arg::F32(self.scale),
            ],
        )
    }
}
