//! A training session on a GPU: the [`GpuExecutor`]'s forward and backward, then the optimizer
//! step in three launches over the flat buffers (engine/kernels/adamw.cu) — all queued, with one
//! read of the status block per step (loss, gradient norm, finite flag).
//!
//! The same step as the CPU's [`crate::session::TrainSession`]: both run
//! [`crate::step::train_step`], this session as its GPU executor (the phases below) — fp32
//! master parameters, HF's AdamW with decoupled decay by segment, clipping at the global norm,
//! dynamic loss scaling that skips a step on inf/NaN (the kernel skips itself, the host then
//! does not count the step). `tests/tests/gpu_executor.rs` trains both side by side.
//!
//! A session of one rank captures its step once as a CUDA graph (forward, backward and the
//! optimizer: every launch reads what changes from step to step from the step block, see
//! [`super::step_block`]) and then replays it: a step is one pinned upload, one replay and one
//! status read, instead of one host call per kernel — the ~550–750 launches of a gpt2 or
//! bert-base step. The first step runs directly (it loads the kernels and lets cuBLASLt pick
//! its algorithms, which a capture must not do); a step that cannot be captured runs directly
//! with the reason kept ([`GpuSession::launching`]): several ranks (their collectives run
//! between the phases from the host), a device that refuses the capture, or capture turned off.
//!
//! Data parallelism ([`GpuSession::ranked`], [`GpuSession::step_ranked`]) is the CPU's
//! `crate::parallel` on device buffers through a [`DeviceCollective`] (NCCL on a GPU), queued
//! between the backward and the optimizer with no host copy:
//! - DDP: the flat gradients all-reduced (summed: each rank's backward is seeded with its share
//!   of the global batch's labelled tokens, so the sum is the global batch's gradient); every
//!   rank then runs the full optimizer.
//! - ZeRO-1 (llm.c's layout): the flat buffers padded to world·k elements; the gradients
//!   reduce-scattered in place, so rank r holds the summed chunk r; the sum-of-squares partials
//!   over that chunk all-reduced (the global norm and finite flag, identical on every rank);
//!   AdamW on chunk r with moments for that chunk only (8Ψ/N bytes); the fp32 parameters
//!   all-gathered in place, and the f16/bf16 compute copy cast from them.

use std::ops::Range;

use super::launch::{adamw, elementwise as ew, Device, PerStep};
use super::{status, GpuExecutor, StepBlock};
use crate::backend::gpu::{GpuDevice, GpuError};
use crate::collective::{DeviceCollective, ElementKind, ReduceOp, Sharding};
use crate::exec::{ExecError, Inputs};
use crate::graph::Graph;
use crate::optim::{AdamWConfig, LossScaler, Segment};
use crate::parallel::{shard_segments, Strategy, SHARD_ALIGN};
use crate::session::{SessionError, StepStats};
use crate::step::{train_step, Alone, Finished, Reduction, StepError, StepExecutor, StepValues};
use crate::DType;

/// Where a session's rank stands in a data-parallel run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankLayout {
    pub rank: usize,
    pub world: usize,
    pub strategy: Strategy,
}

impl RankLayout {
    /// One rank alone (DDP of one: no collective).
    pub fn single() -> Self {
        RankLayout { rank: 0, world: 1, strategy: Strategy::Ddp }
    }
}

/// How a session's steps reach the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launching {
    /// Each step replays the step captured as a CUDA graph.
    Captured,
    /// Each launch is issued from the host, for this reason.
    Direct(String),
}

impl std::fmt::Display for Launching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Launching::Captured => write!(f, "captured step, replayed"),
            Launching::Direct(why) => write!(f, "direct launches: {why}"),
        }
    }
}

/// Where a session stands with its captured step.
enum Capture<G> {
    /// To capture once a step has run directly.
    Pending,
    Ready(G),
    /// Not captured, for this reason.
    Off(String),
}

