//! Launchers of `engine/kernels/adamw.cu`: the optimizer step over the flat buffers in three
//! launches with no host round trip — per-block sums of squares of the unscaled gradients,
//! one block for the global norm, finite flag and clip coefficient, then the fused AdamW
//! (skipped on the device when not finite). CPU counterparts: `optim/adamw.rs`.

use super::{grid_stride, kernel_name, opt, Arg, Device, Launch, PerStep};
use crate::exec::gpu::support::{EW_BLOCK, NORM_BLOCKS};
use crate::optim::adamw::StepScalars;
use crate::DType;

/// How many partials [`GradSumsqPartial`] writes over `n` gradients: a block of [`EW_BLOCK`]
/// per EW_BLOCK elements, at most [`NORM_BLOCKS`] (more blocks each stride further). The
/// caller sizes the partials buffer by it; ZeRO-1 ranks pass the same `n` (the chunk size)
/// so that their partials add element-wise.
pub fn sumsq_blocks(n: usize) -> u32 {
    (n.div_ceil(EW_BLOCK as usize) as u32).clamp(1, NORM_BLOCKS)
}

/// `grad_sumsq_partial`: partials[b] = Σ (grads·inv_scale)² over block b's grid-stride
/// elements, one block per partial; inv_scale given or the step block's.
// partials: (parts) f32; grads: (n) f32
pub struct GradSumsqPartial<P> {
    pub partials: P,
    pub parts: u32,
    pub grads: P,
    pub n: usize,
    pub inv_scale: PerStep<f32, P>,
}

impl<P> GradSumsqPartial<P> {
    pub fn launch(self, _dev: Device) -> Launch<P> {
        let (inv_scale, block) = self.inv_scale.split();
        Launch {
            name: "grad_sumsq_partial".into(),
            grid: self.parts,
            block: EW_BLOCK,
            smem: 0,
            args: vec![
                Arg::Ptr(self.partials),
                Arg::Ptr(self.grads),
                Arg::I64(self.n as i64),
                Arg::F32(inv_scale),
                block,
            ],
        }
    }
}

/// `grad_stats_finish`: stats = {norm (partials added in f64, in order), finite (1/0), clip
/// coefficient max_norm / (norm + 1e-6) capped at 1}. One warp: its first thread does the
/// work.
// stats: (3) f32; partials: (parts) f32
pub struct GradStatsFinish<P> {
    pub stats: P,
    pub partials: P,
    pub parts: u32,
    pub max_norm: f32,
}

impl<P> GradStatsFinish<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        Launch {
            name: "grad_stats_finish".into(),
            grid: 1,
            block: dev.warp,
            smem: 0,
            args: vec![
                Arg::Ptr(self.stats),
                Arg::Ptr(self.partials),
                Arg::I32(self.parts as i32),
                Arg::F32(self.max_norm),
            ],
        }
    }
}

/// `adamw_step_<T>` (T: the mirror's dtype): unless stats say not finite, the fused AdamW of
/// every element — gradient unscaled and clipped, decay by segment (sorted starts, one flag
/// each), both moments, the bias-corrected step — and the f16/bf16 mirror (compute copy)
/// written from the updated parameter.
// params, grads, m, v: (n) f32; mirror: (n) T or none; seg_start: (nseg) i64;
// seg_decay: (nseg) i32; stats: (3) f32 from grad_stats_finish
pub struct AdamwStep<P> {
    pub dtype: DType,
    pub params: P,
    pub grads: P,
    pub m: P,
    pub v: P,
    pub mirror: Option<P>,
    pub n: usize,
    pub seg_start: P,
    pub seg_decay: P,
    pub nseg: usize,
    pub stats: P,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// inv_scale and the step_size, inv_bc2_sqrt, decay_mul of this update
    /// (`AdamWConfig::step_scalars`), or the step block holding them.
    pub step: PerStep<(f32, StepScalars), P>,
}

impl<P> AdamwStep<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let ((inv_scale, st), block) = self.step.split();
        grid_stride(
            kernel_name("adamw_step", self.dtype),
            self.n,
            dev,
            vec![
                Arg::Ptr(self.params),
                Arg::Ptr(self.grads),
                Arg::Ptr(self.m),
                Arg::Ptr(self.v),
                opt(self.mirror),
                Arg::I64(self.n as i64),
                Arg::Ptr(self.seg_start),
                Arg::Ptr(self.seg_decay),
                Arg::I32(self.nseg as i32),
                Arg::Ptr(self.stats),
                Arg::F32(inv_scale),
                Arg::F32(self.beta1),
                Arg::F32(self.beta2),
                Arg::F32(self.eps),
                Arg::F32(st.step_size),
                Arg::F32(st.inv_bc2_sqrt),
                Arg::F32(st.decay_mul),
                block,
            ],
        )
    }
}
