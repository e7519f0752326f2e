//! Optimizers over the engine's flat buffers: a multi-tensor fused AdamW (one pass over all
//! parameters, with unscaling, the overflow check, clipping and the compute-dtype copy folded
//! in) and the dynamic loss scaler of mixed-precision training.

pub mod adamw;
pub mod scaler;

pub use adamw::{AdamW, AdamWConfig, GradStats, ParamMirror, Segment};
pub use scaler::LossScaler;
