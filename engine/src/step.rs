//! One training step for every device: the phases a step executor runs, and the one function,
//! [`train_step`], that sequences them with loss scaling, token weighting, DDP / ZeRO-1 and the
//! loss scaler — the CPU session, the CPU ranks and the GPU session all step through it, so
//! their flows cannot drift apart.
//!
//! The phases follow llm.c's `train_gpt2.cu` step: backward, `ncclAllReduce` or
//! `ncclReduceScatter` of the gradients, the global norm from partial sums of squares, AdamW
//! on the rank's shard, `ncclAllGather` of the parameters. Each side keeps a phase's
//! results where its device keeps them: the CPU (`crate::session::CpuStep`) holds the norm
//! and the finite flag as host values and skips the update itself; the GPU
//! ([`crate::exec::gpu::session::GpuSession`]) keeps them in device memory, where its update
//! kernel reads them and skips itself — the host reads nothing before
//! [`StepExecutor::finish`].

use crate::backend::gpu::GpuDevice;
use crate::collective::{
    Collective, CollectiveError, DeviceCollective, Element, ElementKind, ReduceOp,
};
use crate::exec::{ExecError, Inputs};
use crate::optim::LossScaler;
use crate::session::{SessionError, StepStats};

/// How the ranks combine their gradients (in place in the flat gradient buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// DDP: every rank gets the sum of every rank's gradients.
    AllReduce,
    /// ZeRO-1: rank r's chunk r (`chunk` elements) becomes the sum of every rank's chunk r.
    ReduceScatter { chunk: usize },
}

/// What one step is given, the same on every rank: all of it at the step's start
/// ([`StepExecutor::backward`]), since a GPU uploads it before the step's first kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepValues {
    /// Drives the step's dropout masks.
    pub seed: u64,
    /// The loss scaler's scale (1 without one): the backward is seeded with it.
    pub loss_scale: f32,
    /// This rank's share of the global batch's labelled tokens (1 on one rank).
    pub weight: f32,
    /// The learning rate.
    pub lr: f32,
}

impl StepValues {
    /// What the statistics and the update multiply the gradients by.
    pub fn inv_scale(&self) -> f32 {
        1.0 / self.loss_scale
    }
}

/// What a step leaves for the host once its work is done.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Finished {
    /// This rank's loss: its slice's mean, unweighted.
    pub loss: f32,
    /// Global L2 norm of the unscaled gradients before clipping.
    pub grad_norm: f32,
    /// False when a gradient was inf/NaN: the update was skipped.
    pub finite: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Collective(#[from] CollectiveError),
}

impl From<ExecError> for StepError {
    fn from(e: ExecError) -> Self {
        StepError::Session(e.into())
    }
}

impl StepError {
    /// As the sessions report it: a collective's failure names the rank that saw it.
    pub fn into_session(self, rank: usize, world: usize) -> SessionError {
        match self {
            StepError::Session(e) => e,
            StepError::Collective(e) => {
                SessionError::Exec(ExecError::Device(format!("rank {rank} of {world}: {e}")))
            }
        }
    }
}

/// The phases of a training step on one device, over the ranks of a group `G`; [`train_step`]
/// calls them in order. Flat buffers: parameters, gradients and moments share one layout; "the
/// own range" is the elements this rank's optimizer updates (all of them, or its ZeRO-1 chunk).
pub trait StepExecutor<G: Collective> {
    /// ZeRO-1 over several ranks: the chunk size k of the sharded flat buffers (rank r updates
    /// chunk r); None when every rank updates everything (DDP, or one rank).
    fn zero1_chunk(&self) -> Option<usize>;

