//! Data parallelism over a [`Collective`]: DDP (gradients averaged, every rank runs the full
//! optimizer) and ZeRO stage 1 (Rajbhandari et al. 2020, §5.1 P_os: gradients reduce-scattered,
//! each rank updates only its shard of the parameters with the Adam moments of that shard, the
//! updated parameters all-gathered).
//!
//! ZeRO-1 runs in place, as llm.c does (`train_gpt2.cu`: `ncclReduceScatter(grads, grads +
//! rank·shard, …)`, then `ncclAllGather(params + rank·shard, params, …)`): the gradients are
//! reduce-scattered inside the session's flat gradient buffer, the rank's AdamW updates its
//! slice of the session's parameters, and the all-gather fills the others' slices — no
//! full-size scratch buffer, no shard copies; beside the session a rank holds only its
//! moments (8Ψ/N bytes). The flat buffers stay Ψ long: their padding to a multiple of the ranks
//! ([`Sharding`]) is never stored (the in-place collectives take buffers shorter than N·k).
//!
//! Loss normalisation follows HF Trainer's `average_tokens_across_devices`: a rank's gradient
//! is weighted by its share of the global batch's labelled tokens, so N ranks compute exactly
//! the gradient of one rank on the whole global batch (an MLM batch has different label counts
//! per rank; plain averaging of per-rank means would not).
//!
//! The step itself is [`crate::step::train_step`], the GPU session's too; here are what a CPU
//! rank holds beside its session (the shard's optimizer, the loss scaler, planted faults).

use std::ops::Range;

use crate::collective::{Collective, CollectiveError, Sharding};
use crate::exec::Inputs;
use crate::optim::{AdamW, LossScaler, Segment};
use crate::session::{CpuStep, GradFaults, SessionError, Shard, StepStats, TrainSession};
use crate::step::{train_step, StepError};

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

impl From<StepError> for ParallelError {
    fn from(e: StepError) -> Self {
        match e {
            StepError::Session(e) => ParallelError::Session(e),
            StepError::Collective(e) => ParallelError::Collective(e),
        }
    }
}

/// ZeRO-1 state of one rank of N > 1 (one rank runs as DDP: it would shard nothing).
///
/// Nothing here is parameter- or gradient-sized: the rank's shards are slices of the session's
/// own flat buffers, `session.params[own]` and `session.grads[own]`.
struct Zero1State {
    sharding: Sharding,
    /// This rank's stored elements of the flat buffers: its shard of the padded layout clipped
    /// to Ψ (short or empty for the last ranks, whose padding is never stored).
    own: Range<usize>,
    /// AdamW over `own` only: both moments are `own.len()` long, fp32.
    opt: AdamW,
}

impl Zero1State {
    /// Takes this rank's shard of `session`'s optimizer: its moments (state kept, if the
    /// session has stepped already) and step count; the session's full moments are freed.
    fn take_shard(session: &mut TrainSession, rank: usize, world: usize) -> Self {
        let sharding = Sharding::new(session.params.len(), world, SHARD_ALIGN);
        let own = sharding.real_range(rank);
        let full = &mut session.opt;
        // Shrunk where they lie (copy_within + realloc): never the full and the shard moments at once.
        let (m, v) = (
            shard_of(std::mem::take(&mut full.m), &own),
            shard_of(std::mem::take(&mut full.v), &own),
        );
        let mut opt = AdamW::new(full.cfg, shard_segments(full.segments(), own.clone()), own.len());
        (opt.m, opt.v, opt.step, opt.threads) = (m, v, full.step, full.threads);
        Zero1State { sharding, own, opt }
    }
}

/// `full[range]`, in `full`'s own allocation shrunk to fit.
fn shard_of(mut full: Vec<f32>, range: &Range<usize>) -> Vec<f32> {
    full.copy_within(range.clone(), 0);
    full.truncate(range.len());
    full.shrink_to_fit();
    full
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
    /// Wraps this rank's session. All ranks must start from identical parameters. Under
    /// ZeRO-1 with N > 1 ranks the session's full moments are replaced by this rank's shard
    /// of them; one rank runs exactly as DDP (no shard state, no collectives).
    pub fn new(mut session: TrainSession, group: C, strategy: Strategy) -> Self {
        let world = group.world_size();
        let zero = (strategy == Strategy::Zero1 && world > 1)
            .then(|| Zero1State::take_shard(&mut session, group.rank(), world));
        DataParallel { session, group, strategy, zero, scaler: None, fault: None, grad_fault: None }
    }

    /// Bytes of optimizer state this rank holds: the fp32 Adam moments of the parameters it
    /// updates — 8Ψ under DDP (and ZeRO-1 on one rank), 8Ψ/N under ZeRO-1 (its shard, the
    /// padding not stored), in every precision.
    ///
    /// There is no fp32 master copy to count: on this CPU engine `session.params` is fp32 in
    /// every precision (fp16/bf16 steps read the rounded copy `session.compute`), so the
    /// parameters themselves are the master weights, updated in place — under ZeRO-1 the
    /// rank's slice of them is the master of its shard. (A GPU backend that stores only
    /// f16/bf16 parameters would add an fp32 master: 4Ψ under DDP, 4Ψ/N under ZeRO-1 — the
    /// ZeRO paper's 12Ψ and 12Ψ/N.)
    pub fn optimizer_bytes(&self) -> usize {
        match &self.zero {
            Some(z) => z.opt.state_bytes(),
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

    /// The loss scaler, when the run scales its loss.
    pub fn loss_scaler(&self) -> Option<&LossScaler> {
        self.scaler.as_ref()
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

    /// One step on this rank's slice of the global batch ([`crate::step::train_step`] with this
    /// rank's session and shard). `weight` is this rank's share of the global batch's labelled
    /// tokens (1 on a single rank); every rank must call it.
    pub fn step(
        &mut self,
        inputs: &Inputs<'_>,
        weight: f32,
        lr: f32,
        seed: u64,
    ) -> Result<StepStats, ParallelError> {
        let faults = GradFaults { scale: self.grad_fault, overflow_at: self.fault.take() };
        let shard = self.zero.as_mut().map(|z| Shard {
            opt: &mut z.opt,
            own: z.own.clone(),
            chunk: z.sharding.shard,
        });
        let mut exec = CpuStep::new(&mut self.session, shard, faults);
        Ok(train_step(&mut exec, &self.group, weight, self.scaler.as_mut(), inputs, lr, seed)?)
    }

    pub fn group_rank(&self) -> usize {
        self.group.rank()
    }

    pub fn group_world(&self) -> usize {
        self.group.world_size()
    }

    /// The shard layout under ZeRO-1 (one shard on one rank).
    pub fn sharding(&self) -> Option<Sharding> {
        (self.strategy == Strategy::Zero1).then(|| match &self.zero {
            Some(z) => z.sharding,
            None => Sharding::new(self.session.params.len(), 1, SHARD_ALIGN),
        })
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
            vec![
                Segment { start: 0, len: 10, decay: true },
                Segment { start: 10, len: 2, decay: false }
            ]
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
