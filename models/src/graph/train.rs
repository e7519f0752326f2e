//! The engine side of a run: builds the training graph for a config, lays the weights into the
//! flat buffer and steps the engine's `TrainSession` with HF Trainer's conventions (the same
//! AdamW hyper-parameters, decay groups, clipping and LR schedule as `torch::TorchTrainer`).

use ortbench_engine::optim::{AdamWConfig, Segment};
use ortbench_engine::session::{StepStats, TrainSession};
use ortbench_engine::DType;

use super::{build_training_graph, EngineModel, GraphOptions};
use crate::config::ModelConfig;
use crate::data::Batch;
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
    /// Seed of the dropout masks (step k uses seed + k).
    pub seed: u64,
}

pub struct EngineTrainer {
    model: EngineModel,
    session: TrainSession,
    opts: EngineOptions,
    steps_taken: usize,
}

/// Contiguous runs of parameters with the same decay setting, in flat-buffer order.
pub fn decay_segments(cfg: &ModelConfig, model: &EngineModel) -> Vec<Segment> {
    let mut segs: Vec<Segment> = Vec::new();
    for (spec, slot) in param_specs(cfg).iter().zip(&model.params) {
        debug_assert_eq!(spec.name, slot.name);
        match segs.last_mut() {
            Some(s) if s.decay == spec.decay && s.start + s.len == slot.offset => s.len += slot.len,
            _ => segs.push(Segment { start: slot.offset, len: slot.len, decay: spec.decay }),
        }
    }
    segs
}

impl EngineTrainer {
    pub fn new(cfg: &ModelConfig, weights: &Weights, batch_size: usize, seq_len: usize, opts: EngineOptions) -> Result<Self, ModelError> {
        let model = build_training_graph(cfg, &GraphOptions::new(batch_size, seq_len))?;
        let params = model.flatten(weights)?;
        let segments = decay_segments(cfg, &model);
        let adamw = AdamWConfig {
            lr: opts.lr as f32,
            weight_decay: opts.weight_decay as f32,
            max_grad_norm: opts.max_grad_norm as f32,
            ..AdamWConfig::default()
        };
        let session = TrainSession::new(model.graph.clone(), params, segments, adamw, opts.precision)
            .map_err(|e| ModelError::Training(format!("engine: {e}")))?;
        Ok(EngineTrainer { model, session, opts, steps_taken: 0 })
    }

    /// One step on `batch`: forward, backward, fused AdamW.
    pub fn step(&mut self, batch: &Batch) -> Result<StepStats, ModelError> {
        let feed = self.model.feed(batch)?;
        let lr = (self.opts.lr * self.opts.schedule.factor(self.steps_taken)) as f32;
        let seed = self.opts.seed.wrapping_add(self.steps_taken as u64);
        let stats = self
            .session
            .step(&feed.inputs(), lr, seed)
            .map_err(|e| ModelError::Training(format!("engine step {}: {e}", self.steps_taken)))?;
        self.steps_taken += 1;
        Ok(stats)
    }

    /// The current parameters under their HF names.
    pub fn weights(&self) -> Result<Weights, ModelError> {
        self.model.unflatten(&self.session.params)
    }

    /// Bytes of optimizer state (the two fp32 Adam moments).
    pub fn optimizer_bytes(&self) -> usize {
        self.session.opt.state_bytes()
    }
}
