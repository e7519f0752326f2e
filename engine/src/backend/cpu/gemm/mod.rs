//! Row-major f32 GEMM for the CPU backend: every matmul of the engine goes through here.
//!
//! Why a layer of its own: the CPU training step is GEMM-bound, so the GEMM library decides the
//! CPU result, and the libraries differ severalfold on the same machine (MKL fastest, OpenBLAS
//! slowest; figures: docs/measurements.md). Three providers, one chosen once (at first use) for
//! the whole process:
//!
//! - `mkl`: Intel MKL's single dynamic library `libmkl_rt`, loaded at run time with libloading,
//!   so the crate builds and runs on machines without it. Searched in this order:
//!   `$ORTBENCH_MKL_LIB` (a file, or a folder holding `libmkl_rt.so.N`), `$VIRTUAL_ENV/lib`, the
//!   project venv `<workspace>/.venv/lib` (the PyPI `mkl` wheel installs its `.so` files there),
//!   then the bare names through the system loader (`LD_LIBRARY_PATH`, ldconfig). Both
//!   `libmkl_rt.so.3` (MKL 2026.x wheels) and `libmkl_rt.so.2` (2021–2025) are accepted.
//! - `gemm`: the pure-Rust `gemm` crate, parallel on Rayon: always available.
//! - `reference`: a naive triple loop accumulating in f64; what the tests compare against.
//!
//! `ORTBENCH_GEMM=mkl|gemm|reference` forces a provider. Unset, MKL is used when it loads and
//! the `gemm` crate otherwise. Forcing `mkl` (or naming a library in `ORTBENCH_MKL_LIB`) when it
//! cannot be loaded is an error listing what was searched, never a silent fallback.
//! [`provider`] says which one is active, so reports can say which GEMM ran.
//!
//! Errors: bad shapes, leading dimensions and slice lengths are returned as [`GemmError`], never
//! panics, because they come from model configs and the batch/sequence sizes a user picks
//! (DESIGN: no panic on anything a user controls). The checks are O(1) per call.
//!
//! Threads: [`set_num_threads`] (default: `available_parallelism`). MKL's count is process-wide
//! (`MKL_Set_Num_Threads`); the `gemm` crate splits work into that many Rayon tasks on the
//! global Rayon pool.
//!
//! MKL's OpenMP threading layer is the one pitfall (measured, see `mkl::choose_threading`):
//! `libmkl_rt` picks its layer at the first call, and if GNU OpenMP (`libgomp`, e.g. pulled in by
//! libtorch) is already in the process, the Intel layer silently runs on one thread because
//! `libgomp`'s `omp_*` symbols shadow `libiomp5`'s. We therefore pick the layer explicitly: GNU
//! when `libgomp` is already loaded, otherwise Intel OpenMP with `libiomp5` preloaded by absolute
//! path (`RTLD_GLOBAL`) from the MKL folder, and sequential (reported) when neither is there.
//!
//! Reference: BLAS `?gemm` semantics as in `cblas_sgemm` with `CblasRowMajor`
//! (<https://www.netlib.org/lapack/explore-html/d4/de2/sgemm_8f.html>).

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Whether an operand is used as stored or transposed (`op(X) = X` or `Xᵀ`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transpose {
    No,
    Yes,
}

/// Everything that can go wrong in this module; each message says what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GemmError {
    #[error(
        "sgemm: {name}={ld} is smaller than the {row}-element rows of {operand} as stored \
         (row-major needs {name} >= max(1, columns)); pass the distance between rows"
    )]
    LeadingDim { operand: &'static str, name: &'static str, ld: usize, row: usize },
    #[error(
        "sgemm: {operand} has {len} elements but needs at least {need} \
         ({rows}x{cols} stored with leading dimension {ld}{batch_note}); check the shapes passed"
    )]
    TooShort {
        operand: &'static str,
        len: usize,
        need: usize,
        rows: usize,
        cols: usize,
        ld: usize,
        batch_note: String,
    },
    #[error("sgemm: {what}={value} is too large ({limit}); split the matmul into smaller ones")]
    TooLarge { what: &'static str, value: usize, limit: &'static str },
    #[error(
        "ORTBENCH_GEMM={0:?} is not a GEMM provider: use mkl, gemm or reference \
         (or unset it to use MKL when available and the gemm crate otherwise)"
    )]
    UnknownProvider(String),
    /// `ORTBENCH_CPU_BF16_GEMM` set to a value it does not take (`blas::bf16_gemm_setting`).
    #[error("{0}")]
    Bf16Setting(String),
    #[error(
        "Intel MKL (libmkl_rt) could not be loaded. Searched:\n{searched}\nInstall it with \
         `.venv/bin/pip install mkl`, point ORTBENCH_MKL_LIB at libmkl_rt.so.N, or set \
         ORTBENCH_GEMM=gemm for the pure-Rust GEMM"
    )]
    MklUnavailable { searched: String },
}

