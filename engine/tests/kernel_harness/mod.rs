//! What every GPU-kernel test shares: where kernels run, buffers, random inputs, tolerances.
//!
//! A test launches `engine/kernels/*.cu` kernels through their typed launchers
//! (`ortbench_engine::exec::gpu::launch`, the GPU executor's) with [`Dev::run`] on each of
//! [`devices`], at [`Dev::geometry`]: by default the host SIMT harness at warp sizes 32 and 64, threads taking turns
//! forward, in reverse and greedily (early warps racing ahead): a missing barrier shows in
//! one; with `ORTBENCH_KERNEL_DEVICE=cuda` (scripts/gpu-validate) the GPU instead. Outputs are
//! compared with the engine's CPU kernels on random, never-zero inputs rounded to the storage
//! dtype.
#![allow(dead_code)]

use ortbench_engine::exec::gpu::launch::{self, Launch};
use ortbench_engine::DType;
use ortbench_simt::{Buf, Dtype, Order};

#[allow(unused_imports)]
pub use ortbench_simt::Dtype as D;

/// Where a kernel runs.
#[derive(Clone, Copy)]
pub enum Dev {
    Simt {
        warp: u32,
        order: Order,
    },
    #[cfg(feature = "cuda")]
    Cuda(&'static ortbench_engine::backend::cuda::device::CudaDevice),
}

impl std::fmt::Display for Dev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dev::Simt { warp, order } => write!(f, "simt warp {warp} {order:?}"),
            #[cfg(feature = "cuda")]
            Dev::Cuda(d) => write!(f, "cuda {}", d.name()),
        }
    }
}

/// The devices every kernel test runs on (see the module comment).
pub fn devices() -> Vec<Dev> {
    match std::env::var("ORTBENCH_KERNEL_DEVICE").as_deref() {
        Ok("cuda") => cuda_devices(),
        Ok("simt") | Err(_) => {
            let mut v = Vec::new();
            for warp in [32, 64] {
                for order in [Order::Forward, Order::Reverse, Order::Greedy] {
                    v.push(Dev::Simt { warp, order });
                }
            }
            v
        }
        Ok(other) => panic!("ORTBENCH_KERNEL_DEVICE={other}: expected simt or cuda"),
    }
}

/// Whether the executor-level tests (whole graphs through `GpuExecutor`) run on the GPU:
/// `ORTBENCH_KERNEL_DEVICE=cuda`, as [`devices`] reads it.
pub fn on_gpu() -> bool {
    match std::env::var("ORTBENCH_KERNEL_DEVICE").as_deref() {
        Ok("cuda") => true,
        Ok("simt") | Err(_) => false,
        Ok(other) => panic!("ORTBENCH_KERNEL_DEVICE={other}: expected simt or cuda"),
    }
}

/// GPU 0 as the GPU executor drives it (kernels and cuBLASLt), or the one-line reason there is
/// none, as a panic (never a pass).
#[cfg(feature = "cuda")]
pub fn cuda_gpu() -> ortbench_engine::backend::cuda::gpu::CudaGpu {
    ortbench_engine::backend::cuda::gpu::CudaGpu::open(0)
        .unwrap_or_else(|e| panic!("ORTBENCH_KERNEL_DEVICE=cuda: {e}"))
}
#[cfg(not(feature = "cuda"))]
pub fn cuda_gpu() -> ortbench_engine::backend::simt_device::SimtGpu {
    panic!("ORTBENCH_KERNEL_DEVICE=cuda: the engine was built without its `cuda` feature")
}

#[cfg(feature = "cuda")]
fn cuda_devices() -> Vec<Dev> {
    use std::sync::OnceLock;
    static DEV: OnceLock<ortbench_engine::backend::cuda::device::CudaDevice> = OnceLock::new();
    let d = DEV.get_or_init(|| {
        ortbench_engine::backend::cuda::open(0)
            .unwrap_or_else(|e| panic!("ORTBENCH_KERNEL_DEVICE=cuda: {e}"))
    });
    vec![Dev::Cuda(d)]
}
#[cfg(not(feature = "cuda"))]
fn cuda_devices() -> Vec<Dev> {
    panic!("ORTBENCH_KERNEL_DEVICE=cuda: the engine was built without its `cuda` feature")
}

