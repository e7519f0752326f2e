//! The host SIMT harness (`engine/kernels/simt`, crate `ortbench-simt`) as a [`GpuDevice`]: host
//! memory, the kernels on the harness's fibers at a warp size and thread order, and a plain-loop
//! GEMM — so the GPU executor's whole device path runs without a GPU (the engine's drift check in
//! `step.rs`, `tests/tests/gpu_executor.rs`, `engine/tests/simt_linear_cross_entropy.rs`). With
//! [`SimtGpu::recording`] it also lists every launch and GEMM, and with [`SimtGpu::dry_run`] it
//! runs none of them (`tests/tests/fingerprints.rs`: full-size models' launch fingerprints).
//!
//! Capture is emulated as CUDA's stream capture behaves: between `capture_begin` and
//! `capture_end` launches, GEMMs and pinned copies are recorded with their arguments' values
//! and not run; a wait, a pageable copy or a replay inside a capture is refused and fails the
//! capture; a replay runs the recorded work in order, the pinned copies reading their source
//! as it is then (`tests/tests/captured_step.rs`).
//!
//! Compiled for the engine's unit tests and under the `simt` feature (which the `tests` crate
//! and the engine's own integration tests turn on); the `ortbench` binary does not use it.

use std::sync::Mutex;

use ortbench_simt::Arg;
/// The thread orders of the harness (re-exported: users of [`SimtGpu`] need no other crate).
pub use ortbench_simt::Order;

use crate::backend::gpu::{
    Epilogue, GemmDtype, GemmPtrs, GemmShape, GpuDevice, GpuError, KernelArg,
};
use crate::collective::HostMemory;
use crate::ops::gelu::{gelu_backward, gelu_forward, GeluApprox};

/// The host SIMT harness as a GPU (see the module comment).
pub struct SimtGpu {
    warp: u32,
    order: Order,
    max_blocks: u32,
    max_shared_bytes: u32,
    /// Each launch and GEMM, one line each, when recording.
    trace: Option<Mutex<Vec<String>>>,
    /// Run the kernels and GEMMs (false: only record them).
    execute: bool,
    /// Offer the tensor-core kernels (at warp 32: the harness emulates mma.sync there only).
    mma: bool,
    /// While capturing: the work queued so far, or why the capture failed (a wait or a
    /// pageable copy inside it, as CUDA refuses them and invalidates the capture).
    capture: Mutex<Option<Result<Vec<Work>, GpuError>>>,
}

/// One queued operation, as a capture holds it: a kernel with its arguments' values at
/// capture, a GEMM, or a copy that reads its page-locked source when it runs.
#[derive(Clone, Debug)]
pub enum Work {
    Launch { name: String, grid: u32, block: u32, smem: u32, args: Vec<KernelArg> },
    Gemm(GemmShape, GemmPtrs),
    Copy { dst: u64, src: u64, len: usize },
}

/// A captured step ([`GpuDevice::capture_end`]): its work in queue order.
pub struct SimtGraph(pub Vec<Work>);

/// Page-locked memory on a host device: plain host memory.
pub struct HostPinned(Box<[u8]>);

impl std::ops::Deref for HostPinned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}
impl std::ops::DerefMut for HostPinned {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// Zeroed host memory, 16-byte aligned (as device allocations are at least).
pub struct HostBuf(Box<[u128]>);

impl SimtGpu {
    /// Kernels at `warp` (32 or 64) with threads taking turns in `order`; 4 blocks at most (the
    /// harness runs them one after another, so grid-stride loops take several turns) and 16 KiB
    /// of shared memory (attention gets tiles smaller than a short sequence).
    pub fn new(warp: u32, order: Order) -> Self {
        SimtGpu {
            warp,
            order,
            max_blocks: 4,
            max_shared_bytes: 16 * 1024,
            trace: None,
            execute: true,
            mma: true,
            capture: Mutex::new(None),
        }
    }

    /// Not a tensor-core device ([`GpuDevice::has_mma`] false): the kernels of an NVIDIA GPU
    /// before sm_80, e.g. to run the scalar attention in f16/bf16.
    pub fn without_mma(mut self) -> Self {
        self.mma = false;
        self
    }

    /// At most `n` blocks fill the device ([`GpuDevice::max_blocks`]).
    pub fn with_max_blocks(mut self, n: u32) -> Self {
        self.max_blocks = n;
        self
    }

    /// `bytes` of dynamic shared memory per block ([`GpuDevice::max_shared_bytes`]).
    pub fn with_max_shared_bytes(mut self, bytes: u32) -> Self {
        self.max_shared_bytes = bytes;
        self
    }

    /// Records each launch (`kernel grid block shared args`, scalar arguments as `{:?}` of
    /// [`KernelArg`], pointers as `P`) and each GEMM (`gemm {shape:?}`): see [`SimtGpu::take_trace`].
    pub fn recording(mut self) -> Self {
        self.trace = Some(Mutex::new(Vec::new()));
        self
    }

    /// Runs no kernel and no GEMM (memory still works): a recorder of what a step launches.
    pub fn dry_run(mut self) -> Self {
        self.execute = false;
        self
    }