    /// Forward and backward with the step's values (kept for the later phases): the flat
    /// gradients become `loss_scale · weight · ∇loss`, zeros when `weight` is 0 (a slice
    /// without a labelled token has a NaN mean loss).
    fn backward(&mut self, inputs: &Inputs<'_>, v: &StepValues) -> Result<(), StepError>;

    /// Sums the gradients over the ranks of `group`, as `how` says.
    fn reduce_grads(&mut self, group: &G, how: Reduction) -> Result<(), StepError>;

    /// The sum of squares of the own range's gradients · the step's inv_scale (inf/NaN
    /// carried along).
    fn grad_sumsq(&mut self) -> Result<(), StepError>;

    /// Sums the ranks' sums of squares (and their inf/NaN): the own ranges tile the buffer.
    fn reduce_grad_sumsq(&mut self, group: &G) -> Result<(), StepError>;

    /// From the sum of squares: the global norm, whether it is finite, and the clipping
    /// coefficient at the optimizer's max norm (torch's `clip_grad_norm_`).
    fn grad_stats(&mut self) -> Result<(), StepError>;

    /// AdamW on the own range at the step's lr with its decay segments, the gradients times
    /// the step's inv_scale and the clipping coefficient; skipped when the statistics are not
    /// finite (a skipped update does not count as an optimizer step).
    fn adamw_update(&mut self) -> Result<(), StepError>;

    /// ZeRO-1: every rank's updated chunk (`chunk` elements) into every rank's parameters,
    /// then the compute-dtype copy the next forward reads. A skipped step may leave it out
    /// (nothing changed).
    fn gather_params(&mut self, group: &G, chunk: usize) -> Result<(), StepError>;

    /// Waits for the step and reads what the host needs.
    fn finish(&mut self, inputs: &Inputs<'_>) -> Result<Finished, StepError>;
}

/// One training step of this rank of `group` on its slice of the global batch (every rank
/// calls it with the same `lr` and `seed`): `weight` is the slice's share of the global
/// batch's labelled tokens (1 on one rank), so the ranks' weighted gradients sum to the global
/// batch's. The loss is scaled by the scaler's scale (1 without one) in the backward and
/// unscaled in the statistics and the update; an inf/NaN gradient on any rank skips the step
/// on every rank and backs the scale off. The loss returned is the global batch's.
pub fn train_step<G: Collective, E: StepExecutor<G>>(
    exec: &mut E,
    group: &G,
    weight: f32,
    scaler: Option<&mut LossScaler>,
    inputs: &Inputs<'_>,
    lr: f32,
    seed: u64,
) -> Result<StepStats, StepError> {
    let ranks = group.world_size() > 1;
    let zero1 = exec.zero1_chunk().filter(|_| ranks);
    let scale = scaler.as_deref().map_or(1.0, LossScaler::scale);
    exec.backward(inputs, &StepValues { seed, loss_scale: scale, weight, lr })?;
    if ranks {
        let how = zero1.map_or(Reduction::AllReduce, |chunk| Reduction::ReduceScatter { chunk });
        exec.reduce_grads(group, how)?;
    }
    exec.grad_sumsq()?;
    if zero1.is_some() {
        // Each rank summed its own chunk: the global norm and overflow flag are the ranks'
        // together, so every rank clips and skips identically.
        exec.reduce_grad_sumsq(group)?;
    }
    exec.grad_stats()?;
    exec.adamw_update()?;
    if let Some(chunk) = zero1 {
        exec.gather_params(group, chunk)?;
    }
    let done = exec.finish(inputs)?;
    if let Some(s) = scaler {
        s.update(!done.finite);
    }
    // The global loss Σ_r weight_r · loss_r (a rank whose slice has no labelled token has a
    // NaN mean loss of an empty set: it contributes nothing).
    let mut loss = [if weight == 0.0 { 0.0 } else { done.loss * weight }];
    if ranks {
        group.all_reduce(&mut loss, ReduceOp::Sum)?;
    }
    Ok(StepStats {
        loss: loss[0],
        grad_norm: done.grad_norm,
        loss_scale: scale,
        skipped: !done.finite,
    })
}

/// The group of one rank alone, for the single-rank steps ([`train_step`] runs no collective
/// on a world of one; these are the identities they would be).
pub struct Alone;

impl Collective for Alone {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce<T: Element>(&self, _: &mut [T], _: ReduceOp) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        _: ReduceOp,
    ) -> Result<(), CollectiveError> {
        recv.copy_from_slice(send);
        Ok(())
    }
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollectiveError> {
        recv.copy_from_slice(send);
        Ok(())
    }
    fn reduce_scatter_in_place<T: Element>(
        &self,
        _: &mut [T],
        _: usize,
        _: ReduceOp,
    ) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn all_gather_in_place<T: Element>(
        &self,
        _: &mut [T],
        _: usize,
    ) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn broadcast<T: Element>(&self, _: &mut [T], _: usize) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn barrier(&self) -> Result<(), CollectiveError> {
        Ok(())
    }
}

impl<D: GpuDevice> DeviceCollective<D> for Alone {
    unsafe fn all_reduce_on(
        &self,
        _: &D,
        _: u64,
        _: usize,
        _: ElementKind,
        _: ReduceOp,
    ) -> Result<(), CollectiveError> {
        Ok(())
    }
    unsafe fn reduce_scatter_on(
        &self,
        _: &D,
        _: u64,
        _: usize,
        _: ElementKind,
        _: ReduceOp,
    ) -> Result<(), CollectiveError> {
        Ok(())
    }
    unsafe fn all_gather_on(
        &self,
        _: &D,
        _: u64,
        _: usize,
        _: ElementKind,
    ) -> Result<(), CollectiveError> {
        Ok(())
    }
}

/// The drift check: one tiny model stepped through the CPU session and the GPU session (the
/// host SIMT harness as the GPU), on one rank and as ZeRO-1 over two, with a loss scaler that
/// grows, an overflow forced on one step (an inf in an input), clipping active and two decay
/// segments — the same steps skipped, the same loss scales, the same losses, norms and
/// parameters on both devices, and what a correct step gives.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::simt_device::SimtGpu;
    use crate::collective::LocalGroup;
    use crate::exec::gpu::session::{GpuSession, RankLayout};
    use crate::graph::Graph;
    use crate::optim::{AdamWConfig, Segment};
    use crate::parallel::{DataParallel, Strategy};
    use crate::session::{ExecutorKind, TrainSession};
    use crate::DType;

