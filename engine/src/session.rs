//! A training session: the training graph, the flat fp32 parameter and gradient buffers, and
//! the fused optimizer — what the `ort` config drives step by step.
//!
//! The executor is the planned executor (memory plan, fast multithreaded CPU kernels, see
//! `exec::planned`); `ORTBENCH_EXECUTOR=ref` selects the reference executor instead,
//! for debugging (both compute the same function: `tests/tests/engine_parity.rs`).

use std::ops::Range;

use crate::collective::{Collective, ReduceOp};
use crate::exec::planned::PlannedExecutor;
use crate::exec::{ExecError, Inputs, RefExecutor};
use crate::graph::Graph;
use crate::optim::adamw::sum_squares;
use crate::optim::{AdamW, AdamWConfig, LossScaler, ParamMirror, Segment};
use crate::plan::{Plan, PlanError};
use crate::step::{train_step, Alone, Finished, Reduction, StepError, StepExecutor, StepValues};
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

    /// One training step at learning rate `lr`; `seed` drives this step's dropout masks
    /// ([`crate::step::train_step`] on this session alone).
    pub fn step(
        &mut self,
        inputs: &Inputs<'_>,
        lr: f32,
        seed: u64,
    ) -> Result<StepStats, SessionError> {
        // The scaler is lent to the step while the session is its executor.
        let mut scaler = self.scaler.take();
        let mut exec = CpuStep::new(self, None, GradFaults::default());
        let out = train_step(&mut exec, &Alone, 1.0, scaler.as_mut(), inputs, lr, seed);
        self.scaler = scaler;
        out.map_err(|e| e.into_session(0, 1))
    }
}

/// Faults planted in a step's local gradients, after the backward and before the weighting
/// (`crate::parallel::DataParallel`'s fault injection, for tests and `ORTBENCH_FAULT`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GradFaults {
    /// Every gradient multiplied by this (a broken engine).
    pub scale: Option<f32>,
    /// The gradient at this flat index becomes +inf (an fp16 overflow).
    pub overflow_at: Option<usize>,
}

/// ZeRO-1's part of a CPU step: the rank's optimizer over its chunk of the flat buffers.
pub(crate) struct Shard<'a> {
    /// AdamW over `own` only.
    pub opt: &'a mut AdamW,
    /// The rank's stored elements of the flat buffers (its chunk clipped to Ψ).
    pub own: Range<usize>,
    /// Elements per chunk of the padded layout.
    pub chunk: usize,
}

/// The CPU side of the step contract ([`StepExecutor`]): a session's flat buffers, in place,
/// and the optimizer of the elements this rank updates; the phases' results are host values.
pub(crate) struct CpuStep<'a> {
    s: &'a mut TrainSession,
    /// ZeRO-1 over several ranks; None: the session's own optimizer updates everything.
    shard: Option<Shard<'a>>,
    faults: GradFaults,
    /// The step's values, from the backward on.
    values: StepValues,
    loss: f32,
    sumsq: f64,
    finite: bool,
    norm: f32,
}

impl<'a> CpuStep<'a> {
    /// A step of `s`, updating `shard` under ZeRO-1 or everything with the session's optimizer.
    pub fn new(s: &'a mut TrainSession, shard: Option<Shard<'a>>, faults: GradFaults) -> Self {
        let values = StepValues { seed: 0, loss_scale: 1.0, weight: 1.0, lr: 0.0 };
        CpuStep { s, shard, faults, values, loss: f32::NAN, sumsq: 0.0, finite: true, norm: 0.0 }
    }

    /// The elements this rank updates and its optimizer's thread count.
    fn own(&self) -> (Range<usize>, usize) {
        match &self.shard {
            Some(z) => (z.own.clone(), z.opt.threads),
            None => (0..self.s.grads.len(), self.s.opt.threads),
        }
    }
}

