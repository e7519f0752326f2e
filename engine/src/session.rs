//! A training session: the training graph, the flat fp32 parameter and gradient buffers, and
//! the fused optimizer — what the `ort` config drives step by step.
//!
//! The executor is the planned executor (memory plan, fast multithreaded CPU kernels, see
//! `exec::planned`); `ORTBENCH_EXECUTOR=ref` selects the reference executor instead,
//! for debugging (both compute the same function: `tests/tests/engine_parity.rs`).

use crate::exec::planned::PlannedExecutor;
use crate::exec::{ExecError, Inputs, RefExecutor};
use crate::graph::Graph;
use crate::optim::{AdamW, AdamWConfig, LossScaler, ParamMirror, Segment};
use crate::plan::{Plan, PlanError};
use crate::DType;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}")]
    Exec(#[from] ExecError),
    #[error("the parameter buffer has {got} elements but the graph needs {expected}")]
    ParamLen { expected: usize, got: usize },
    #[error("precision {0} needs the planned executor (the reference executor computes in f32 and ignores storage dtypes); unset ORTBENCH_EXECUTOR or use fp32")]
    Precision(DType),
    #[error("the session trains in {session} but the graph stores {graph}: build the graph with the same dtype")]
    GraphDtype { session: DType, graph: DType },
    #[error("the graph has no loss: build it with autodiff::backward")]
    NotTraining,
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error("ORTBENCH_EXECUTOR={0:?} is not an executor: use planned (the default) or ref")]
    Executor(String),
}

/// Which executor runs the steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecutorKind {
    /// The reference executor: plain loops, every value kept (the definition of correct).
    Reference,
    /// The planned executor: memory plan, fast kernels (the default).
    Planned,
}