    /// The host SIMT harness as a GPU (`backend::simt_device`, as tests/tests/gpu_executor.rs
    /// uses it): host memory, the kernels on its fibers at warp 32 in forward order, 4 blocks,
    /// a plain-loop GEMM.
    fn simt() -> SimtGpu {
        SimtGpu::new(32, ortbench_simt::Order::Forward)
    }

    const T: usize = 4;
    const C: usize = 8;
    const V: usize = 11;
    const STEPS: usize = 5;
    /// The step whose rank-0 rows carry an inf logit.
    const OVERFLOW: usize = 1;
    const LR: f32 = 1e-2;
    const CFG: AdamWConfig = AdamWConfig {
        lr: LR,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        // Below every step's norm: clipping is on.
        max_grad_norm: 0.05,
    };

    /// A training graph of `b` rows with ops both devices run: embedding, linear, tanh,
    /// layer norm, a tied LM head plus an additive `noise` input on the logits (where the
    /// overflow is planted), cross-entropy.
    fn graph(b: usize) -> Graph {
        let mut g = Graph::new();
        let ids = g.input_ids("input_ids", &[b, T]).unwrap();
        let labels = g.input_ids("labels", &[b, T]).unwrap();
        let noise = g.input_float("noise", &[b, T, V]).unwrap();
        let wte = g.param("wte", &[V, C]).unwrap();
        let w = g.param("fc.weight", &[C, C]).unwrap();
        let bias = g.param("fc.bias", &[C]).unwrap();
        let (lw, lb) = (g.param("ln.weight", &[C]).unwrap(), g.param("ln.bias", &[C]).unwrap());
        let x = g.embedding(wte, ids).unwrap();
        let x = g.linear(x, w, Some(bias)).unwrap();
        let x = g.tanh(x).unwrap();
        let x = g.layer_norm(x, lw, lb, 1e-5).unwrap();
        let logits = g.matmul(x, wte, false, true).unwrap();
        let logits = g.add(logits, noise).unwrap();
        let loss = g.cross_entropy(logits, labels).unwrap();
        crate::autodiff::backward(&g, loss).unwrap()
    }