/// Which GEMM implementation to use (what `ORTBENCH_GEMM` and `--provider` name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    Mkl,
    Gemm,
    Reference,
}

impl ProviderKind {
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Mkl => "mkl",
            ProviderKind::Gemm => "gemm",
            ProviderKind::Reference => "reference",
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProviderKind {
    type Err = GemmError;
    fn from_str(s: &str) -> Result<Self, GemmError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mkl" => Ok(ProviderKind::Mkl),
            "gemm" => Ok(ProviderKind::Gemm),
            "reference" | "ref" => Ok(ProviderKind::Reference),
            _ => Err(GemmError::UnknownProvider(s.to_string())),
        }
    }
}

/// A loaded GEMM provider. Cheap to copy; MKL's library stays loaded for the whole process.
#[derive(Clone, Copy, Debug)]
pub enum Provider {
    Mkl(&'static mkl::MklLib),
    Gemm,
    Reference,
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Provider::Mkl(lib) => {
                write!(f, "mkl {} ({}, {})", lib.version(), lib.path().display(), lib.threading())
            }
            Provider::Gemm => f.write_str("gemm 0.19 (pure Rust, rayon)"),
            Provider::Reference => f.write_str("reference (naive triple loop, f64 accumulation)"),
        }
    }
}

static ACTIVE: OnceLock<Result<Provider, GemmError>> = OnceLock::new();
static MKL: OnceLock<Result<mkl::MklLib, GemmError>> = OnceLock::new();
/// Requested thread count; 0 means `available_parallelism`.
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// The provider every [`sgemm`] call uses, chosen once from `ORTBENCH_GEMM` (see module docs).
pub fn provider() -> Result<Provider, GemmError> {
    ACTIVE.get_or_init(|| select(std::env::var("ORTBENCH_GEMM").ok().as_deref())).clone()
}

/// Choose the active provider from the value of `ORTBENCH_GEMM`.
fn select(forced: Option<&str>) -> Result<Provider, GemmError> {
    match forced.map(str::trim).filter(|s| !s.is_empty()) {
        Some(name) => Provider::load(name.parse()?),
        None => match Provider::load(ProviderKind::Mkl) {
            Ok(p) => Ok(p),
            // A library named explicitly must load: falling back would hide the mistake.
            Err(e) if std::env::var_os("ORTBENCH_MKL_LIB").is_some() => Err(e),
            Err(_) => Ok(Provider::Gemm),
        },
    }
}

impl Provider {
    /// Load a specific provider (MKL is loaded once per process and cached, failure included).
    pub fn load(kind: ProviderKind) -> Result<Provider, GemmError> {
        match kind {
            ProviderKind::Mkl => MKL
                .get_or_init(|| mkl::MklLib::load(&mkl::candidates()))
                .as_ref()
                .map(Provider::Mkl)
                .map_err(Clone::clone),
            ProviderKind::Gemm => Ok(Provider::Gemm),
            ProviderKind::Reference => Ok(Provider::Reference),
        }
    }

    pub fn kind(&self) -> ProviderKind {
        match self {
            Provider::Mkl(_) => ProviderKind::Mkl,
            Provider::Gemm => ProviderKind::Gemm,
            Provider::Reference => ProviderKind::Reference,
        }
    }

    /// `C = alpha·op(A)·op(B) + beta·C` with this provider; see [`sgemm`] for the arguments.
    #[allow(clippy::too_many_arguments, reason = "BLAS-shaped on purpose: it mirrors cblas_sgemm")]
    pub fn sgemm(
        &self,
        ta: Transpose,
        tb: Transpose,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &[f32], // A: (M, K), or (K, M) when ta = Yes; rows `lda` apart
        lda: usize,
        b: &[f32], // B: (K, N), or (N, K) when tb = Yes; rows `ldb` apart
        ldb: usize,
        beta: f32,
        c: &mut [f32], // C: (M, N); rows `ldc` apart
        ldc: usize,
    ) -> Result<(), GemmError> {
        let call = Call { ta, tb, m, n, k, alpha, lda, ldb, beta, ldc };
        call.validate(a.len(), b.len(), c.len(), 1, [0; 3])?;
        if call.is_scale_only() {
            call.scale_c(c);
            return Ok(());
        }
        self.run(&call, a, b, c);
        Ok(())
    }

