//! A training session: the training graph, the flat fp32 parameter and gradient buffers, and
//! the fused optimizer — what the `ort` config drives step by step.
//!
//! The executor is the reference executor for now; the planned executor (memory plan, fused
//! kernels) replaces it behind the same `step`.

use crate::exec::{ExecError, Inputs, RefExecutor};
use crate::graph::Graph;
use crate::optim::{AdamW, AdamWConfig, LossScaler, ParamMirror, Segment};
use crate::DType;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}")]
    Exec(#[from] ExecError),
    #[error("the parameter buffer has {got} elements but the graph needs {expected}")]
    ParamLen { expected: usize, got: usize },
    #[error("precision {0} is not supported by the engine's CPU executor yet; use fp32")]
    Precision(DType),
    #[error("the graph has no loss: build it with autodiff::backward")]
    NotTraining,
}

/// What one step measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// This step's forward loss, before its update.
    pub loss: f32,
    /// Global L2 norm of the unscaled gradients before clipping.
    pub grad_norm: f32,
    pub loss_scale: f32,
    pub skipped: bool,
}

pub struct TrainSession {
    graph: Graph,
    /// fp32 master parameters, flat, in the graph's parameter order.
    pub params: Vec<f32>,
    /// Gradients of the last step, flat, aligned with `params`.
    pub grads: Vec<f32>,
    pub opt: AdamW,
    scaler: Option<LossScaler>,
}

impl TrainSession {
    /// `params` in the graph's flat layout; `segments` say which ranges get weight decay.
    pub fn new(graph: Graph, params: Vec<f32>, segments: Vec<Segment>, cfg: AdamWConfig, precision: DType) -> Result<Self, SessionError> {
        if !graph.is_training() || graph.loss().is_none() {
            return Err(SessionError::NotTraining);
        }
        let n = graph.num_param_elems();
        if params.len() != n {
            return Err(SessionError::ParamLen { expected: n, got: params.len() });
        }
        if precision != DType::F32 {
            return Err(SessionError::Precision(precision));
        }
        Ok(TrainSession { graph, grads: vec![0.0; n], params, opt: AdamW::new(cfg, segments, n), scaler: None })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Forward + backward only: fills `grads`, returns the loss (no update).
    pub fn forward_backward(&mut self, inputs: &Inputs<'_>, seed: u64) -> Result<f32, SessionError> {
        let exec = RefExecutor::new(&self.graph);
        Ok(exec.train_step(&self.params, inputs, seed, &mut self.grads)?)
    }

    /// One training step at learning rate `lr`; `seed` drives this step's dropout masks.
    pub fn step(&mut self, inputs: &Inputs<'_>, lr: f32, seed: u64) -> Result<StepStats, SessionError> {
        let loss = self.forward_backward(inputs, seed)?;
        let scale = self.scaler.as_ref().map_or(1.0, LossScaler::scale);
        let stats = self.opt.step(&mut self.params, &self.grads, 1.0 / scale, lr, ParamMirror::None);
        let skipped = match self.scaler.as_mut() {
            Some(s) => s.update(!stats.finite),
            None => !stats.finite,
        };
        Ok(StepStats { loss, grad_norm: stats.norm, loss_scale: scale, skipped })
    }
}