pub struct GpuSession<D: GpuDevice> {
    exec: GpuExecutor<D>,
    cfg: AdamWConfig,
    m: D::Buffer,
    v: D::Buffer,
    seg_start: D::Buffer,
    seg_decay: D::Buffer,
    nseg: usize,
    partials: D::Buffer,
    parts: u32,
    layout: RankLayout,
    /// The flat elements this rank's optimizer updates: all Ψ, or its ZeRO-1 chunk (clipped to
    /// Ψ: the last ranks' padding is not updated).
    own: Range<usize>,
    /// ZeRO-1 with more than one rank: elements per chunk k of the padded buffers (world·k).
    chunk: Option<usize>,
    /// Updates applied (skipped steps do not count), as the CPU's `AdamW::step`.
    pub step: u64,
    scaler: Option<LossScaler>,
    capture: Capture<D::Graph>,
    /// This step is a replay of the captured one: its later phases are in it.
    replaying: bool,
    /// A step has run (the kernels are loaded and the GEMM algorithms chosen).
    warm: bool,
}

fn dev(e: crate::backend::gpu::GpuError) -> SessionError {
    SessionError::Exec(ExecError::Device(e.0))
}

impl<D: GpuDevice> GpuSession<D> {
    /// Plans `graph` on `dev`, uploads `params` (the graph's flat layout) and zeroes the moments.
    pub fn new(
        graph: Graph,
        dev_: D,
        params: &[f32],
        segments: Vec<Segment>,
        cfg: AdamWConfig,
        precision: DType,
    ) -> Result<Self, SessionError> {
        Self::ranked(graph, dev_, params, segments, cfg, precision, RankLayout::single())
    }

    /// As [`GpuSession::new`], for rank `layout.rank` of a data-parallel run: under ZeRO-1
    /// with several ranks the flat buffers are padded to a multiple of the ranks and the
    /// moments cover this rank's chunk only. Every rank starts from the same `params`.
    pub fn ranked(
        graph: Graph,
        dev_: D,
        params: &[f32],
        segments: Vec<Segment>,
        cfg: AdamWConfig,
        precision: DType,
        layout: RankLayout,
    ) -> Result<Self, SessionError> {
        if !graph.is_training() || graph.loss().is_none() {
            return Err(SessionError::NotTraining);
        }
        if graph.dtype() != precision {
            return Err(SessionError::GraphDtype { session: precision, graph: graph.dtype() });
        }
        let n = graph.num_param_elems();
        if params.len() != n {
            return Err(SessionError::ParamLen { expected: n, got: params.len() });
        }
        let mut next = 0;
        for s in &segments {
            assert_eq!(s.start, next, "segments must tile the buffer in order");
            next += s.len;
        }
        assert_eq!(next, n, "segments must cover the whole buffer");
        assert!(
            layout.world > 0 && layout.rank < layout.world,
            "rank {} of {}",
            layout.rank,
            layout.world
        );
        let (flat_len, own, chunk) = match layout.strategy {
            Strategy::Zero1 if layout.world > 1 => {
                let sh = Sharding::new(n, layout.world, SHARD_ALIGN);
                (sh.padded(), sh.real_range(layout.rank), Some(sh.shard))
            }
            _ => (n, 0..n, None),
        };
        let exec = GpuExecutor::with_flat_len(&graph, dev_, flat_len)?;
        exec.upload_params(params)?;
        let d = exec.device();
        // Moments for the updated elements only (at least one element: no zero-size allocation).
        let m = d.alloc_zeroed(own.len().max(1) * 4).map_err(dev)?;
        let v = d.alloc_zeroed(own.len().max(1) * 4).map_err(dev)?;
        let segments = shard_segments(&segments, own.clone());
        let starts: Vec<u8> =
            segments.iter().flat_map(|s| (s.start as i64).to_le_bytes()).collect();
        let decays: Vec<u8> =
            segments.iter().flat_map(|s| i32::from(s.decay).to_le_bytes()).collect();
        let seg_start = d.alloc_zeroed(starts.len().max(8)).map_err(dev)?;
        let seg_decay = d.alloc_zeroed(decays.len().max(4)).map_err(dev)?;
        // SAFETY: each buffer holds its bytes.
        unsafe {
            d.upload(d.address(&seg_start), &starts).map_err(dev)?;
            d.upload(d.address(&seg_decay), &decays).map_err(dev)?;
        }
        // The same number of partials on every rank (from the chunk size, not the clipped
        // chunk): ZeRO-1 all-reduces them element-wise.
        let parts = adamw::sumsq_blocks(chunk.unwrap_or(n));
        let partials = d.alloc_zeroed(parts as usize * 4).map_err(dev)?;
        Ok(GpuSession {
            exec,
            cfg,
            m,
            v,
            seg_start,
            seg_decay,
            nseg: segments.len(),
            partials,
            parts,
            layout,
            own,
            chunk,
            step: 0,
            scaler: None,
            capture: if layout.world > 1 {
                let why = "several ranks run their collectives between the phases from the host";
                Capture::Off(why.into())
            } else {
                Capture::Pending
            },
            replaying: false,
            warm: false,
        })
    }