impl ExecutorKind {
    /// From `ORTBENCH_EXECUTOR` (`ref` | `planned`, unset = planned).
    pub fn from_env() -> Result<Self, SessionError> {
        match std::env::var("ORTBENCH_EXECUTOR")
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
            .as_str()
        {
            "" | "planned" | "plan" => Ok(ExecutorKind::Planned),
            "ref" | "reference" => Ok(ExecutorKind::Reference),
            other => Err(SessionError::Executor(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ExecutorKind::Reference => "reference",
            ExecutorKind::Planned => "planned",
        }
    }
}

enum Executor {
    Reference,
    Planned(Box<PlannedExecutor>),
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
    precision: DType,
    /// fp32 master parameters, flat, in the graph's parameter order.
    pub params: Vec<f32>,
    /// Mixed precision: the compute-dtype copy the forward reads (values rounded to f16/bf16,
    /// written by the optimizer pass itself); empty in fp32, where `params` is read directly.
    pub compute: Vec<f32>,
    /// Gradients of the last step, flat, aligned with `params`.
    pub grads: Vec<f32>,
    pub opt: AdamW,
    scaler: Option<LossScaler>,
    exec: Executor,
}

impl TrainSession {
    /// `params` in the graph's flat layout; `segments` say which ranges get weight decay. The
    /// executor comes from `ORTBENCH_EXECUTOR` ([`ExecutorKind::from_env`]).
    pub fn new(
        graph: Graph,
        params: Vec<f32>,
        segments: Vec<Segment>,
        cfg: AdamWConfig,
        precision: DType,
    ) -> Result<Self, SessionError> {
        Self::with_executor(graph, params, segments, cfg, precision, ExecutorKind::from_env()?)
    }

    /// As [`TrainSession::new`] with an explicit executor.
    pub fn with_executor(
        graph: Graph,
        params: Vec<f32>,
        segments: Vec<Segment>,
        cfg: AdamWConfig,
        precision: DType,
        kind: ExecutorKind,
    ) -> Result<Self, SessionError> {
        if !graph.is_training() || graph.loss().is_none() {
            return Err(SessionError::NotTraining);
        }
        let n = graph.num_param_elems();
        if params.len() != n {
            return Err(SessionError::ParamLen { expected: n, got: params.len() });
        }
        if precision != DType::F32 && kind == ExecutorKind::Reference {
            return Err(SessionError::Precision(precision));
        }
        if graph.dtype() != precision {
            return Err(SessionError::GraphDtype { session: precision, graph: graph.dtype() });
        }
        let exec = match kind {
            ExecutorKind::Reference => Executor::Reference,
            ExecutorKind::Planned => Executor::Planned(Box::new(PlannedExecutor::new(&graph)?)),
        };
        let mut s = TrainSession {
            graph,
            precision,
            grads: vec![0.0; n],
            compute: Vec::new(),
            params,
            opt: AdamW::new(cfg, segments, n),
            scaler: None,
            exec,
        };
        s.refresh_compute();
        Ok(s)
    }

    /// The compute dtype (fp32, or fp16/bf16 with fp32 master weights).
    pub fn precision(&self) -> DType {
        self.precision
    }

    /// Rewrites the compute-dtype copy from the master parameters (after they were replaced
    /// wholesale, e.g. by ZeRO-1's all-gather); the optimizer pass keeps it current otherwise.
    pub fn refresh_compute(&mut self) {
        if self.precision == DType::F32 {
            return;
        }
        self.compute.clear();
        self.compute.extend_from_slice(&self.params);
        self.precision.round_slice(&mut self.compute);
    }

    /// The mirror argument of the optimizer pass for this precision.
    pub fn mirror(compute: &mut [f32], precision: DType) -> ParamMirror<'_> {
        match precision {
            DType::F32 => ParamMirror::None,
            d => ParamMirror::Rounded(d, compute),
        }
    }

    /// Dynamic loss scaling for [`TrainSession::step`].
    pub fn set_loss_scaler(&mut self, scaler: Option<LossScaler>) {
        self.scaler = scaler;
    }

    /// Which executor runs the steps.
    /// The hardware FLOPs of the last step's GEMMs and attention products
    /// ([`PlannedExecutor::last_step_flops`]); None on the reference executor.
    pub fn last_step_flops(&self) -> Option<f64> {
        match &self.exec {
            Executor::Reference => None,
            Executor::Planned(p) => Some(p.last_step_flops()),
        }
    }

    pub fn executor(&self) -> ExecutorKind {
        match self.exec {
            Executor::Reference => ExecutorKind::Reference,
            Executor::Planned(_) => ExecutorKind::Planned,
        }
    }

    /// The memory plan, when the planned executor runs.
    pub fn plan(&self) -> Option<&Plan> {
        match &self.exec {
            Executor::Planned(p) => Some(p.plan()),
            Executor::Reference => None,
        }
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Forward + backward only: fills `grads`, returns the loss (no update).
    pub fn forward_backward(
        &mut self,
        inputs: &Inputs<'_>,
        seed: u64,
    ) -> Result<f32, SessionError> {
        self.forward_backward_scaled(inputs, seed, 1.0)
    }

    /// Forward + backward of `loss_scale · loss`: `grads` come out multiplied by the scale
    /// (the returned loss is not). The planned executor seeds the backward with the scale, so
    /// in f16 every intermediate gradient is scaled and can overflow as on a GPU; the
    /// reference executor (f32 only) multiplies afterwards, which is exact for the powers of
    /// two a loss scaler uses.
    pub fn forward_backward_scaled(
        &mut self,
        inputs: &Inputs<'_>,
        seed: u64,
        loss_scale: f32,
    ) -> Result<f32, SessionError> {
        let params = if self.compute.is_empty() { &self.params } else { &self.compute };
        match &mut self.exec {
            Executor::Reference => {
                let loss = RefExecutor::new(&self.graph).train_step(
                    params,
                    inputs,
                    seed,
                    &mut self.grads,
                )?;
                if loss_scale != 1.0 {
                    self.grads.iter_mut().for_each(|g| *g *= loss_scale);
                }
                Ok(loss)
            }
            Executor::Planned(p) => {
                p.set_loss_scale(loss_scale)?;
                Ok(p.train_step(params, inputs, seed, &mut self.grads)?)
            }
        }
    }

    /// One training step at learning rate `lr`; `seed` drives this step's dropout masks.
    pub fn step(
        &mut self,
        inputs: &Inputs<'_>,
        lr: f32,
        seed: u64,
    ) -> Result<StepStats, SessionError> {
        let scale = self.scaler.as_ref().map_or(1.0, LossScaler::scale);
        let loss = self.forward_backward_scaled(inputs, seed, scale)?;
        let mirror = Self::mirror(&mut self.compute, self.precision);
        let stats = self.opt.step(&mut self.params, &self.grads, 1.0 / scale, lr, mirror);
        let skipped = match self.scaler.as_mut() {
            Some(s) => s.update(!stats.finite),
            None => !stats.finite,
        };
        Ok(StepStats { loss, grad_norm: stats.norm, loss_scale: scale, skipped })
    }
}
