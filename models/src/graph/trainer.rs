//! The engine side of a run: builds the training graph for a config, lays the weights into the
//! flat buffer and steps the engine with HF Trainer's conventions (the same AdamW
//! hyper-parameters, decay groups, clipping and LR schedule as `torch::TorchTrainer`), on one
//! rank or as one of N data-parallel ranks (DDP or ZeRO-1).
//!
//! Ranks split each global batch into contiguous blocks of rows: rank r of N takes rows
//! r·b .. (r+1)·b of a global batch of N·b rows.

use ortbench_engine::collective::{AnyGroup, DeviceCollective, LocalGroup};
use ortbench_engine::exec::gpu::session::RankLayout;
use ortbench_engine::optim::{AdamWConfig, Segment};
use ortbench_engine::parallel::{DataParallel, Strategy};
use ortbench_engine::plan::split::MemorySplit;
use ortbench_engine::session::{StepStats, TrainSession};
use ortbench_engine::DType;

use super::{build_training_graph, EngineModel, GraphOptions};
use crate::config::ModelConfig;
use crate::data::{Batch, Task};
use crate::params::param_specs;
use crate::schedule::LrSchedule;
use crate::weights::Weights;
use crate::ModelError;

/// Optimizer settings shared with the baseline (HF Trainer's defaults).
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub lr: f64,
    pub weight_decay: f64,
    pub max_grad_norm: f64,
    pub schedule: LrSchedule,
    pub precision: DType,
    /// Seed of the dropout masks (step k uses seed + k, on every rank the same).
    pub seed: u64,
}

pub struct EngineTrainer {
    model: EngineModel,
    dp: DataParallel<AnyGroup>,
    task: Task,
    opts: EngineOptions,
    steps_taken: usize,
}

/// A one-rank engine trainer's resumable state (see [`EngineTrainer::state`]).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineState {
    pub params: Vec<f32>,
    pub exp_avg: Vec<f32>,
    pub exp_avg_sq: Vec<f32>,
    pub adam_step: u64,
    pub steps_taken: usize,
    /// (scale, clean steps) of fp16's dynamic loss scaling.
    pub loss_scaler: Option<(f32, u32)>,
}

/// Rank `rank`'s block of `b` rows of the global batch and its weight: its share of the global
/// batch's labelled tokens (HF Trainer's `average_tokens_across_devices`), so that the ranks'
/// weighted gradients sum to the global batch's.
fn rank_slice(
    task: &Task,
    global: &Batch,
    rank: usize,
    world: usize,
    b: usize,
) -> Result<(Batch, f32), ModelError> {
    if global.batch_size != b * world {
        return Err(ModelError::Data(format!(
            "a global batch of {} rows does not split into {world} ranks of {b}",
            global.batch_size
        )));
    }
    let local = if world == 1 { global.clone() } else { global.rows(rank * b..(rank + 1) * b) };
    let total = task.label_count(global);
    let weight = if total == 0 {
        1.0 / world as f32
    } else {
        task.label_count(&local) as f32 / total as f32
    };
    Ok((local, weight))
}

/// Runs of consecutive parameters with the same decay setting, tiling the flat buffer in
/// order as the optimizer wants: the zero pad before a parameter belongs to the run before it
/// (decaying a zero leaves it zero).
pub fn decay_segments(cfg: &ModelConfig, model: &EngineModel) -> Vec<Segment> {
    let mut segs: Vec<Segment> = Vec::new();
    for (spec, slot) in param_specs(cfg).iter().zip(&model.params) {
        debug_assert_eq!(spec.name, slot.name);
        if let Some(s) = segs.last_mut() {
            s.len = slot.offset - s.start;
            if s.decay == spec.decay {
                s.len += slot.len;
                continue;
            }
        }
        segs.push(Segment { start: slot.offset, len: slot.len, decay: spec.decay });
    }
    segs
}