    /// How the steps reach the device: replayed from a capture, or launched directly and why.
    pub fn launching(&self) -> Launching {
        match &self.capture {
            Capture::Ready(_) => Launching::Captured,
            Capture::Pending if self.warm => Launching::Direct("the next step is captured".into()),
            Capture::Pending => Launching::Direct("the first step runs directly".into()),
            Capture::Off(why) => Launching::Direct(why.clone()),
        }
    }

    /// Launches every step directly, for `reason` (a user's choice, a test's comparison).
    pub fn capture_off(&mut self, reason: &str) {
        self.capture = Capture::Off(reason.to_string());
    }

    pub fn layout(&self) -> RankLayout {
        self.layout
    }

    pub fn executor(&self) -> &GpuExecutor<D> {
        &self.exec
    }

    pub fn graph(&self) -> &Graph {
        self.exec.graph()
    }

    /// Dynamic loss scaling for [`GpuSession::step`].
    pub fn set_loss_scaler(&mut self, scaler: Option<LossScaler>) {
        self.scaler = scaler;
    }

    /// Bytes of optimizer state on the device: both moments, fp32, for the elements this rank
    /// updates (8Ψ, or 8Ψ/N under ZeRO-1).
    pub fn state_bytes(&self) -> usize {
        2 * 4 * self.own.len()
    }

    /// The fp32 parameters (waits for the device).
    pub fn params(&self) -> Result<Vec<f32>, SessionError> {
        Ok(self.exec.download_params()?)
    }

    /// The Adam moments (exp_avg, exp_avg_sq) of the elements this rank updates, fp32 (waits
    /// for the device).
    pub fn moments(&self) -> Result<(Vec<f32>, Vec<f32>), SessionError> {
        let d = self.exec.device();
        let get = |b: &D::Buffer| -> Result<Vec<f32>, SessionError> {
            let mut bytes = vec![0u8; self.own.len() * 4];
            // SAFETY: each moment buffer holds own.len() f32 (at least one).
            unsafe { d.download(d.address(b), &mut bytes) }.map_err(dev)?;
            Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
        };
        Ok((get(&self.m)?, get(&self.v)?))
    }

    /// The loss scaler's state, if fp16 runs one.
    pub fn loss_scaler(&self) -> Option<&LossScaler> {
        self.scaler.as_ref()
    }