    /// Strided batched GEMM with this provider; see [`sgemm_batched`] for the arguments.
    #[allow(
        clippy::too_many_arguments,
        reason = "BLAS-shaped on purpose: cblas_sgemm's arguments and the batch strides"
    )]
    pub fn sgemm_batched(
        &self,
        ta: Transpose,
        tb: Transpose,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &[f32], // A: (batch, M, K), or (batch, K, M) when ta = Yes; matrices `stride_a` apart
        lda: usize,
        b: &[f32], // B: (batch, K, N), or (batch, N, K) when tb = Yes; `stride_b` apart
        ldb: usize,
        beta: f32,
        c: &mut [f32], // C: (batch, M, N); matrices `stride_c` apart
        ldc: usize,
        batch: usize,
        stride_a: usize,
        stride_b: usize,
        stride_c: usize,
    ) -> Result<(), GemmError> {
        let call = Call { ta, tb, m, n, k, alpha, lda, ldb, beta, ldc };
        let strides = [stride_a, stride_b, stride_c];
        call.validate(a.len(), b.len(), c.len(), batch, strides)?;
        if batch == 0 || call.m == 0 || call.n == 0 {
            return Ok(());
        }
        // One strided MKL call parallelises across the batch, which small attention matmuls
        // need; it requires non-overlapping C matrices and 32-bit strides.
        if let Provider::Mkl(lib) = self {
            if !call.is_scale_only() && lib.sgemm_batch_strided(&call, a, b, c, batch, strides) {
                return Ok(());
            }
        }
        for i in 0..batch {
            // In bounds: validate() checked (batch-1)*stride + footprint <= len for each operand.
            let (a_i, b_i) = (&a[i * stride_a..], &b[i * stride_b..]);
            let c_i = &mut c[i * stride_c..];
            if call.is_scale_only() {
                call.scale_c(c_i);
            } else {
                self.run(&call, a_i, b_i, c_i);
            }
        }
        Ok(())
    }

    /// Dispatch a validated, non-degenerate call.
    fn run(&self, call: &Call, a: &[f32], b: &[f32], c: &mut [f32]) {
        match self {
            Provider::Mkl(lib) => lib.sgemm(call, a, b, c),
            Provider::Gemm => rust_gemm::sgemm(call, a, b, c),
            Provider::Reference => reference::sgemm(call, a, b, c),
        }
    }
}

/// `C = alpha·op(A)·op(B) + beta·C` on row-major f32 matrices, like `cblas_sgemm` with
/// `CblasRowMajor`, on the active [`provider`]. `beta = 0` overwrites C (NaNs in C included).
/// Slices may be longer than needed; leading dimensions are the distances between rows.
#[allow(clippy::too_many_arguments, reason = "BLAS-shaped on purpose: it mirrors cblas_sgemm")]
pub fn sgemm(
    ta: Transpose,
    tb: Transpose,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32], // A: (M, K), or (K, M) when ta = Yes; rows `lda` apart
    lda: usize,
    b: &[f32], // B: (K, N), or (N, K) when tb = Yes; rows `ldb` apart
    ldb: usize,
    beta: f32,
    c: &mut [f32], // C: (M, N); rows `ldc` apart
    ldc: usize,
) -> Result<(), GemmError> {
    provider()?.sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

/// Strided batched GEMM on the active [`provider`]: for `i in 0..batch`,
/// `C_i = alpha·op(A_i)·op(B_i) + beta·C_i` where `X_i` starts at `i * stride_x` in `x`.
/// A stride of 0 for A or B broadcasts one matrix over the batch. C matrices may interleave
/// (e.g. heads of a `(B, T, H, D)` tensor); they are then computed one after the other.
#[allow(
    clippy::too_many_arguments,
    reason = "BLAS-shaped on purpose: cblas_sgemm's arguments and the batch strides"
)]
pub fn sgemm_batched(
    ta: Transpose,
    tb: Transpose,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32], // A: (batch, M, K), or (batch, K, M) when ta = Yes; matrices `stride_a` apart
    lda: usize,
    b: &[f32], // B: (batch, K, N), or (batch, N, K) when tb = Yes; matrices `stride_b` apart
    ldb: usize,
    beta: f32,
    c: &mut [f32], // C: (batch, M, N); matrices `stride_c` apart
    ldc: usize,
    batch: usize,
    stride_a: usize,
    stride_b: usize,
    stride_c: usize,
) -> Result<(), GemmError> {
    provider()?.sgemm_batched(
        ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, batch, stride_a, stride_b, stride_c,
    )
}