impl EngineTrainer {
    /// A single-rank trainer over batches of `batch_size` × `seq_len`.
    pub fn new(
        cfg: &ModelConfig,
        weights: &Weights,
        batch_size: usize,
        seq_len: usize,
        opts: EngineOptions,
    ) -> Result<Self, ModelError> {
        let group = LocalGroup::new(1).pop().expect("one rank");
        Self::with_group(cfg, weights, batch_size, seq_len, opts, group, Strategy::Ddp)
    }

    /// One rank of a data-parallel group; `batch_size` is per rank.
    pub fn with_group(
        cfg: &ModelConfig,
        weights: &Weights,
        batch_size: usize,
        seq_len: usize,
        opts: EngineOptions,
        group: impl Into<AnyGroup>,
        strategy: Strategy,
    ) -> Result<Self, ModelError> {
        Self::with_graph_options(
            cfg,
            weights,
            &GraphOptions::new(batch_size, seq_len),
            opts,
            group,
            strategy,
        )
    }

    /// [`EngineTrainer::with_group`] for a graph built with `graph` (sizes per rank, and the
    /// engine passes: the harness passes `ORTBENCH_PASSES` here).
    pub fn with_graph_options(
        cfg: &ModelConfig,
        weights: &Weights,
        graph: &GraphOptions,
        opts: EngineOptions,
        group: impl Into<AnyGroup>,
        strategy: Strategy,
    ) -> Result<Self, ModelError> {
        // fp16/bf16: the graph stores activations in that dtype; master weights stay f32.
        let model = build_training_graph(cfg, &graph.with_dtype(opts.precision))?;
        let params = model.flatten(weights)?;
        let segments = decay_segments(cfg, &model);
        let adamw = AdamWConfig {
            lr: opts.lr as f32,
            weight_decay: opts.weight_decay as f32,
            max_grad_norm: opts.max_grad_norm as f32,
            ..AdamWConfig::default()
        };
        let session =
            TrainSession::new(model.graph.clone(), params, segments, adamw, opts.precision)
                .map_err(|e| ModelError::Training(format!("engine: {e}")))?;
        let mut dp = DataParallel::new(session, group.into(), strategy);
        // fp16 needs dynamic loss scaling (GradScaler's defaults, as the baseline's fp16 path);
        // bf16 has fp32's exponent range and trains unscaled, as torch.autocast(bfloat16) does.
        if opts.precision == DType::F16 {
            dp.set_loss_scaler(Some(ortbench_engine::optim::LossScaler::default()));
        }
        Ok(EngineTrainer { model, dp, task: Task::for_config(cfg), opts, steps_taken: 0 })
    }

    /// One step on the global batch `global` (this rank takes its block of rows): forward,
    /// backward, gradient reduction, fused AdamW.
    pub fn step(&mut self, global: &Batch) -> Result<StepStats, ModelError> {
        let (rank, world) = (self.dp.group_rank(), self.dp.group_world());
        let b = self.model.batch_size;
        let (local, weight) = rank_slice(&self.task, global, rank, world, b)?;
        let feed = self.model.feed(&local)?;
        let lr = (self.opts.lr * self.opts.schedule.factor(self.steps_taken)) as f32;
        let seed = self.opts.seed.wrapping_add(self.steps_taken as u64);
        let stats = self
            .dp
            .step(&feed.inputs(), weight, lr, seed)
            .map_err(|e| ModelError::Training(format!("engine step {}: {e}", self.steps_taken)))?;
        self.steps_taken += 1;
        Ok(stats)
    }

    /// The current parameters under their HF names.
    pub fn weights(&self) -> Result<Weights, ModelError> {
        self.model.unflatten(&self.dp.session.params)
    }