    /// The launches and GEMMs recorded since the last call (empty unless [`SimtGpu::recording`]).
    pub fn take_trace(&self) -> Vec<String> {
        self.trace.as_ref().map(|t| std::mem::take(&mut *t.lock().unwrap())).unwrap_or_default()
    }

    fn record(&self, line: impl FnOnce() -> String) {
        if let Some(t) = &self.trace {
            t.lock().unwrap().push(line());
        }
    }

    /// While capturing, queues `w` in the capture (true); else leaves it to the caller.
    fn captured(&self, w: impl FnOnce() -> Work) -> bool {
        match &mut *self.capture.lock().unwrap() {
            Some(Ok(list)) => {
                list.push(w());
                true
            }
            Some(Err(_)) => true,
            None => false,
        }
    }

    /// Refuses `what` inside a capture, as CUDA does, invalidating the capture.
    fn outside_capture(&self, what: &str) -> Result<(), GpuError> {
        let mut c = self.capture.lock().unwrap();
        match &mut *c {
            None => Ok(()),
            Some(state) => {
                let e = GpuError(format!("{what} inside a captured step (not capturable)"));
                if state.is_ok() {
                    *state = Err(e.clone());
                }
                Err(e)
            }
        }
    }

    /// Runs one operation now.
    unsafe fn run(&self, w: &Work) -> Result<(), GpuError> {
        match w {
            Work::Launch { name, grid, block, smem, args } => {
                if !self.execute {
                    return Ok(());
                }
                let raw: Vec<Arg> = args
                    .iter()
                    .map(|a| match *a {
                        KernelArg::Ptr(p) => Arg::Ptr(p as *mut std::ffi::c_void),
                        KernelArg::I32(v) => Arg::I32(v),
                        KernelArg::U32(v) => Arg::U32(v),
                        KernelArg::I64(v) => Arg::I64(v),
                        KernelArg::U64(v) => Arg::U64(v),
                        KernelArg::F32(v) => Arg::F32(v),
                    })
                    .collect();
                let (g, b) = ((*grid, 1, 1), (*block, 1, 1));
                ortbench_simt::launch(name, g, b, *smem, self.warp, self.order, &raw)
                    .map_err(|e| GpuError(format!("{name}: {e}")))
            }
            Work::Gemm(s, p) if self.execute => host_gemm(s, p),
            Work::Gemm(..) => Ok(()),
            Work::Copy { dst, src, len } => {
                std::ptr::copy_nonoverlapping(*src as *const u8, *dst as *mut u8, *len);
                Ok(())
            }
        }
    }
}

impl GpuDevice for SimtGpu {
    type Buffer = HostBuf;
    type Pinned = HostPinned;
    type Graph = SimtGraph;
    fn describe(&self) -> String {
        let what = if self.execute { "simt" } else { "simt recorder" };
        format!("{what} warp {} {:?}", self.warp, self.order)
    }
    fn warp_size(&self) -> u32 {
        self.warp
    }
    fn max_blocks(&self) -> u32 {
        self.max_blocks
    }
    fn max_shared_bytes(&self) -> u32 {
        self.max_shared_bytes
    }
    fn has_mma(&self) -> bool {
        self.mma && self.warp == 32
    }
    fn alloc_zeroed(&self, bytes: usize) -> Result<HostBuf, GpuError> {
        Ok(HostBuf(vec![0u128; bytes.div_ceil(16).max(1)].into_boxed_slice()))
    }
    fn address(&self, b: &HostBuf) -> u64 {
        b.0.as_ptr() as u64
    }
    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        self.outside_capture("a copy from pageable memory")?;
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len());
        Ok(())
    }
    unsafe fn download(&self, src: u64, dst: &mut [u8]) -> Result<(), GpuError> {
        self.outside_capture("a copy to the host")?;
        std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len());
        Ok(())
    }
    unsafe fn launch(
        &self,
        name: &str,
        grid: u32,
        block: u32,
        smem: u32,
        args: &[KernelArg],
    ) -> Result<(), GpuError> {
        self.record(|| {
            let a: Vec<String> = args
                .iter()
                .map(|a| match a {
                    KernelArg::Ptr(_) => "P".to_string(),
                    o => format!("{o:?}"),
                })
                .collect();
            format!("{name} {grid} {block} {smem} {}", a.join(","))
        });
        let w = || Work::Launch { name: name.to_string(), grid, block, smem, args: args.to_vec() };
        if self.captured(w) {
            return Ok(());
        }
        self.run(&w())
    }
    unsafe fn gemm(&self, s: &GemmShape, p: &GemmPtrs) -> Result<(), GpuError> {
        self.record(|| format!("gemm {s:?}"));
        if self.captured(|| Work::Gemm(*s, *p)) {
            return Ok(());
        }
        self.run(&Work::Gemm(*s, *p))
    }
    fn synchronize(&self) -> Result<(), GpuError> {
        self.outside_capture("a wait for the device")
    }
    fn alloc_pinned(&self, bytes: usize) -> Result<HostPinned, GpuError> {
        Ok(HostPinned(vec![0u8; bytes].into_boxed_slice()))
    }
    unsafe fn upload_pinned(&self, dst: u64, src: &HostPinned) -> Result<(), GpuError> {
        let w = || Work::Copy { dst, src: src.as_ptr() as u64, len: src.len() };
        self.record(|| format!("upload_pinned {}", src.len()));
        if self.captured(w) {
            return Ok(());
        }
        self.run(&w())
    }
    fn capture_begin(&self) -> Result<(), GpuError> {
        let mut c = self.capture.lock().unwrap();
        if c.is_some() {
            return Err(GpuError("a capture inside a capture".into()));
        }
        *c = Some(Ok(Vec::new()));
        Ok(())
    }
    fn capture_end(&self) -> Result<SimtGraph, GpuError> {
        match self.capture.lock().unwrap().take() {
            Some(Ok(work)) => Ok(SimtGraph(work)),
            Some(Err(e)) => Err(e),
            None => Err(GpuError("capture_end without capture_begin".into())),
        }
    }
    unsafe fn replay(&self, g: &SimtGraph) -> Result<(), GpuError> {
        self.record(|| format!("replay {}", g.0.len()));
        self.outside_capture("a replay")?;
        g.0.iter().try_for_each(|w| self.run(w))
    }
}