    /// Step `step`'s feed for `rows` of the global batch of 2 rows: row 0 has an ignored label
    /// (so the ranks' weights are 3/7 and 4/7), and an inf logit on the overflow step.
    struct Feed {
        ids: Vec<i64>,
        labels: Vec<i64>,
        noise: Vec<f32>,
    }

    impl Feed {
        fn new(step: usize, rows: std::ops::Range<usize>) -> Feed {
            let mut f = Feed { ids: Vec::new(), labels: Vec::new(), noise: Vec::new() };
            for r in rows {
                for t in 0..T {
                    let k = (step * 7 + r * 5 + t * 3) as i64;
                    f.ids.push(k % V as i64);
                    f.labels.push(if (r, t) == (0, 2) { -100 } else { (k * 2 + 1) % V as i64 });
                    let inf = (step, r, t) == (OVERFLOW, 0, 0);
                    f.noise.extend((0..V).map(|v| if inf && v == 0 { f32::INFINITY } else { 0.0 }));
                }
            }
            f
        }

        fn inputs(&self) -> Inputs<'_> {
            Inputs::new()
                .ids("input_ids", &self.ids)
                .ids("labels", &self.labels)
                .floats("noise", &self.noise)
        }
    }

    /// Rank r's share of the global batch's labelled tokens (3 of 7 on row 0, 4 on row 1).
    fn weight(rank: usize) -> f32 {
        [3.0 / 7.0, 4.0 / 7.0][rank]
    }

    /// Decay on the first half (inside rank 0's ZeRO-1 chunk), none on the rest.
    fn setup() -> (Vec<f32>, Vec<Segment>) {
        let g = graph(1);
        let n = g.num_param_elems();
        let segs = vec![
            Segment { start: 0, len: n / 2, decay: true },
            Segment { start: n / 2, len: n - n / 2, decay: false },
        ];
        (crate::plan::testgraphs::params(&g, 5), segs)
    }

    /// A scaler at 1024 that doubles after 2 clean steps: halved by the overflow on step 1,
    /// doubled again after steps 2 and 3.
    fn scaler() -> Option<LossScaler> {
        let mut s = LossScaler::resumed(1024.0, 0);
        s.growth_interval = 2;
        Some(s)
    }

    /// One run's steps and final parameters.
    type Run = (Vec<StepStats>, Vec<f32>);

    fn cpu_one_rank() -> Run {
        let (params, segs) = setup();
        let mut s = TrainSession::with_executor(
            graph(2),
            params,
            segs,
            CFG,
            DType::F32,
            ExecutorKind::Planned,
        )
        .unwrap();
        s.set_loss_scaler(scaler());
        let stats = (0..STEPS)
            .map(|i| s.step(&Feed::new(i, 0..2).inputs(), LR, i as u64).unwrap())
            .collect();
        (stats, s.params)
    }

    fn gpu_one_rank() -> Run {
        let (params, segs) = setup();
        let mut s = GpuSession::new(graph(2), simt(), &params, segs, CFG, DType::F32).unwrap();
        s.set_loss_scaler(scaler());
        let stats = (0..STEPS)
            .map(|i| s.step(&Feed::new(i, 0..2).inputs(), LR, i as u64).unwrap())
            .collect();
        (stats, s.params().unwrap())
    }

    /// ZeRO-1 over 2 ranks as threads, each stepped by `step(rank, group)`; rank 0's run.
    fn zero1(run: impl Fn(usize, LocalGroup) -> Run + Sync) -> Vec<Run> {
        std::thread::scope(|s| {
            let hs: Vec<_> = LocalGroup::new(2)
                .into_iter()
                .enumerate()
                .map(|(r, g)| {
                    let run = &run;
                    s.spawn(move || run(r, g))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn cpu_zero1() -> Vec<Run> {
        zero1(|r, group| {
            let (params, segs) = setup();
            let s = TrainSession::with_executor(
                graph(1),
                params,
                segs,
                CFG,
                DType::F32,
                ExecutorKind::Planned,
            )
            .unwrap();
            let mut dp = DataParallel::new(s, group, Strategy::Zero1);
            dp.set_loss_scaler(scaler());
            let stats = (0..STEPS)
                .map(|i| {
                    dp.step(&Feed::new(i, r..r + 1).inputs(), weight(r), LR, i as u64).unwrap()
                })
                .collect();
            (stats, dp.session.params)
        })
    }

    fn gpu_zero1() -> Vec<Run> {
        zero1(|r, group| {
            let (params, segs) = setup();
            let layout = RankLayout { rank: r, world: 2, strategy: Strategy::Zero1 };
            let mut s =
                GpuSession::ranked(graph(1), simt(), &params, segs, CFG, DType::F32, layout)
                    .unwrap();
            s.set_loss_scaler(scaler());
            let stats = (0..STEPS)
                .map(|i| {
                    let f = Feed::new(i, r..r + 1);
                    s.step_ranked(&group, weight(r), &f.inputs(), LR, i as u64).unwrap()
                })
                .collect();
            (stats, s.params().unwrap())
        })
    }

    /// What a correct step gives, independent of the device: the overflow step skipped, the
    /// scale halved after it and doubled after two clean steps, clipping active on the others.
    fn expected(label: &str, stats: &[StepStats], problems: &mut Vec<String>) {
        let skipped: Vec<bool> = stats.iter().map(|s| s.skipped).collect();
        let scales: Vec<f32> = stats.iter().map(|s| s.loss_scale).collect();
        if skipped != [false, true, false, false, false] {
            problems.push(format!("{label}: skipped {skipped:?}"));
        }
        if scales != [1024.0, 1024.0, 512.0, 512.0, 1024.0] {
            problems.push(format!("{label}: loss scales {scales:?}"));
        }
        for (i, s) in stats.iter().enumerate() {
            let ok = if i == OVERFLOW {
                s.loss.is_nan()
            } else {
                s.loss.is_finite() && s.grad_norm > CFG.max_grad_norm
            };
            if !ok {
                problems.push(format!("{label}: step {i} {s:?}"));
            }
        }
    }

    /// `got` against `want` (another device or layout): the same steps and scales, losses and
    /// norms within 1e-4 relative, parameters within 1e-5.
    fn agree(label: &str, got: &Run, want: &Run, problems: &mut Vec<String>) {
        let close = |a: f32, b: f32| (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-4 * b.abs();
        for (i, (a, b)) in got.0.iter().zip(&want.0).enumerate() {
            let same = a.skipped == b.skipped && a.loss_scale == b.loss_scale;
            if !same || !close(a.loss, b.loss) || !close(a.grad_norm, b.grad_norm) {
                problems.push(format!("{label}: step {i} {a:?} vs {b:?}"));
            }
        }
        let worst = got.1.iter().zip(&want.1).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        if worst.is_nan() || worst > 1e-5 {
            problems.push(format!("{label}: parameters differ by {worst:e}"));
        }
    }

    #[test]
    fn cpu_and_gpu_steps_agree_on_one_rank_and_under_zero1() {
        let mut problems = Vec::new();
        let (cpu, gpu) = (cpu_one_rank(), gpu_one_rank());
        let (cpu_z, gpu_z) = (cpu_zero1(), gpu_zero1());
        for (label, run) in [("cpu", &cpu), ("gpu", &gpu)] {
            println!("{label}: {:?}", run.0);
            expected(label, &run.0, &mut problems);
        }
        agree("gpu vs cpu", &gpu, &cpu, &mut problems);
        for r in 0..2 {
            for (label, runs) in [("cpu zero1", &cpu_z), ("gpu zero1", &gpu_z)] {
                let label = format!("{label} rank {r}");
                println!("{label}: {:?}", runs[r].0);
                expected(&label, &runs[r].0, &mut problems);
                agree(&format!("{label} vs cpu one rank"), &runs[r], &cpu, &mut problems);
            }
            agree(&format!("gpu vs cpu zero1 rank {r}"), &gpu_z[r], &cpu_z[r], &mut problems);
        }
        assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
    }
}
