//! ortbench-engine — the accelerated training engine behind the `ort` and `ort-zero1` configs.
//!
//! Pipeline (see `docs/ARCHITECTURE.md`): model builder → forward graph → forward passes
//! (eliminations, fusions) → autodiff → training passes (recompute) → memory plan → executor on
//! a backend, with a fused AdamW over flat parameter buffers.
//!
//! This crate depends on neither tch/libtorch nor polars/plotters: it is our own engine.

pub mod autodiff;
pub mod backend;
pub mod collective;
pub mod dtype;
pub mod exec;
pub mod graph;
pub mod ops;
pub mod optim;
pub mod parallel;
pub mod passes;
pub mod plan;
pub mod session;
pub mod step;
pub mod torch_wheel;

pub use dtype::DType;
pub use exec::{Inputs, RefExecutor};
pub use graph::{Graph, GraphError, TensorId};
