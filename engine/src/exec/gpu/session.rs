//! A training session on a GPU: the [`GpuExecutor`]'s forward and backward, then the optimizer
//! step in three launches over the flat buffers (engine/kernels/adamw.cu) — all queued, with one
//! read of the status block per step (loss, gradient norm, finite flag).
//!
//! The same contract as the CPU's [`crate::session::TrainSession`]: fp32 master parameters,
//! HF's AdamW with decoupled decay by segment, clipping at the global norm, dynamic loss scaling
//! that skips a step on inf/NaN (the kernel skips itself, the host then does not count the
//! step). `tests/tests/gpu_executor.rs` trains both side by side.

use super::{status, GpuExecutor};
use crate::backend::gpu::{GpuDevice, KernelArg};
use crate::exec::{ExecError, Inputs};
use crate::graph::Graph;
use crate::optim::{AdamWConfig, LossScaler, Segment};
use crate::session::{SessionError, StepStats};
use crate::DType;

/// Blocks of the gradient-norm partials (adamw.cu `grad_sumsq_partial`): fills an H100
/// (132 SMs) several times over; the single-block finish adds them in order.
const NORM_BLOCKS: u32 = 512;

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
    /// Updates applied (skipped steps do not count), as the CPU's `AdamW::step`.
    pub step: u64,
    scaler: Option<LossScaler>,
}

fn dev(e: crate::backend::gpu::GpuError) -> SessionError {
    SessionError::Exec(ExecError::Device(e.0))
}

impl<D: GpuDevice> GpuSession<D> {
    /// Plans `graph` on `dev`, uploads `params` (the graph's flat layout) and zeroes the moments.
    pub fn new(graph: Graph, dev_: D, params: &[f32], segments: Vec<Segment>, cfg: AdamWConfig, precision: DType) -> Result<Self, SessionError> {
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
        let exec = GpuExecutor::new(&graph, dev_)?;
        exec.upload_params(params)?;
        let d = exec.device();
        let m = d.alloc_zeroed(n * 4).map_err(dev)?;
        let v = d.alloc_zeroed(n * 4).map_err(dev)?;
        let starts: Vec<u8> = segments.iter().flat_map(|s| (s.start as i64).to_le_bytes()).collect();
        let decays: Vec<u8> = segments.iter().flat_map(|s| i32::from(s.decay).to_le_bytes()).collect();
        let seg_start = d.alloc_zeroed(starts.len().max(8)).map_err(dev)?;
        let seg_decay = d.alloc_zeroed(decays.len().max(4)).map_err(dev)?;
        // SAFETY: each buffer holds its bytes.
        unsafe {
            d.upload(d.address(&seg_start), &starts).map_err(dev)?;
            d.upload(d.address(&seg_decay), &decays).map_err(dev)?;
        }
        let parts = (n.div_ceil(256) as u32).clamp(1, NORM_BLOCKS);
        let partials = d.alloc_zeroed(parts as usize * 4).map_err(dev)?;
        Ok(GpuSession { exec, cfg, m, v, seg_start, seg_decay, nseg: segments.len(), partials, parts, step: 0, scaler: None })
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

    /// Bytes of optimizer state on the device (both moments, fp32).
    pub fn state_bytes(&self) -> usize {
        2 * 4 * self.exec.graph().num_param_elems()
    }

    /// The fp32 parameters (waits for the device).
    pub fn params(&self) -> Result<Vec<f32>, SessionError> {
        Ok(self.exec.download_params()?)
    }

    /// The last step's gradients, scaled by that step's loss scale (waits for the device).
    pub fn grads(&self) -> Result<Vec<f32>, SessionError> {
        Ok(self.exec.download_grads()?)
    }

    /// One training step at learning rate `lr`; `seed` drives this step's dropout masks.
    pub fn step(&mut self, inputs: &Inputs<'_>, lr: f32, seed: u64) -> Result<StepStats, SessionError> {
        let scale = self.scaler.as_ref().map_or(1.0, LossScaler::scale);
        self.exec.set_loss_scale(scale);
        self.exec.queue_step(inputs, seed)?;
        let n = self.exec.graph().num_param_elems();
        let d = self.exec.device();
        let (grads, params) = (self.exec.grad_address(), self.exec.param_address());
        let stats = self.exec.status_address() + 4 * status::STATS as u64;
        let inv = 1.0 / scale;
        let c = &self.cfg;
        // If this step is applied it is update number step + 1; a skipped one leaves `step`.
        let sc = c.step_scalars(self.step + 1, lr);
        let p = KernelArg::Ptr;
        // SAFETY: every buffer below is this session's or its executor's, of n f32 (moments,
        // parameters, gradients), `parts` partials, nseg segments and the status block.
        unsafe {
            d.launch("grad_sumsq_partial", self.parts, 256, 0, &[p(d.address(&self.partials)), p(grads), KernelArg::I64(n as i64), KernelArg::F32(inv)]).map_err(dev)?;
            d.launch("grad_stats_finish", 1, d.warp_size(), 0, &[p(stats), p(d.address(&self.partials)), KernelArg::I32(self.parts as i32), KernelArg::F32(c.max_grad_norm)]).map_err(dev)?;
            let grid = (n.div_ceil(256) as u64).clamp(1, d.max_blocks() as u64) as u32;
            let args = [
                p(params),
                p(grads),
                p(d.address(&self.m)),
                p(d.address(&self.v)),
                p(self.exec.compute_address().unwrap_or(0)),
                KernelArg::I64(n as i64),
                p(d.address(&self.seg_start)),
                p(d.address(&self.seg_decay)),
                KernelArg::I32(self.nseg as i32),
                p(stats),
                KernelArg::F32(inv),
                KernelArg::F32(c.beta1),
                KernelArg::F32(c.beta2),
                KernelArg::F32(c.eps),
                KernelArg::F32(sc.step_size),
                KernelArg::F32(sc.inv_bc2_sqrt),
                KernelArg::F32(sc.decay_mul),
            ];
            // The compute copy (f16/bf16) is written as the master is updated; none in fp32.
            let name = format!("adamw_step_{}", super::kernels::suffix(self.exec.graph().dtype()));
            d.launch(&name, grid, 256, 0, &args).map_err(dev)?;
        }
        let s = self.exec.finish_step(inputs)?;
        let finite = s[status::STATS + 1] != 0.0;
        if finite {
            self.step += 1;
        }
        let skipped = match self.scaler.as_mut() {
            Some(sc) => sc.update(!finite),
            None => !finite,
        };
        Ok(StepStats { loss: s[status::LOSS], grad_norm: s[status::STATS], loss_scale: scale, skipped })
    }
}