impl Dev {
    /// The geometry the typed launchers (`ortbench_engine::exec::gpu::launch`) size grids for:
    /// the device's warp, and on the SIMT harness a largest grid of 3 blocks, so that every
    /// grid-stride loop takes several turns at the tests' sizes (a GPU: 1024 blocks, one pass
    /// over the tests' sizes; a grid-stride kernel is correct at any grid); 48 KiB of shared
    /// memory (the attention test sets its own per case, to reach each tile size).
    pub fn geometry(&self) -> launch::Device {
        match self {
            Dev::Simt { warp, .. } => {
                // Tensor cores at warp 32, where the harness emulates mma.sync.
                launch::Device { warp: *warp, max_blocks: 3, max_smem: 48 * 1024, mma: *warp == 32 }
            }
            #[cfg(feature = "cuda")]
            // The GPUs scripts/gpu-validate runs on (H100/H200) have tensor cores.
            Dev::Cuda(_) => {
                launch::Device { warp: 32, max_blocks: 1024, max_smem: 48 * 1024, mma: true }
            }
        }
    }

    /// Runs a typed launcher's launch — the executor's kernel name, geometry and argument
    /// order — on this device's buffers, one buffer per operand; the buffers are read back
    /// (and their guard bands checked) afterwards.
    pub fn run(&self, l: Launch<&mut Buf>) -> Result<(), String> {
        let mut bufs: Vec<&mut Buf> = Vec::new();
        let l = l.map(|b| {
            bufs.push(b);
            bufs.len() - 1
        });
        self.run_on(l, &mut bufs)
    }

    /// As [`Dev::run`], with operands as indices into `bufs`: an index may come twice, so a
    /// kernel's in-place case (an output over an input, as the planner runs it) runs too.
    pub fn run_on(&self, l: Launch<usize>, bufs: &mut [&mut Buf]) -> Result<(), String> {
        match self {
            Dev::Simt { warp, order } => {
                let ptrs: Vec<ortbench_simt::Arg> = bufs.iter_mut().map(|b| b.ptr()).collect();
                let raw: Vec<ortbench_simt::Arg> = l
                    .args
                    .iter()
                    .map(|a| match *a {
                        launch::Arg::Ptr(i) => ptrs[i],
                        launch::Arg::Null => Buf::null(),
                        launch::Arg::I32(v) => ortbench_simt::Arg::I32(v),
                        launch::Arg::U32(v) => ortbench_simt::Arg::U32(v),
                        launch::Arg::I64(v) => ortbench_simt::Arg::I64(v),
                        launch::Arg::U64(v) => ortbench_simt::Arg::U64(v),
                        launch::Arg::F32(v) => ortbench_simt::Arg::F32(v),
                    })
                    .collect();
                // SAFETY: each test sizes its buffers for the kernel's contract; guards catch
                // small overruns below.
                unsafe {
                    ortbench_simt::launch(
                        &l.name,
                        (l.grid, 1, 1),
                        (l.block, 1, 1),
                        l.smem,
                        *warp,
                        *order,
                        &raw,
                    )
                }?;
            }
            #[cfg(feature = "cuda")]
            Dev::Cuda(d) => cuda_run(d, &l, bufs)?,
        }
        for b in bufs.iter() {
            b.check_guards().map_err(|e| format!("{} on {self}: {e}", l.name))?;
        }
        Ok(())
    }
}