    /// Continues from a saved state: the fp32 parameters (and their compute copy), both Adam
    /// moments of this rank's elements and the optimizer's step, so the next step is the one
    /// the saved session would have taken.
    pub fn restore(
        &mut self,
        params: &[f32],
        (m, v): (&[f32], &[f32]),
        step: u64,
    ) -> Result<(), SessionError> {
        let n = self.own.len();
        if m.len() != n || v.len() != n {
            return Err(SessionError::ParamLen { expected: n, got: m.len().min(v.len()) });
        }
        self.exec.upload_params(params)?;
        let d = self.exec.device();
        for (buf, x) in [(&self.m, m), (&self.v, v)] {
            let bytes: Vec<u8> = x.iter().flat_map(|f| f.to_le_bytes()).collect();
            // SAFETY: each moment buffer holds own.len() f32.
            unsafe { d.upload(d.address(buf), &bytes) }.map_err(dev)?;
        }
        self.step = step;
        Ok(())
    }

    /// The last step's gradients, scaled by that step's loss scale (waits for the device).
    pub fn grads(&self) -> Result<Vec<f32>, SessionError> {
        Ok(self.exec.download_grads()?)
    }

    /// One training step at learning rate `lr`; `seed` drives this step's dropout masks
    /// ([`crate::step::train_step`] on this session alone).
    pub fn step(
        &mut self,
        inputs: &Inputs<'_>,
        lr: f32,
        seed: u64,
    ) -> Result<StepStats, SessionError> {
        assert_eq!(
            self.layout.world, 1,
            "a session of {} ranks steps with step_ranked",
            self.layout.world
        );
        self.step_with(&Alone, 1.0, inputs, lr, seed)
    }

    /// One step of this rank on its slice of the global batch: `weight` is the slice's share
    /// of the global batch's labelled tokens (as `crate::parallel::DataParallel::step`); every
    /// rank calls it with the same `lr` and the group of the session's layout. The loss
    /// returned is the global batch's, on every rank.
    pub fn step_ranked<C: DeviceCollective<D>>(
        &mut self,
        group: &C,
        weight: f32,
        inputs: &Inputs<'_>,
        lr: f32,
        seed: u64,
    ) -> Result<StepStats, SessionError> {
        if (group.rank(), group.world_size()) != (self.layout.rank, self.layout.world) {
            return Err(SessionError::Exec(ExecError::Device(format!(
                "the session is rank {} of {}, the group rank {} of {}",
                self.layout.rank,
                self.layout.world,
                group.rank(),
                group.world_size()
            ))));
        }
        self.step_with(group, weight, inputs, lr, seed)
    }

    /// [`crate::step::train_step`] with this session as its executor.
    fn step_with<C: DeviceCollective<D>>(
        &mut self,
        group: &C,
        weight: f32,
        inputs: &Inputs<'_>,
        lr: f32,
        seed: u64,
    ) -> Result<StepStats, SessionError> {
        // The scaler is lent to the step while the session is its executor.
        let mut scaler = self.scaler.take();
        let out = train_step(self, group, weight, scaler.as_mut(), inputs, lr, seed);
        self.scaler = scaler;
        out.map_err(|e| e.into_session(self.layout.rank, self.layout.world))
    }

    /// The optimizer's statistics in the status block: norm, finite (1/0), clip coefficient.
    fn stats_address(&self) -> u64 {
        self.exec.status_address() + 4 * status::STATS as u64
    }

    /// `base` (a flat buffer of `size`-byte elements) at the first element this rank updates.
    fn own_address(&self, base: u64, size: usize) -> u64 {
        base + (self.own.start * size) as u64
    }

    /// Records one step — the executor's launches, then the optimizer's — as a graph; nothing
    /// runs. A capture that fails is ended before the error returns.
    fn capture_step(&self) -> Result<D::Graph, GpuError> {
        let d = self.exec.device();
        d.capture_begin()?;
        let queued = (|| {
            self.exec.queue_calls().map_err(|e| GpuError(e.to_string()))?;
            self.queue_grad_sumsq()?;
            self.queue_grad_stats()?;
            self.queue_adamw()
        })();
        let graph = d.capture_end();
        queued?;
        graph
    }