/// Row-major C[b] (+)= op(A[b])·op(B[b]) in plain loops: f32 accumulation (cuBLAS's
/// CUBLAS_COMPUTE_32F), A and B in the shape's dtype, C in it or in f32; β = 1 for
/// `Epilogue::Accumulate` (as cuBLASLt); `Bias` adds the bias (C's dtype, per column) to
/// the f32 accumulator, `BiasGeluAux` stores that pre-activation as aux (C's dtype and
/// layout) and C = its tanh GELU computed in f32; `DGelu` multiplies the f32 product by the
/// tanh GELU's derivative at aux (C's dtype and layout) — the epilogues the executor chooses
/// (`exec/gpu/launch/gemm.rs`). `BGradB` is not implemented (not chosen).
unsafe fn host_gemm(s: &GemmShape, p: &GemmPtrs) -> Result<(), GpuError> {
    let acc0 = match s.epilogue {
        Epilogue::None | Epilogue::Bias | Epilogue::BiasGeluAux | Epilogue::DGelu => false,
        Epilogue::Accumulate => true,
        e => return Err(GpuError(format!("the host GEMM has no {e:?} epilogue"))),
    };
    let bias = matches!(s.epilogue, Epilogue::Bias | Epilogue::BiasGeluAux);
    let ab = s.dtype;
    let cd = if s.c_f32 { GemmDtype::F32 { tf32: false } } else { ab };
    let ld = |base: u64, i: i64, d: GemmDtype| -> f32 {
        match d {
            GemmDtype::F32 { .. } => *(base as *const f32).offset(i as isize),
            GemmDtype::F16 => {
                half::f16::from_bits(*(base as *const u16).offset(i as isize)).to_f32()
            }
            GemmDtype::BF16 => {
                half::bf16::from_bits(*(base as *const u16).offset(i as isize)).to_f32()
            }
        }
    };
    let st = |base: u64, i: i64, d: GemmDtype, v: f32| match d {
        GemmDtype::F32 { .. } => *(base as *mut f32).offset(i as isize) = v,
        GemmDtype::F16 => *(base as *mut u16).offset(i as isize) = half::f16::from_f32(v).to_bits(),
        GemmDtype::BF16 => {
            *(base as *mut u16).offset(i as isize) = half::bf16::from_f32(v).to_bits()
        }
    };
    for bi in 0..s.batch as i64 {
        let (oa, ob, oc) = (bi * s.stride_a, bi * s.stride_b, bi * s.stride_c);
        for i in 0..s.m as i64 {
            for j in 0..s.n as i64 {
                let at = oc + i * s.ldc + j;
                let mut acc = if acc0 { ld(p.c, at, cd) } else { 0f32 };
                for k in 0..s.k as i64 {
                    let x = ld(p.a, oa + if s.ta { k * s.lda + i } else { i * s.lda + k }, ab);
                    let y = ld(p.b, ob + if s.tb { j * s.ldb + k } else { k * s.ldb + j }, ab);
                    acc = x.mul_add(y, acc);
                }
                if bias {
                    acc += ld(p.bias, j, cd);
                }
                if s.epilogue == Epilogue::DGelu {
                    let mut dx = [0f32];
                    gelu_backward(&mut dx, &[ld(p.aux, at, cd)], &[acc], GeluApprox::Tanh);
                    acc = dx[0];
                }
                if s.epilogue == Epilogue::BiasGeluAux {
                    st(p.aux, at, cd, acc);
                    let mut y = [0f32];
                    gelu_forward(&mut y, &[acc], GeluApprox::Tanh);
                    acc = y[0];
                }
                st(p.c, at, cd, acc);
            }
        }
    }
    Ok(())
}

/// Its "device memory" is the host's (collectives work on it in place).
impl HostMemory for SimtGpu {}