#[cfg(feature = "cuda")]
fn cuda_run(
    d: &ortbench_engine::backend::cuda::device::CudaDevice,
    l: &Launch<usize>,
    bufs: &mut [&mut Buf],
) -> Result<(), String> {
    use ortbench_engine::backend::cuda::device::KernelArg;
    // Mirror every buffer, guard bands included, so an overrun on the device shows too.
    let mut mirrors = Vec::new();
    for b in bufs.iter() {
        let m = d.alloc(b.raw_bytes().len()).map_err(|e| e.to_string())?;
        d.upload(&m, b.raw_bytes()).map_err(|e| e.to_string())?;
        mirrors.push(m);
    }
    let kargs: Vec<KernelArg> = l
        .args
        .iter()
        .map(|a| match *a {
            launch::Arg::Ptr(i) => KernelArg::Ptr(mirrors[i].ptr() + bufs[i].front() as u64),
            launch::Arg::Null => KernelArg::Ptr(0),
            launch::Arg::I32(v) => KernelArg::I32(v),
            launch::Arg::U32(v) => KernelArg::U32(v),
            launch::Arg::I64(v) => KernelArg::I64(v),
            launch::Arg::U64(v) => KernelArg::U64(v),
            launch::Arg::F32(v) => KernelArg::F32(v),
        })
        .collect();
    // SAFETY: as for the SIMT launch; the mirrors outlive the synchronise below.
    unsafe { d.launch(&l.name, (l.grid, 1, 1), (l.block, 1, 1), l.smem, &kargs) }
        .map_err(|e| e.to_string())?;
    d.synchronize().map_err(|e| e.to_string())?;
    for (b, m) in bufs.iter_mut().zip(&mirrors) {
        d.download(m, b.raw_bytes_mut()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The engine's name for a storage dtype (the typed launchers take it).
/// A step block ([`StepBlock`]) in a buffer, for the kernels' step-block path.
pub fn step_block(b: &ortbench_engine::exec::gpu::StepBlock) -> Buf {
    let words: Vec<i64> =
        b.to_bytes().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    Buf::from_i64(&words)
}

pub fn dtype(dt: Dtype) -> DType {
    match dt {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        other => panic!("{other:?} is not a float storage dtype"),
    }
}

/// The storage dtypes every float kernel is tested in.
pub const FLOATS: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::BF16];

/// A deterministic generator (splitmix64), so failures reproduce.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1), never within 1e-3 of zero.
    pub fn val(&mut self) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        if u.abs() < 1e-3 {
            1e-3f32.copysign(u)
        } else {
            u
        }
    }
    /// `n` values in [lo, hi) scaled from [`val`](Self::val), rounded to `dt` so the reference
    /// sees exactly what the kernel reads.
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32, dt: Dtype) -> Vec<f32> {
        (0..n).map(|_| dt.round(lo + (self.val() + 1.0) * 0.5 * (hi - lo))).collect()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// How close a kernel's output must be to the CPU kernel's, element by element:
/// |got − want| ≤ rel·|want| + abs + of_largest·max|want|.
///
/// - `rel`: the f32 computations' difference (summation order, libm vs the CPU kernels'
///   polynomials) plus, for half dtypes, one unit roundoff u: the reference is rounded to the
///   dtype first and both sides round nearly equal f32 values, which may land on neighbouring
///   halfs.
/// - `abs`: a fixed floor where relative rounding stops holding, per dtype ([`floor`]).
/// - `of_largest`: zero unless a test states why its kernel needs it. Where a result is a sum
///   whose terms cancel (a LayerNorm's x − mean, attention's weighted sums of ±V), its error
///   follows the size of the terms, not of the result; such a test sets a term relative to
///   the tensor's largest element and says why. Elsewhere a wrong small element must fail
///   even when larger ones surround it.
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub rel: f32,
    pub abs: f32,
    pub of_largest: f32,
}

/// Unit roundoff of the storage dtype (the spacing of its values at 1): 0 for f32, whose
/// rounding is part of `f32_rel`.
pub fn unit_roundoff(dt: Dtype) -> f32 {
    match dt {
        Dtype::F16 => 1.0 / 1024.0,
        Dtype::BF16 => 1.0 / 128.0,
        _ => 0.0,
    }
}

/// The absolute floor of dtype `dt`: below it a value is no longer stored to a relative
/// precision. f16: 2^-24, the spacing of its subnormals (below 2^-14 one rounding step exceeds
/// u·|x|, so two nearly equal f32 values may round a step apart). f32 and bf16 (f32's exponent
/// range): the smallest normal f32, 2^-126 (a device may flush results below it to zero).
pub fn floor(dt: Dtype) -> f32 {
    match dt {
        Dtype::F16 => 1.0 / (1u32 << 24) as f32,
        _ => f32::MIN_POSITIVE,
    }
}

/// The tolerance for output dtype `dt` when the f32 computations may differ by `f32_rel` of
/// each element: `rel` = f32_rel + u, the dtype's floor, no term of the largest element.
pub fn tol(dt: Dtype, f32_rel: f32) -> Tol {
    Tol { rel: unit_roundoff(dt) + f32_rel, abs: floor(dt), of_largest: 0.0 }
}

/// Panics naming the first element out of tolerance.
pub fn check(what: &str, got: &[f32], want: &[f32], dt: Dtype, t: Tol) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let want_r: Vec<f32> = want.iter().map(|&w| dt.round(w)).collect();
    // An infinite expected value (a fully masked row's LSE) must be met exactly, and does not
    // set the scale of the others' tolerance.
    let scale = want_r.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(&want_r).enumerate() {
        let err = (g - w).abs();
        let bound = t.rel * w.abs() + t.abs + t.of_largest * scale;
        let ok = if w.is_infinite() { g == w } else { err <= bound };
        assert!(
            ok || (g.is_nan() && w.is_nan()),
            "{what}: element {i} = {g}, want {w} (|err| {err:.3e} > {bound:.3e}; tol {t:?}, \
             max|want| {scale})"
        );
    }
}