    /// Per-block sums of squares of the own range's gradients · the step block's inv_scale.
    fn queue_grad_sumsq(&self) -> Result<(), GpuError> {
        let d = self.exec.device();
        let l = adamw::GradSumsqPartial {
            partials: d.address(&self.partials),
            parts: self.parts,
            grads: self.own_address(self.exec.grad_address(), 4),
            n: self.own.len(),
            inv_scale: PerStep::Block(self.exec.step_block_address()),
        };
        // SAFETY: `parts` partials; the own range lies inside the gradient buffer.
        unsafe { l.launch(Device::of(d)).run(d) }
    }

    /// The global norm, finite flag and clip coefficient into the status block.
    fn queue_grad_stats(&self) -> Result<(), GpuError> {
        let d = self.exec.device();
        let l = adamw::GradStatsFinish {
            stats: self.stats_address(),
            partials: d.address(&self.partials),
            parts: self.parts,
            max_norm: self.cfg.max_grad_norm,
        };
        // SAFETY: the status block and `parts` partials.
        unsafe { l.launch(Device::of(d)).run(d) }
    }

    /// AdamW on the own range with the step block's scalars (skipped by the kernel when the
    /// statistics are not finite).
    fn queue_adamw(&self) -> Result<(), GpuError> {
        let (d, c) = (self.exec.device(), &self.cfg);
        let dtype = self.exec.graph().dtype();
        let l = adamw::AdamwStep {
            dtype,
            params: self.own_address(self.exec.param_address(), 4),
            grads: self.own_address(self.exec.grad_address(), 4),
            m: d.address(&self.m),
            v: d.address(&self.v),
            // The compute copy (f16/bf16) is written as the master is updated; none in fp32.
            mirror: self.exec.compute_address().map(|a| self.own_address(a, dtype.size())),
            n: self.own.len(),
            seg_start: d.address(&self.seg_start),
            seg_decay: d.address(&self.seg_decay),
            nseg: self.nseg,
            stats: self.stats_address(),
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            step: PerStep::Block(self.exec.step_block_address()),
        };
        // SAFETY: the flat buffers hold at least n f32 (own ⊆ 0..n), the moments own.len(),
        // the segments nseg, and the status block its words.
        unsafe { l.launch(Device::of(d)).run(d) }
    }
}

/// The GPU side of the step contract: every phase queued on the device in order, the
/// collectives on the device's buffers; the statistics stay in the status block, where the
/// update kernel reads them (and skips itself when they are not finite), until `finish`.
impl<D: GpuDevice, C: DeviceCollective<D>> StepExecutor<C> for GpuSession<D> {
    fn zero1_chunk(&self) -> Option<usize> {
        self.chunk
    }

    fn backward(&mut self, inputs: &Inputs<'_>, v: &StepValues) -> Result<(), StepError> {
        // The backward is seeded with scale·weight: the gradients come out weighted, ready to
        // be summed (the CPU multiplies them after the backward instead; one pass over Ψ
        // fewer here). A rank with no labelled token contributes zeros.
        let weight = v.weight;
        // If this step is applied it is update number step + 1; `finish` counts it then.
        let sc = self.cfg.step_scalars(self.step + 1, v.lr);
        let block = StepBlock {
            seed: v.seed,
            loss_scale: if weight == 0.0 { v.loss_scale } else { v.loss_scale * weight },
            inv_scale: v.inv_scale(),
            step_size: sc.step_size,
            inv_bc2_sqrt: sc.inv_bc2_sqrt,
            decay_mul: sc.decay_mul,
        };
        self.exec.upload_step(inputs, &block)?;
        if matches!(self.capture, Capture::Pending) && self.warm {
            self.capture = match self.capture_step() {
                Ok(g) => Capture::Ready(g),
                Err(e) => Capture::Off(format!("the capture failed: {}", e.0)),
            };
        }
        if let Capture::Ready(g) = &self.capture {
            // SAFETY: the graph addresses this session's buffers, alive as long as it is.
            unsafe { self.exec.device().replay(g) }.map_err(dev)?;
            self.replaying = true;
            return Ok(());
        }
        self.exec.queue_calls()?;
        if weight == 0.0 {
            let (d, n) = (self.exec.device(), self.exec.graph().num_param_elems());
            let out = self.exec.grad_address();
            let zero = ew::Fill { dtype: DType::F32, out, n, value: 0.0, scaled_by: None };
            // SAFETY: the gradient buffer holds at least n f32.
            unsafe { zero.launch(Device::of(d)).run(d) }.map_err(dev)?;
        }
        Ok(())
    }