    /// Everything a resumed run needs to continue this one bit for bit (one rank): fp32
    /// parameters, Adam moments and step, the trainer's step (LR schedule, dropout seeds), the
    /// loss scaler.
    pub fn state(&self) -> Result<EngineState, ModelError> {
        if self.dp.group_world() != 1 {
            return Err(ModelError::Training(
                "checkpoints are written by one-rank trainers only".into(),
            ));
        }
        let s = &self.dp.session;
        Ok(EngineState {
            params: s.params.clone(),
            exp_avg: s.opt.m.clone(),
            exp_avg_sq: s.opt.v.clone(),
            adam_step: s.opt.step,
            steps_taken: self.steps_taken,
            loss_scaler: self.dp.loss_scaler().map(|l| (l.scale(), l.clean_steps())),
        })
    }

    /// Continues from `state` (of a trainer of the same model and options).
    pub fn restore(&mut self, state: EngineState) -> Result<(), ModelError> {
        let n = self.model.flat_len();
        if self.dp.group_world() != 1
            || [state.params.len(), state.exp_avg.len(), state.exp_avg_sq.len()] != [n, n, n]
        {
            return Err(ModelError::Training(format!(
                "the checkpoint's flat buffers hold {} values, this model's {n} (one rank)",
                state.params.len()
            )));
        }
        let s = &mut self.dp.session;
        s.params = state.params;
        s.refresh_compute();
        s.opt.m = state.exp_avg;
        s.opt.v = state.exp_avg_sq;
        s.opt.step = state.adam_step;
        self.steps_taken = state.steps_taken;
        if let Some((scale, clean)) = state.loss_scaler {
            self.dp
                .set_loss_scaler(Some(ortbench_engine::optim::LossScaler::resumed(scale, clean)));
        }
        Ok(())
    }

    /// Steps taken (the next step's index).
    pub fn steps_taken(&self) -> usize {
        self.steps_taken
    }

    /// FLOPs this rank's GEMMs and attention products executed in the last step (rows a loss
    /// ignores skipped); None on the reference executor.
    pub fn last_step_flops(&self) -> Option<f64> {
        self.dp.session.last_step_flops()
    }

    /// Bytes of optimizer state this rank holds.
    pub fn optimizer_bytes(&self) -> usize {
        self.dp.optimizer_bytes()
    }

    /// This rank's memory by what holds it: its flat buffers and its plan's arena split
    /// ([`MemorySplit`]); None on the reference executor, which has no plan.
    pub fn memory_split(&self) -> Option<MemorySplit> {
        let s = &self.dp.session;
        // The fp32 master parameters and, in fp16/bf16, the rounded copy the graph reads (f32
        // slots on the CPU).
        let params = 4 * (s.params.len() + s.compute.len());
        Some(MemorySplit::new(
            s.plan()?,
            s.graph(),
            params,
            4 * s.grads.len(),
            self.optimizer_bytes(),
        ))
    }

    /// Dynamic loss scaling (what fp16 training uses).
    pub fn set_loss_scaler(&mut self, scaler: Option<ortbench_engine::optim::LossScaler>) {
        self.dp.set_loss_scaler(scaler);
    }

    /// Fault injection: this rank's gradient at flat index `index` becomes +inf next step.
    pub fn inject_overflow(&mut self, index: usize) {
        self.dp.inject_overflow(index);
    }

    /// Fault injection: every later gradient is multiplied by `factor` (a broken engine).
    pub fn inject_grad_scale(&mut self, factor: f32) {
        self.dp.inject_grad_scale(factor);
    }

    /// The shard this rank owns under ZeRO-1.
    pub fn shard_range(&self) -> Option<std::ops::Range<usize>> {
        self.dp.sharding().map(|s| s.range(self.dp.group_rank()))
    }

    /// Parameters (Ψ) of the model, the pads of the flat buffers excluded.
    pub fn num_params(&self) -> usize {
        self.model.num_params()
    }

    /// Length of the flat parameter, gradient and moment buffers (Ψ and the alignment pads).
    pub fn flat_len(&self) -> usize {
        self.model.flat_len()
    }
}