/// The naive reference (triple loop, f64 accumulation) that tests compare every provider with.
#[allow(clippy::too_many_arguments, reason = "BLAS-shaped on purpose: it mirrors cblas_sgemm")]
pub fn sgemm_reference(
    ta: Transpose,
    tb: Transpose,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32], // A: (M, K), or (K, M) when ta = Yes; rows `lda` apart
    lda: usize,
    b: &[f32], // B: (K, N), or (N, K) when tb = Yes; rows `ldb` apart
    ldb: usize,
    beta: f32,
    c: &mut [f32], // C: (M, N); rows `ldc` apart
    ldc: usize,
) -> Result<(), GemmError> {
    Provider::Reference.sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

/// Set the number of threads GEMMs use (0 = `available_parallelism`). Takes effect at once.
pub fn set_num_threads(n: usize) {
    THREADS.store(n, Ordering::Relaxed);
    if let Some(Ok(lib)) = MKL.get() {
        lib.set_threads(num_threads());
    }
}

/// The number of threads GEMMs use.
/// The thread count last set with [`set_num_threads`] (0: not set, i.e. all cores), to
/// restore it after a temporary change.
pub fn requested_threads() -> usize {
    THREADS.load(Ordering::Relaxed)
}

pub fn num_threads() -> usize {
    match THREADS.load(Ordering::Relaxed) {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// One GEMM call's scalars, shared by the providers.
#[derive(Clone, Copy, Debug)]
struct Call {
    ta: Transpose,
    tb: Transpose,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    lda: usize,
    ldb: usize,
    beta: f32,
    ldc: usize,
}

/// Minimum slice length of `rows` rows of `cols` elements, `ld` apart (`None` on overflow).
fn footprint(rows: usize, cols: usize, ld: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return Some(0);
    }
    (rows - 1).checked_mul(ld)?.checked_add(cols)
}

impl Call {
    /// (rows, cols) of A and B as stored, row-major.
    fn a_stored(&self) -> (usize, usize) {
        match self.ta {
            Transpose::No => (self.m, self.k),
            Transpose::Yes => (self.k, self.m),
        }
    }

    fn b_stored(&self) -> (usize, usize) {
        match self.tb {
            Transpose::No => (self.k, self.n),
            Transpose::Yes => (self.n, self.k),
        }
    }

    /// Check leading dimensions and that every matrix of the batch lies inside its slice.
    fn validate(
        &self,
        a_len: usize,
        b_len: usize,
        c_len: usize,
        batch: usize,
        strides: [usize; 3],
    ) -> Result<(), GemmError> {
        let (ar, ac) = self.a_stored();
        let (br, bc) = self.b_stored();
        let operands = [
            ("A", "lda", ar, ac, self.lda, a_len, strides[0]),
            ("B", "ldb", br, bc, self.ldb, b_len, strides[1]),
            ("C", "ldc", self.m, self.n, self.ldc, c_len, strides[2]),
        ];
        for (operand, name, rows, cols, ld, len, stride) in operands {
            if ld < cols.max(1) {
                return Err(GemmError::LeadingDim { operand, name, ld, row: cols });
            }
            let too_large =
                |what| GemmError::TooLarge { what, value: len, limit: "overflows usize" };
            let one = footprint(rows, cols, ld).ok_or(too_large("matrix footprint"))?;
            let need = if batch == 0 || one == 0 {
                0
            } else {
                (batch - 1)
                    .checked_mul(stride)
                    .and_then(|s| s.checked_add(one))
                    .ok_or(too_large("batch footprint"))?
            };
            if len < need {
                let batch_note = if batch > 1 {
                    format!(", {batch} matrices {stride} apart")
                } else {
                    String::new()
                };
                return Err(GemmError::TooShort { operand, len, need, rows, cols, ld, batch_note });
            }
        }
        Ok(())
    }

    /// With nothing to multiply, GEMM reduces to `C = beta·C` (BLAS quick return).
    fn is_scale_only(&self) -> bool {
        self.k == 0 || self.alpha == 0.0
    }

    /// `C = beta·C`; `beta = 0` writes zeros (BLAS: C is not read, so NaNs are cleared).
    fn scale_c(&self, c: &mut [f32]) {
        // C: (M, N); rows `ldc` apart
        for i in 0..self.m {
            let row = &mut c[i * self.ldc..i * self.ldc + self.n];
            if self.beta == 0.0 {
                row.fill(0.0);
            } else if self.beta != 1.0 {
                row.iter_mut().for_each(|x| *x *= self.beta);
            }
        }
    }
}

/// The naive reference: obviously right, slow, f64 accumulation.
mod reference;

/// The pure-Rust `gemm` crate (<https://github.com/sarah-ek/gemm>): the fallback without MKL.
mod rust_gemm;

/// Intel MKL through `libmkl_rt`, loaded at run time (LP64 interface: 32-bit integers).
pub mod mkl;

#[cfg(test)]
mod tests;