    fn reduce_grads(&mut self, group: &C, how: Reduction) -> Result<(), StepError> {
        let (d, grads) = (self.exec.device(), self.exec.grad_address());
        let n = self.exec.graph().num_param_elems();
        // SAFETY: the gradient buffer holds n (DDP) or world·k (ZeRO-1) f32.
        unsafe {
            match how {
                Reduction::AllReduce => {
                    group.all_reduce_on(d, grads, n, ElementKind::F32, ReduceOp::Sum)?
                }
                Reduction::ReduceScatter { chunk } => {
                    group.reduce_scatter_on(d, grads, chunk, ElementKind::F32, ReduceOp::Sum)?
                }
            }
        }
        Ok(())
    }

    fn grad_sumsq(&mut self) -> Result<(), StepError> {
        if self.replaying {
            return Ok(());
        }
        self.queue_grad_sumsq().map_err(dev)?;
        Ok(())
    }

    fn reduce_grad_sumsq(&mut self, group: &C) -> Result<(), StepError> {
        let d = self.exec.device();
        // The partials added over the ranks give the global sum of squares (and carry any
        // inf/NaN to every rank): every rank has the same number of them.
        // SAFETY: the partials buffer holds `parts` f32.
        unsafe {
            let partials = d.address(&self.partials);
            group.all_reduce_on(d, partials, self.parts as usize, ElementKind::F32, ReduceOp::Sum)
        }?;
        Ok(())
    }

    fn grad_stats(&mut self) -> Result<(), StepError> {
        if self.replaying {
            return Ok(());
        }
        self.queue_grad_stats().map_err(dev)?;
        Ok(())
    }

    fn adamw_update(&mut self) -> Result<(), StepError> {
        if self.replaying {
            return Ok(());
        }
        self.queue_adamw().map_err(dev)?;
        Ok(())
    }

    fn gather_params(&mut self, group: &C, chunk: usize) -> Result<(), StepError> {
        let (d, params) = (self.exec.device(), self.exec.param_address());
        let n = self.exec.graph().num_param_elems();
        // Every rank's updated chunk into every rank's parameters (a skipped step gathers the
        // unchanged ones: the host does not know it was skipped), then the compute copy the
        // next forward reads.
        // SAFETY: the parameter buffer holds world·k f32, the compute copy n of its dtype.
        unsafe {
            group.all_gather_on(d, params, chunk, ElementKind::F32)?;
            if let Some(out) = self.exec.compute_address() {
                let to = self.exec.graph().dtype();
                let cast = ew::Cast { from: DType::F32, to, out, x: params, n };
                cast.launch(Device::of(d)).run(d).map_err(dev)?;
            }
        }
        Ok(())
    }

    fn finish(&mut self, inputs: &Inputs<'_>) -> Result<Finished, StepError> {
        self.replaying = false;
        let s = self.exec.finish_step(inputs)?;
        self.warm = true;
        let finite = s[status::STATS + 1] != 0.0;
        // Updates applied: a skipped step does not count (the CPU's `AdamW::update` likewise).
        if finite {
            self.step += 1;
        }
        Ok(Finished { loss: s[status::LOSS], grad_norm: s[status::STATS], finite })
    }
}
