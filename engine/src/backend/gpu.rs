//! The seam between the GPU executor and a GPU: what the executor needs of a device, whatever
//! its vendor — memory by address, the engine's kernels by name, GEMMs, a synchronise.
//!
//! Why a trait and not candle's enum alone: the same executor (`exec::gpu`) must run on a real
//! GPU (`backend::cuda`, later `backend::hip`) and, in CI where there is no GPU, on the host
//! SIMT harness (`engine/kernels/simt`) with a host GEMM — so that the device path, not only
//! each kernel, is executed and checked against the CPU engine on every run
//! (`tests/tests/gpu_executor.rs`). Device memory is addressed by `u64` as the driver APIs do
//! (`CUdeviceptr`, `hipDeviceptr_t`); a host device's addresses are host pointers.
//!
//! Launch arguments ([`KernelArg`]) and GEMM shapes ([`GemmShape`]) are plain data shared by
//! every device: the executor resolves them once when it is built.

/// What went wrong on a device (its driver's message, with what was being done).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct GpuError(pub String);

/// A GPU, as the executor drives it. Every call is queued in order on one stream; only
/// [`GpuDevice::download`] and [`GpuDevice::synchronize`] wait for the device.
pub trait GpuDevice {
    /// Device memory, freed on drop.
    type Buffer;
    /// Page-locked host memory ([`GpuDevice::alloc_pinned`]), freed on drop: what an
    /// asynchronous copy reads from.
    type Pinned: std::ops::DerefMut<Target = [u8]>;
    /// Queued work captured once and replayed ([`GpuDevice::capture_end`]).
    type Graph;

    /// The device for messages ("NVIDIA H100 80GB HBM3 (sm_90)").
    fn describe(&self) -> String;
    /// Threads per warp (wavefront) the kernels were built for: 32 on NVIDIA, 64 on AMD CDNA.
    fn warp_size(&self) -> u32;
    /// Blocks that fill the device for a grid-stride kernel (more only add scheduling).
    fn max_blocks(&self) -> u32;
    /// Dynamic shared memory one block may use, bytes (after any opt-in).
    fn max_shared_bytes(&self) -> u32;
    /// Whether the tensor-core kernels (`engine/kernels/*_mma.cu`: `mma.sync` m16n8k16 with
    /// f16/bf16 operands, `ldmatrix`) run here: NVIDIA sm_80 and later.
    fn has_mma(&self) -> bool {
        false
    }
    /// `bytes` of zeroed device memory.
    fn alloc_zeroed(&self, bytes: usize) -> Result<Self::Buffer, GpuError>;
    /// The device address of a buffer.
    fn address(&self, buf: &Self::Buffer) -> u64;
    /// Copies host bytes to device address `dst`, after the work queued before.
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies inside one live buffer of this device.
    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<(), GpuError>;
    /// Copies device bytes at `src` to the host once the work queued before has finished.
    ///
    /// # Safety
    /// `src .. src + dst.len()` lies inside one live buffer of this device.
    unsafe fn download(&self, src: u64, dst: &mut [u8]) -> Result<(), GpuError>;
    /// Queues kernel `name` (an `ORT_KERNEL` of `engine/kernels`) on a 1-D grid.
    ///
    /// # Safety
    /// `args` match the kernel's C signature; every pointer addresses live device memory as
    /// large as the kernel touches at this grid.
    unsafe fn launch(
        &self,
        name: &str,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        args: &[KernelArg],
    ) -> Result<(), GpuError>;
    /// Queues C = op(A)·op(B) (+ the shape's epilogue), row-major (see [`GemmShape`]).
    ///
    /// # Safety
    /// The pointers address live device memory large enough for the shape.
    unsafe fn gemm(&self, shape: &GemmShape, ptrs: &GemmPtrs) -> Result<(), GpuError>;
    /// Waits for everything queued.
    fn synchronize(&self) -> Result<(), GpuError>;

    /// `bytes` of zeroed page-locked host memory.
    fn alloc_pinned(&self, bytes: usize) -> Result<Self::Pinned, GpuError>;
    /// Queues a copy of `src` (page-locked) to device address `dst`, after the work queued
    /// before, without waiting: the bytes are read when the copy runs, so the host leaves
    /// them unchanged until a later wait for the device.
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies inside one live buffer of this device, and `src` outlives
    /// the copy.
    unsafe fn upload_pinned(&self, dst: u64, src: &Self::Pinned) -> Result<(), GpuError>;
    /// Starts capturing: the launches and GEMMs queued until [`GpuDevice::capture_end`] are
    /// recorded, not run (CUDA stream capture). Nothing in between may wait for the device or
    /// copy from pageable memory; the device refuses it.
    fn capture_begin(&self) -> Result<(), GpuError>;
    /// Ends the capture: what was queued since [`GpuDevice::capture_begin`], ready to replay.
    /// A capture that failed on the way is ended and its error returned.
    fn capture_end(&self) -> Result<Self::Graph, GpuError>;
    /// Queues the captured work once more, with the arguments it was captured with: whatever
    /// changes between replays is read from device memory.
    ///
    /// # Safety
    /// Every buffer the graph addresses is still alive.
    unsafe fn replay(&self, graph: &Self::Graph) -> Result<(), GpuError>;
}