/// The engine on a GPU, one rank: the training graph on the GPU executor with its fused AdamW
/// (`ortbench_engine::exec::gpu`), HF Trainer's conventions as [`EngineTrainer`]. Several ranks
/// (DDP, ZeRO-1) on GPUs need NCCL ranks, which are not built yet.
pub struct GpuEngineTrainer<D: ortbench_engine::backend::gpu::GpuDevice> {
    model: EngineModel,
    session: ortbench_engine::exec::gpu::session::GpuSession<D>,
    task: Task,
    opts: EngineOptions,
    steps_taken: usize,
}

impl<D: ortbench_engine::backend::gpu::GpuDevice> GpuEngineTrainer<D> {
    /// Builds the graph for `graph`'s sizes and uploads the weights to `dev`.
    pub fn new(
        cfg: &ModelConfig,
        weights: &Weights,
        graph: &GraphOptions,
        opts: EngineOptions,
        dev: D,
    ) -> Result<Self, ModelError> {
        Self::ranked(cfg, weights, graph, opts, dev, RankLayout::single())
    }

    /// As [`GpuEngineTrainer::new`], for rank `layout.rank` of a data-parallel run on one GPU
    /// per rank (`graph`'s batch size is the rank's share); step it with
    /// [`GpuEngineTrainer::step_ranked`].
    pub fn ranked(
        cfg: &ModelConfig,
        weights: &Weights,
        graph: &GraphOptions,
        opts: EngineOptions,
        dev: D,
        layout: RankLayout,
    ) -> Result<Self, ModelError> {
        let model = build_training_graph(cfg, &graph.with_dtype(opts.precision))?;
        let params = model.flatten(weights)?;
        let segments = decay_segments(cfg, &model);
        let adamw = AdamWConfig {
            lr: opts.lr as f32,
            weight_decay: opts.weight_decay as f32,
            max_grad_norm: opts.max_grad_norm as f32,
            ..AdamWConfig::default()
        };
        let mut session = ortbench_engine::exec::gpu::session::GpuSession::ranked(
            model.graph.clone(),
            dev,
            &params,
            segments,
            adamw,
            opts.precision,
            layout,
        )
        .map_err(|e| ModelError::Training(format!("engine on the GPU: {e}")))?;
        if opts.precision == DType::F16 {
            session.set_loss_scaler(Some(ortbench_engine::optim::LossScaler::default()));
        }
        Ok(GpuEngineTrainer { model, session, task: Task::for_config(cfg), opts, steps_taken: 0 })
    }

    /// One step on `batch`: forward, backward and AdamW queued on the device, one status read.
    pub fn step(&mut self, batch: &Batch) -> Result<StepStats, ModelError> {
        let feed = self.model.feed(batch)?;
        let (lr, seed) = self.step_lr_seed();
        let stats = self.session.step(&feed.inputs(), lr, seed).map_err(|e| {
            ModelError::Training(format!("engine step {} on the GPU: {e}", self.steps_taken))
        })?;
        self.steps_taken += 1;
        Ok(stats)
    }

    /// One step of this rank on the global batch `global` (it takes its block of rows), the
    /// gradients reduced through `group` on the device (DDP or ZeRO-1, the layout's).
    pub fn step_ranked<C: DeviceCollective<D>>(
        &mut self,
        group: &C,
        global: &Batch,
    ) -> Result<StepStats, ModelError> {
        let l = self.session.layout();
        let (local, weight) =
            rank_slice(&self.task, global, l.rank, l.world, self.model.batch_size)?;
        let feed = self.model.feed(&local)?;
        let (lr, seed) = self.step_lr_seed();
        let stats =
            self.session.step_ranked(group, weight, &feed.inputs(), lr, seed).map_err(|e| {
                ModelError::Training(format!("engine step {} on the GPU: {e}", self.steps_taken))
            })?;
        self.steps_taken += 1;
        Ok(stats)
    }

    fn step_lr_seed(&self) -> (f32, u64) {
        (
            (self.opts.lr * self.opts.schedule.factor(self.steps_taken)) as f32,
            self.opts.seed.wrapping_add(self.steps_taken as u64),
        )
    }

