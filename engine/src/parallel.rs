//! Data parallelism over a [`Collective`]: DDP (gradients averaged, every rank runs the full
//! optimizer) and ZeRO stage 1 (Rajbhandari et al. 2020, §5.1 P_os: gradients reduce-scattered,
//! each rank updates only its shard of the fp32 master weights and Adam moments, the updated
//! parameters all-gathered).
//!
//! Loss normalisation follows HF Trainer's `average_tokens_across_devices`: a rank's gradient
//! is weighted by its share of the global batch's labelled tokens, so N ranks compute exactly
//! the gradient of one rank on the whole global batch (an MLM batch has different label counts
//! per rank; plain averaging of per-rank means would not).

use crate::collective::{Collective, CollectiveError, ReduceOp, Sharding};
use crate::exec::Inputs;
use crate::optim::{AdamW, LossScaler, ParamMirror, Segment};
use crate::session::{SessionError, StepStats, TrainSession};

/// Shards are padded to a multiple of this many elements per rank (64-byte aligned f32).
pub const SHARD_ALIGN: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// All-reduce gradients; every rank keeps full optimizer state (PyTorch DDP).
    Ddp,
    /// ZeRO-1: optimizer state partitioned across ranks.
    Zero1,
}

#[derive(Debug, thiserror::Error)]
pub enum ParallelError {
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Collective(#[from] CollectiveError),
}

/// ZeRO-1 state of one rank.
struct Zero1State {
    sharding: Sharding,
    /// fp32 master weights of this rank's shard.
    master: Vec<f32>,
    /// Adam moments of this rank's shard.
    opt: AdamW,
    /// Scratch: the padded gradient to reduce-scatter, and the padded gathered parameters.
    send: Vec<f32>,
    gathered: Vec<f32>,
    grad_shard: Vec<f32>,
}

/// One rank of a data-parallel training run.
pub struct DataParallel<C: Collective> {
    pub session: TrainSession,
    pub group: C,
    strategy: Strategy,
    zero: Option<Zero1State>,
    scaler: Option<LossScaler>,
    /// Fault injection: poison this flat gradient index on the next step.
    fault: Option<usize>,
    /// Fault injection: every step's local gradient is multiplied by this (a broken engine).
    grad_fault: Option<f32>,
}

/// The segments of `full` restricted to `range` and rebased to 0; the padded tail (past the
/// real elements) becomes a no-decay segment so the result tiles the shard.
pub fn shard_segments(full: &[Segment], range: std::ops::Range<usize>) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut covered = range.start;
    for s in full {
        let lo = s.start.max(range.start);
        let hi = (s.start + s.len).min(range.end);
        if lo < hi {
            out.push(Segment { start: lo - range.start, len: hi - lo, decay: s.decay });
            covered = hi;
        }
    }
    if covered < range.end {
        out.push(Segment { start: covered - range.start, len: range.end - covered, decay: false });
    }
    out
}

impl<C: Collective> DataParallel<C> {
    /// Wraps this rank's session. All ranks must start from identical parameters.
    pub fn new(session: TrainSession, group: C, strategy: Strategy) -> Self {
        let zero = (strategy == Strategy::Zero1).then(|| {
            let total = session.params.len();
            let sharding = Sharding::new(total, group.world_size(), SHARD_ALIGN);
            let range = sharding.range(group.rank());
            let real = sharding.real_range(group.rank());
            let mut master = vec![0.0; sharding.shard];
            master[..real.len()].copy_from_slice(&session.params[real]);
            let segments = shard_segments(session.opt.segments(), range);
            let mut opt = AdamW::new(session.opt.cfg, segments, sharding.shard);
            opt.threads = session.opt.threads;
            Zero1State {
                sharding,
                master,
                opt,
                send: vec![0.0; sharding.padded()],
                gathered: vec![0.0; sharding.padded()],
                grad_shard: vec![0.0; sharding.shard],
            }
        });
        let mut dp = DataParallel { session, group, strategy, zero, scaler: None, fault: None, grad_fault: None };
        if dp.strategy == Strategy::Zero1 {
            // The full optimizer state of the session is not used: free it.
            dp.session.opt.m = Vec::new();
            dp.session.opt.v = Vec::new();
        }
        dp
    }

    /// Bytes of optimizer state this rank holds: ZeRO-1 — fp32 master shard + two moment
    /// shards (12Ψ/N up to padding); DDP — the two full moments (8Ψ) plus, in mixed
    /// precision, the full fp32 master copy (12Ψ; fp32 training keeps no separate master).
    pub fn optimizer_bytes(&self) -> usize {
        match &self.zero {
            Some(z) => z.master.len() * 4 + z.opt.state_bytes(),
            None if self.session.precision() != crate::DType::F32 => self.session.params.len() * 4 + self.session.opt.state_bytes(),
            None => self.session.opt.state_bytes(),
        }
    }

    /// Dynamic loss scaling (fp16 training). Every rank must use the same scaler settings;
    /// overflow decisions are all-reduced, so the scales stay identical.
    pub fn set_loss_scaler(&mut self, scaler: Option<LossScaler>) {
        self.scaler = scaler;
    }

    pub fn loss_scale(&self) -> f32 {
        self.scaler.as_ref().map_or(1.0, LossScaler::scale)
    }