/// One scalar or pointer argument of a kernel, as the kernel's C signature declares it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A device pointer (`T*`).
    Ptr(u64),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
}

impl KernelArg {
    /// The argument's bytes, 8-aligned storage for `cuLaunchKernel`'s parameter array.
    pub fn word(&self) -> u64 {
        match *self {
            KernelArg::Ptr(p) | KernelArg::U64(p) => p,
            KernelArg::I64(v) => v as u64,
            KernelArg::I32(v) => v as u32 as u64,
            KernelArg::U32(v) => v as u64,
            KernelArg::F32(v) => v.to_bits() as u64,
        }
    }
}

/// Element type of A, B, C (and the bias).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmDtype {
    F32 { tf32: bool },
    F16,
    BF16,
}

/// What cuBLASLt does after the product (`cublasLtEpilogue_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    None,
    /// C += bias (per output feature).
    Bias,
    /// pre = product + bias → aux; C = gelu(pre) (tanh GELU: cuBLASLt's only GELU).
    BiasGeluAux,
    /// C = product ∘ gelu'(aux) (the backward of BiasGeluAux's GELU).
    DGelu,
    /// C = product, and bias = column sums of the B operand (cuBLAS's B: the engine's A, i.e.
    /// the bias gradient Σ_rows dY when A = dYᵀ).
    BGradB,
    /// C += product (β = 1, no epilogue op): a sum over several GEMMs into one f32 C, e.g.
    /// the linear cross-entropy's dW chunk after chunk (cuBLASLt's default epilogue, β = 1).
    Accumulate,
}

/// A row-major, possibly batched GEMM: C[b] (m×n) = α·op(A[b]) (m×k) · op(B[b]) (k×n) + β·C[b].
/// Leading dimensions are row strides in elements; batch strides in elements (0: shared).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmShape {
    pub dtype: GemmDtype,
    pub ta: bool,
    pub tb: bool,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub lda: i64,
    pub ldb: i64,
    pub ldc: i64,
    pub batch: i32,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
    pub epilogue: Epilogue,
    /// C in f32 whatever A and B are: a parameter's gradient (f32) from f16/bf16 activations
    /// (cuBLASLt: A/B 16F or 16BF, C/D 32F, compute 32F).
    pub c_f32: bool,
}

/// Per-call pointers (device addresses). `bias`/`aux` only for the epilogues that use them.
#[derive(Clone, Copy, Debug, Default)]
pub struct GemmPtrs {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub bias: u64,
    pub aux: u64,
}

/// The byte alignment every batch of each operand of one GEMM call is guaranteed — what
/// cuBLASLt's `MIN_ALIGNMENT_{A,B,C,D}_BYTES` preferences tell its heuristic, which otherwise
/// assumes 256-byte-aligned operands and may pick a kernel whose vector loads fault (or report
/// NOT_SUPPORTED) on a pointer ≡ 4 mod 16. As PyTorch's `_getAlignment` (its PR 98975), from
/// the pointers; for a strided batch also from the batch stride in bytes. The engine's row
/// strides (leading dimensions) are in the matrix layouts, which the heuristic reads itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmAlign {
    pub a: u32,
    pub b: u32,
    /// C and D (the same buffer: C is read when β ≠ 0).
    pub c: u32,
}

/// The largest power of two dividing `addr`, capped at 256 (cuBLASLt's largest requirement).
pub fn address_alignment(addr: u64) -> u32 {
    if addr == 0 {
        256
    } else {
        1u32 << addr.trailing_zeros().min(8)
    }
}

impl GemmAlign {
    pub fn of(s: &GemmShape, p: &GemmPtrs) -> GemmAlign {
        let es = |d: GemmDtype| match d {
            GemmDtype::F32 { .. } => 4u64,
            GemmDtype::F16 | GemmDtype::BF16 => 2,
        };
        let c_es = if s.c_f32 { 4 } else { es(s.dtype) };
        let one = |ptr: u64, stride: i64, es: u64| {
            let a = address_alignment(ptr);
            if s.batch > 1 {
                a.min(address_alignment(stride.unsigned_abs() * es))
            } else {
                a
            }
        };
        GemmAlign {
            a: one(p.a, s.stride_a, es(s.dtype)),
            b: one(p.b, s.stride_b, es(s.dtype)),
            c: one(p.c, s.stride_c, c_es),
        }
    }
}