impl<G: Collective> StepExecutor<G> for CpuStep<'_> {
    fn zero1_chunk(&self) -> Option<usize> {
        self.shard.as_ref().map(|z| z.chunk)
    }

    fn backward(&mut self, inputs: &Inputs<'_>, v: &StepValues) -> Result<(), StepError> {
        self.values = *v;
        let weight = v.weight;
        // The backward of scale · loss: in f16 storage its gradients overflow (→ inf) exactly
        // where a GPU's would, which the statistics catch. The weight multiplies afterwards
        // (the GPU seeds its backward with it instead).
        self.loss = self.s.forward_backward_scaled(inputs, v.seed, v.loss_scale)?;
        let grads = &mut self.s.grads;
        if let Some(f) = self.faults.scale {
            grads.iter_mut().for_each(|g| *g *= f);
        }
        if let Some(i) = self.faults.overflow_at {
            grads[i] = f32::INFINITY;
        }
        if weight == 0.0 {
            grads.fill(0.0);
        } else if weight != 1.0 {
            grads.iter_mut().for_each(|g| *g *= weight);
        }
        Ok(())
    }

    fn reduce_grads(&mut self, group: &G, how: Reduction) -> Result<(), StepError> {
        match how {
            Reduction::AllReduce => group.all_reduce(&mut self.s.grads, ReduceOp::Sum)?,
            // Chunk r (= own on rank r) becomes Σ_ranks; the other chunks keep this rank's
            // local gradients, which nothing reads.
            Reduction::ReduceScatter { chunk } => {
                group.reduce_scatter_in_place(&mut self.s.grads, chunk, ReduceOp::Sum)?
            }
        }
        Ok(())
    }

    fn grad_sumsq(&mut self) -> Result<(), StepError> {
        let (own, threads) = self.own();
        let inv_scale = self.values.inv_scale();
        (self.sumsq, self.finite) = sum_squares(&self.s.grads[own], inv_scale, threads);
        Ok(())
    }

    fn reduce_grad_sumsq(&mut self, group: &G) -> Result<(), StepError> {
        let mut red = [self.sumsq, if self.finite { 0.0 } else { 1.0 }];
        group.all_reduce(&mut red[..1], ReduceOp::Sum)?;
        group.all_reduce(&mut red[1..], ReduceOp::Max)?;
        (self.sumsq, self.finite) = (red[0], red[1] == 0.0);
        Ok(())
    }

    fn grad_stats(&mut self) -> Result<(), StepError> {
        self.norm = self.sumsq.sqrt() as f32;
        self.finite &= self.norm.is_finite();
        Ok(())
    }

    fn adamw_update(&mut self) -> Result<(), StepError> {
        if !self.finite {
            return Ok(());
        }
        let (lr, inv_scale) = (self.values.lr, self.values.inv_scale());
        let s = &mut *self.s;
        match &mut self.shard {
            // Every element, and the compute-dtype copy with it.
            None => {
                let g_scale = inv_scale * s.opt.clip_coef(self.norm);
                let mirror = TrainSession::mirror(&mut s.compute, s.precision);
                s.opt.update(&mut s.params, &s.grads, g_scale, lr, mirror);
            }
            // The own chunk; the compute copy follows the gather.
            Some(z) => {
                let g_scale = inv_scale * z.opt.clip_coef(self.norm);
                let (p, g) = (&mut s.params[z.own.clone()], &s.grads[z.own.clone()]);
                z.opt.update(p, g, g_scale, lr, ParamMirror::None);
            }
        }
        Ok(())
    }

    fn gather_params(&mut self, group: &G, chunk: usize) -> Result<(), StepError> {
        if !self.finite {
            return Ok(());
        }
        group.all_gather_in_place(&mut self.s.params, chunk)?;
        // The compute-dtype copy the next forward reads (a real fp16 ZeRO-1 would all-gather
        // it in f16; the values are the same).
        self.s.refresh_compute();
        Ok(())
    }

    fn finish(&mut self, _: &Inputs<'_>) -> Result<Finished, StepError> {
        Ok(Finished { loss: self.loss, grad_norm: self.norm, finite: self.finite })
    }
}