    /// The current parameters under their HF names (copied from the device).
    pub fn weights(&self) -> Result<Weights, ModelError> {
        let p = self.session.params().map_err(|e| ModelError::Training(e.to_string()))?;
        self.model.unflatten(&p)
    }

    /// What a resumed run needs to continue this one bit for bit ([`EngineTrainer::state`]'s
    /// fields, copied from the device): one rank.
    pub fn state(&self) -> Result<EngineState, ModelError> {
        let train = |e: ortbench_engine::session::SessionError| ModelError::Training(e.to_string());
        if self.session.layout().world != 1 {
            return Err(ModelError::Training(
                "checkpoints are written by one-rank trainers only".into(),
            ));
        }
        let (exp_avg, exp_avg_sq) = self.session.moments().map_err(train)?;
        Ok(EngineState {
            params: self.session.params().map_err(train)?,
            exp_avg,
            exp_avg_sq,
            adam_step: self.session.step,
            steps_taken: self.steps_taken,
            loss_scaler: self.session.loss_scaler().map(|l| (l.scale(), l.clean_steps())),
        })
    }

    /// Continues from `state` (of a trainer of the same model and options, on any device).
    pub fn restore(&mut self, state: EngineState) -> Result<(), ModelError> {
        let n = self.model.flat_len();
        if self.session.layout().world != 1
            || [state.params.len(), state.exp_avg.len(), state.exp_avg_sq.len()] != [n, n, n]
        {
            return Err(ModelError::Training(format!(
                "the checkpoint's flat buffers hold {} values, this model's {n} (one rank)",
                state.params.len()
            )));
        }
        let moments = (&state.exp_avg[..], &state.exp_avg_sq[..]);
        self.session
            .restore(&state.params, moments, state.adam_step)
            .map_err(|e| ModelError::Training(e.to_string()))?;
        self.steps_taken = state.steps_taken;
        if let Some((scale, clean)) = state.loss_scaler {
            let s = ortbench_engine::optim::LossScaler::resumed(scale, clean);
            self.session.set_loss_scaler(Some(s));
        }
        Ok(())
    }

    /// How the steps reach the device, as results.csv's `step_launches` says it: "captured"
    /// (the step captured once as a CUDA graph, replayed) or `"direct: <why>"`.
    pub fn step_launches(&self) -> String {
        use ortbench_engine::exec::gpu::session::Launching;
        match self.session.launching() {
            Launching::Captured => "captured".into(),
            Launching::Direct(why) => format!("direct: {why}"),
        }
    }

    /// FLOPs of one step's GEMMs and attention products on the device.
    pub fn step_flops(&self) -> f64 {
        self.session.executor().step_flops()
    }

    /// Bytes of optimizer state on the device (fp32 moments of the elements this rank
    /// updates).
    pub fn optimizer_bytes(&self) -> usize {
        self.session.state_bytes()
    }

    /// This rank's device memory by what holds it: the flat buffers the executor allocates and
    /// its plan's arena split ([`MemorySplit`]).
    pub fn memory_split(&self) -> MemorySplit {
        let (g, l) = (self.session.graph(), self.session.layout());
        // The flat buffers' length: Ψ, padded under ZeRO-1 to a multiple of the ranks as the
        // session pads them (`GpuSession::ranked`).
        let n = match l.strategy {
            Strategy::Zero1 if l.world > 1 => ortbench_engine::collective::Sharding::new(
                g.num_param_elems(),
                l.world,
                ortbench_engine::parallel::SHARD_ALIGN,
            )
            .padded(),
            _ => g.num_param_elems(),
        };
        // fp32 master parameters, and in fp16/bf16 their copy in the compute dtype.
        let compute = if g.dtype() == DType::F32 { 0 } else { n * g.dtype().size() };
        let plan = self.session.executor().plan();
        MemorySplit::new(plan, g, 4 * n + compute, 4 * n, self.optimizer_bytes())
    }
}