    /// Fault injection (tests, `ORTBENCH_FAULT`): this rank's gradient at flat index `index`
    /// becomes +inf on the next step, as an fp16 overflow would.
    pub fn inject_overflow(&mut self, index: usize) {
        self.fault = Some(index);
    }

    /// Fault injection (`ORTBENCH_FAULT=grad-scale:F`): from now on every gradient this rank
    /// computes is multiplied by `factor` before the reduction and the optimizer — an engine
    /// bug the harness's parity probe must flag (AdamW's update barely changes, the gradient
    /// norm does).
    pub fn inject_grad_scale(&mut self, factor: f32) {
        self.grad_fault = Some(factor);
    }

    /// One step on this rank's slice of the global batch. `weight` is this rank's share of
    /// the global batch's labelled tokens (1 on a single rank); every rank must call it.
    pub fn step(&mut self, inputs: &Inputs<'_>, weight: f32, lr: f32, seed: u64) -> Result<StepStats, ParallelError> {
        let scale = self.loss_scale();
        // The backward of scale · loss: in f16 storage its gradients overflow (→ inf) exactly
        // where a GPU's would, which is what the all-reduced overflow check below catches.
        let local = self.session.forward_backward_scaled(inputs, seed, scale)?;
        if let Some(f) = self.grad_fault {
            self.session.grads.iter_mut().for_each(|g| *g *= f);
        }
        if let Some(i) = self.fault.take() {
            self.session.grads[i] = f32::INFINITY;
        }
        let inv_scale = 1.0 / scale;
        let single = self.group.world_size() == 1 && weight == 1.0;
        // The global loss is Σ_r weight_r · loss_r; gradients likewise. A rank whose slice has
        // no labelled token (possible with small MLM batches) has a NaN mean loss of an empty
        // set: it contributes nothing.
        let mut loss = [if weight == 0.0 { 0.0 } else { local * weight }];
        if !single {
            self.group.all_reduce(&mut loss, ReduceOp::Sum)?;
            if weight == 0.0 {
                self.session.grads.fill(0.0);
            } else {
                for g in self.session.grads.iter_mut() {
                    *g *= weight;
                }
            }
        }
        let (grad_norm, finite) = match self.zero.as_mut() {
            None => {
                if !single {
                    self.group.all_reduce(&mut self.session.grads, ReduceOp::Sum)?;
                }
                let s = &mut self.session;
                let prec = s.precision();
                let stats = s.opt.step(&mut s.params, &s.grads, inv_scale, lr, TrainSession::mirror(&mut s.compute, prec));
                (stats.norm, stats.finite)
            }
            Some(z) => {
                let n = self.session.params.len();
                z.send[..n].copy_from_slice(&self.session.grads);
                z.send[n..].fill(0.0);
                self.group.reduce_scatter(&z.send, &mut z.grad_shard, ReduceOp::Sum)?;
                // Global norm and overflow: every rank must clip and skip identically.
                let (ss, finite) = crate::optim::adamw::sum_squares(&z.grad_shard, inv_scale, z.opt.threads);
                let mut red = [ss, if finite { 0.0 } else { 1.0 }];
                self.group.all_reduce(&mut red[..1], ReduceOp::Sum)?;
                self.group.all_reduce(&mut red[1..], ReduceOp::Max)?;
                let norm = red[0].sqrt() as f32;
                let finite = red[1] == 0.0 && norm.is_finite();
                if finite {
                    let coef = z.opt.clip_coef(norm);
                    z.opt.update(&mut z.master, &z.grad_shard, coef * inv_scale, lr, ParamMirror::None);
                    self.group.all_gather(&z.master, &mut z.gathered)?;
                    self.session.params.copy_from_slice(&z.gathered[..n]);
                    // The compute-dtype copy the next forward reads (a real fp16 ZeRO-1 would
                    // all-gather it in f16; the values are the same).
                    self.session.refresh_compute();
                }
                (norm, finite)
            }
        };
        if let Some(sc) = self.scaler.as_mut() {
            sc.update(!finite);
        }
        Ok(StepStats { loss: loss[0], grad_norm, loss_scale: scale, skipped: !finite })
    }

    pub fn group_rank(&self) -> usize {
        self.group.rank()
    }

    pub fn group_world(&self) -> usize {
        self.group.world_size()
    }

    /// The shard layout under ZeRO-1.
    pub fn sharding(&self) -> Option<Sharding> {
        self.zero.as_ref().map(|z| z.sharding)
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_segments_tile_the_shard() {
        let full = vec![
            Segment { start: 0, len: 10, decay: true },
            Segment { start: 10, len: 5, decay: false },
            Segment { start: 15, len: 6, decay: true },
        ];
        let sh = Sharding::new(21, 2, 4); // padded to 24, shards of 12
        assert_eq!(
            shard_segments(&full, sh.range(0)),
            vec![Segment { start: 0, len: 10, decay: true }, Segment { start: 10, len: 2, decay: false }]
        );
        assert_eq!(
            shard_segments(&full, sh.range(1)),
            vec![
                Segment { start: 0, len: 3, decay: false },
                Segment { start: 3, len: 6, decay: true },
                Segment { start: 9, len: 3, decay: false }
            ]
        );
    }
}
