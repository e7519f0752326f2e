//! Row-major f32 GEMM for the CPU backend: every matmul of the engine goes through here.
//!
//! Why a layer of its own: the CPU training step is GEMM-bound, so the GEMM library decides the
//! CPU result. On the 2-core development machine (fp32 8192x768x3072) Intel MKL reaches
//! ~300+ GFLOP/s, the pure-Rust `gemm` crate ~160, OpenBLAS ~65. Three providers, one chosen
//! once (at first use) for the whole process:
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
use std::time::Instant;

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
    LeadingDim {
        operand: &'static str,
        name: &'static str,
        ld: usize,
        row: usize,
    },
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
    TooLarge {
        what: &'static str,
        value: usize,
        limit: &'static str,
    },
    #[error(
        "ORTBENCH_GEMM={0:?} is not a GEMM provider: use mkl, gemm or reference \
         (or unset it to use MKL when available and the gemm crate otherwise)"
    )]
    UnknownProvider(String),
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
            Provider::Mkl(lib) => write!(
                f,
                "mkl {} ({}, {})",
                lib.version(),
                lib.path().display(),
                lib.threading()
            ),
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
    ACTIVE
        .get_or_init(|| select(std::env::var("ORTBENCH_GEMM").ok().as_deref()))
        .clone()
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
    #[allow(clippy::too_many_arguments)] // BLAS-shaped on purpose: it mirrors cblas_sgemm.
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
        let call = Call {
            ta,
            tb,
            m,
            n,
            k,
            alpha,
            lda,
            ldb,
            beta,
            ldc,
        };
        call.validate(a.len(), b.len(), c.len(), 1, [0; 3])?;
        if call.is_scale_only() {
            call.scale_c(c);
            return Ok(());
        }
        self.run(&call, a, b, c);
        Ok(())
    }

    /// Strided batched GEMM with this provider; see [`sgemm_batched`] for the arguments.
    #[allow(clippy::too_many_arguments)]
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
        let call = Call {
            ta,
            tb,
            m,
            n,
            k,
            alpha,
            lda,
            ldb,
            beta,
            ldc,
        };
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
#[allow(clippy::too_many_arguments)] // BLAS-shaped on purpose: it mirrors cblas_sgemm.
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
#[allow(clippy::too_many_arguments)]
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
#[allow(clippy::too_many_arguments)]
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
pub fn num_threads() -> usize {
    match THREADS.load(Ordering::Relaxed) {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// Time `reps` fp32 `m x n x k` GEMMs (`C = A·B`, no transposes) on `provider` after `warmup`
/// untimed ones; returns GFLOP/s of each timed repetition. Inputs are non-zero and finite.
pub fn time_sgemm(
    provider: Provider,
    m: usize,
    n: usize,
    k: usize,
    warmup: usize,
    reps: usize,
) -> Result<Vec<f64>, GemmError> {
    let fill = |len: usize, seed: usize| -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7 + seed) % 13) as f32 - 6.5) / 8.0)
            .collect()
    };
    let (a, b) = (fill(m * k, 1), fill(k * n, 5)); // A: (M, K), B: (K, N)
    let mut c = vec![0.0f32; m * n]; // C: (M, N)
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let mut gflops = Vec::with_capacity(reps);
    for i in 0..warmup + reps {
        let t = Instant::now();
        provider.sgemm(
            Transpose::No,
            Transpose::No,
            m,
            n,
            k,
            1.0,
            &a,
            k,
            &b,
            n,
            0.0,
            &mut c,
            n,
        )?;
        let s = t.elapsed().as_secs_f64();
        if i >= warmup {
            gflops.push(flops / s.max(1e-9) / 1e9);
        }
    }
    Ok(gflops)
}

/// Best fp32 GEMM throughput (GFLOP/s) of the active provider on `threads` threads (0 = all),
/// measured for about a second on the BERT-sized 8192x768x3072 shape: the denominator of the
/// MFU of CPU runs. The thread setting is restored afterwards. The best repetition rather than
/// the median is taken because noise on a shared machine only ever makes a repetition slower.
pub fn measure_peak_gflops(threads: usize) -> Result<f64, GemmError> {
    let p = provider()?;
    let previous = THREADS.load(Ordering::Relaxed);
    set_num_threads(threads);
    let result = measure_peak_with(p);
    set_num_threads(previous);
    result
}

fn measure_peak_with(p: Provider) -> Result<f64, GemmError> {
    // The reference loop is ~1000x slower: a small shape keeps it near the same second.
    let (m, n, k) = match p {
        Provider::Reference => (128, 128, 128),
        _ => (8192, 768, 3072),
    };
    let start = Instant::now();
    let mut best = time_sgemm(p, m, n, k, 1, 1)?[0];
    let mut reps = 1;
    while reps < 3 || (start.elapsed().as_secs_f64() < 1.0 && reps < 100) {
        best = best.max(time_sgemm(p, m, n, k, 0, 1)?[0]);
        reps += 1;
    }
    Ok(best)
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
                return Err(GemmError::LeadingDim {
                    operand,
                    name,
                    ld,
                    row: cols,
                });
            }
            let too_large = |what| GemmError::TooLarge {
                what,
                value: len,
                limit: "overflows usize",
            };
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
                return Err(GemmError::TooShort {
                    operand,
                    len,
                    need,
                    rows,
                    cols,
                    ld,
                    batch_note,
                });
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
mod reference {
    use super::{Call, Transpose};

    pub(super) fn sgemm(call: &Call, a: &[f32], b: &[f32], c: &mut [f32]) {
        // A: (M, K) or (K, M); B: (K, N) or (N, K); C: (M, N)
        let a_at = |i: usize, p: usize| match call.ta {
            Transpose::No => a[i * call.lda + p],
            Transpose::Yes => a[p * call.lda + i],
        };
        let b_at = |p: usize, j: usize| match call.tb {
            Transpose::No => b[p * call.ldb + j],
            Transpose::Yes => b[j * call.ldb + p],
        };
        for i in 0..call.m {
            for j in 0..call.n {
                let acc: f64 = (0..call.k)
                    .map(|p| a_at(i, p) as f64 * b_at(p, j) as f64)
                    .sum();
                let out = &mut c[i * call.ldc + j];
                let prev = if call.beta == 0.0 {
                    0.0
                } else {
                    call.beta as f64 * *out as f64
                };
                *out = (call.alpha as f64 * acc + prev) as f32;
            }
        }
    }
}

/// The pure-Rust `gemm` crate (<https://github.com/sarah-ek/gemm>): the fallback without MKL.
mod rust_gemm {
    use super::{num_threads, Call, Transpose};

    pub(super) fn sgemm(call: &Call, a: &[f32], b: &[f32], c: &mut [f32]) {
        // Row-major with transposes expressed as (row stride, column stride) pairs.
        let (a_rs, a_cs) = match call.ta {
            Transpose::No => (call.lda as isize, 1),  // A: (M, K)
            Transpose::Yes => (1, call.lda as isize), // A: (K, M)
        };
        let (b_rs, b_cs) = match call.tb {
            Transpose::No => (call.ldb as isize, 1),  // B: (K, N)
            Transpose::Yes => (1, call.ldb as isize), // B: (N, K)
        };
        let threads = num_threads();
        let parallelism = if threads <= 1 {
            gemm::Parallelism::None
        } else {
            gemm::Parallelism::Rayon(threads)
        };
        // SAFETY: `Call::validate` checked that every element the kernel reads (op(A): M x K,
        // op(B): K x N at the strides above) and writes (C: M x N, rows `ldc` apart) lies inside
        // `a`, `b` and `c`; `c` is a unique borrow, so it aliases neither input. The crate's
        // convention is `dst = alpha·dst + beta·lhs·rhs`, hence our beta/alpha in that order;
        // with `read_dst = false` (our beta = 0) C is not read.
        unsafe {
            gemm::gemm(
                call.m,
                call.n,
                call.k,
                c.as_mut_ptr(),
                1,
                call.ldc as isize,
                call.beta != 0.0,
                a.as_ptr(),
                a_cs,
                a_rs,
                b.as_ptr(),
                b_cs,
                b_rs,
                call.beta,
                call.alpha,
                false,
                false,
                false,
                parallelism,
            );
        }
    }
}

/// Intel MKL through `libmkl_rt`, loaded at run time (LP64 interface: 32-bit integers).
pub mod mkl {
    use super::{footprint, num_threads, Call, GemmError, Transpose};
    use libloading::Library;
    use std::ffi::{c_char, c_int, c_void};
    use std::fmt;
    use std::path::{Path, PathBuf};

    const ROW_MAJOR: c_int = 101; // CblasRowMajor
    const NO_TRANS: c_int = 111; // CblasNoTrans
    const TRANS: c_int = 112; // CblasTrans
    const INTERFACE_LP64: c_int = 0; // MKL_INTERFACE_LP64
    const THREADING_INTEL: c_int = 0; // MKL_THREADING_INTEL
    const THREADING_SEQUENTIAL: c_int = 1; // MKL_THREADING_SEQUENTIAL
    const THREADING_GNU: c_int = 3; // MKL_THREADING_GNU

    /// `libmkl_rt` file names, newest first (MKL 2026.x wheels ship `.so.3`, 2021–2025 `.so.2`).
    const NAMES: [&str; 3] = ["libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"];

    // Prototypes from mkl_cblas.h (LP64: MKL_INT = int; enums are C ints).
    type SgemmFn = unsafe extern "C" fn(
        layout: c_int,
        transa: c_int,
        transb: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f32,
        a: *const f32,
        lda: c_int,
        b: *const f32,
        ldb: c_int,
        beta: f32,
        c: *mut f32,
        ldc: c_int,
    );
    type SgemmBatchStridedFn = unsafe extern "C" fn(
        layout: c_int,
        transa: c_int,
        transb: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f32,
        a: *const f32,
        lda: c_int,
        stridea: c_int,
        b: *const f32,
        ldb: c_int,
        strideb: c_int,
        beta: f32,
        c: *mut f32,
        ldc: c_int,
        stridec: c_int,
        batch_size: c_int,
    );
    // Prototypes from mkl_service.h.
    type SetLayerFn = unsafe extern "C" fn(c_int) -> c_int;
    type SetThreadsFn = unsafe extern "C" fn(c_int);
    type VersionFn = unsafe extern "C" fn(*mut c_char, c_int);

    /// A loaded `libmkl_rt` with the entry points we use. Lives in a `static` for the whole
    /// process, so the function pointers never outlive their library.
    pub struct MklLib {
        path: PathBuf,
        version: String,
        threading: String,
        sgemm: SgemmFn,
        sgemm_batch_strided: Option<SgemmBatchStridedFn>,
        set_num_threads: SetThreadsFn,
        _lib: Library,
        _openmp: Option<Library>,
    }

    impl fmt::Debug for MklLib {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("MklLib")
                .field("path", &self.path)
                .field("version", &self.version)
                .field("threading", &self.threading)
                .finish_non_exhaustive()
        }
    }

    /// Where to look for `libmkl_rt`, in order (see the module docs of `gemm`).
    pub fn candidates() -> Vec<PathBuf> {
        if let Some(p) = std::env::var_os("ORTBENCH_MKL_LIB").filter(|p| !p.is_empty()) {
            // Named explicitly: that library or none.
            let p = PathBuf::from(p);
            return if p.is_dir() {
                NAMES.iter().map(|n| p.join(n)).collect()
            } else {
                vec![p]
            };
        }
        let mut dirs = Vec::new();
        if let Some(venv) = std::env::var_os("VIRTUAL_ENV").filter(|v| !v.is_empty()) {
            dirs.push(PathBuf::from(venv).join("lib"));
        }
        // The project venv, found from this crate's source folder at compile time.
        dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/lib"));
        let mut dirs: Vec<PathBuf> = dirs
            .into_iter()
            .map(|d| d.canonicalize().unwrap_or(d))
            .collect();
        dirs.dedup();
        let mut out: Vec<PathBuf> = dirs
            .iter()
            .flat_map(|d| NAMES.iter().map(move |n| d.join(n)))
            .collect();
        out.extend(NAMES.iter().map(PathBuf::from)); // bare names: the system loader's search
        out
    }

    impl MklLib {
        /// Load the first candidate that is a usable `libmkl_rt`, or say what each one lacked.
        pub fn load(candidates: &[PathBuf]) -> Result<MklLib, GemmError> {
            let mut searched = Vec::new();
            for path in candidates {
                if path.components().count() > 1 && !path.exists() {
                    searched.push(format!("  {}: not found", path.display()));
                    continue;
                }
                match Self::open(path) {
                    Ok(lib) => return Ok(lib),
                    Err(why) => searched.push(format!("  {}: {why}", path.display())),
                }
            }
            Err(GemmError::MklUnavailable {
                searched: searched.join("\n"),
            })
        }

        #[cfg(not(unix))]
        fn open(_path: &Path) -> Result<MklLib, String> {
            Err("loading MKL is implemented for Linux/Unix only".into())
        }

        #[cfg(unix)]
        fn open(path: &Path) -> Result<MklLib, String> {
            use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
            // SAFETY: loading runs the library's initialisers; libmkl_rt's only set up its
            // dispatcher state. RTLD_LOCAL keeps its symbols out of the global namespace.
            let lib: Library = unsafe { UnixLibrary::open(Some(path), RTLD_NOW | RTLD_LOCAL) }
                .map_err(|e| dl_error(&e))?
                .into();
            // SAFETY: each symbol is looked up with the C prototype from MKL's headers
            // (mkl_cblas.h, mkl_service.h, LP64: MKL_INT = int); the pointers are copied out and
            // stored next to `lib`, which is never dropped before them.
            let (sgemm, batch, set_interface, set_layer, set_threads, version) = unsafe {
                let get = |name: &[u8]| -> Result<*mut c_void, String> {
                    lib.get::<*mut c_void>(name).map(|s| *s).map_err(|_| {
                        let name = String::from_utf8_lossy(&name[..name.len() - 1]);
                        format!("not an MKL runtime library (no symbol {name})")
                    })
                };
                (
                    std::mem::transmute::<*mut c_void, SgemmFn>(get(b"cblas_sgemm\0")?),
                    get(b"cblas_sgemm_batch_strided\0")
                        .ok()
                        .map(|p| std::mem::transmute::<*mut c_void, SgemmBatchStridedFn>(p)),
                    std::mem::transmute::<*mut c_void, SetLayerFn>(get(
                        b"MKL_Set_Interface_Layer\0",
                    )?),
                    std::mem::transmute::<*mut c_void, SetLayerFn>(get(
                        b"MKL_Set_Threading_Layer\0",
                    )?),
                    std::mem::transmute::<*mut c_void, SetThreadsFn>(get(
                        b"MKL_Set_Num_Threads\0",
                    )?),
                    std::mem::transmute::<*mut c_void, VersionFn>(get(
                        b"MKL_Get_Version_String\0",
                    )?),
                )
            };
            // Both layers must be chosen before any other MKL call, which would fix them.
            // LP64 explicitly: an inherited MKL_INTERFACE_LAYER=ILP64 would make MKL read our
            // 32-bit integers as 64-bit ones.
            // SAFETY: plain C calls with integer arguments, before any other MKL call.
            unsafe { set_interface(INTERFACE_LP64) };
            let (layer, threading, openmp) = choose_threading(path.parent());
            if let Some(layer) = layer {
                // SAFETY: as above.
                unsafe { set_layer(layer) };
            }
            let mut buf = [0 as c_char; 256];
            // SAFETY: MKL writes at most `len` bytes (NUL-terminated) into `buf`.
            unsafe { version(buf.as_mut_ptr(), buf.len() as c_int) };
            let full: Vec<u8> = buf
                .iter()
                .take_while(|&&ch| ch != 0)
                .map(|&ch| ch as u8)
                .collect();
            let full = String::from_utf8_lossy(&full).into_owned();
            let mkl = MklLib {
                path: path.canonicalize().unwrap_or_else(|_| path.to_path_buf()),
                version: short_version(&full),
                threading,
                sgemm,
                sgemm_batch_strided: batch,
                set_num_threads: set_threads,
                _lib: lib,
                _openmp: openmp,
            };
            mkl.set_threads(num_threads());
            Ok(mkl)
        }

        pub fn path(&self) -> &Path {
            &self.path
        }

        /// e.g. "2026.2".
        pub fn version(&self) -> &str {
            &self.version
        }

        /// The OpenMP threading layer chosen, and why.
        pub fn threading(&self) -> &str {
            &self.threading
        }

        pub(super) fn set_threads(&self, n: usize) {
            let n = n.clamp(1, c_int::MAX as usize) as c_int;
            // SAFETY: plain C call; MKL's thread setting is process-wide and thread-safe.
            unsafe { (self.set_num_threads)(n) };
        }

        pub(super) fn sgemm(&self, call: &Call, a: &[f32], b: &[f32], c: &mut [f32]) {
            let Some(d) = Dims32::new(call) else {
                // Beyond MKL's 32-bit indices: the gemm crate takes usize dimensions.
                return super::rust_gemm::sgemm(call, a, b, c);
            };
            // SAFETY: `Call::validate` checked that op(A), op(B) and C at these leading
            // dimensions lie inside the slices, and `Dims32` that every integer fits MKL's
            // 32-bit `MKL_INT`; `c` is a unique borrow, so it aliases neither input.
            unsafe {
                (self.sgemm)(
                    ROW_MAJOR,
                    d.ta,
                    d.tb,
                    d.m,
                    d.n,
                    d.k,
                    call.alpha,
                    a.as_ptr(),
                    d.lda,
                    b.as_ptr(),
                    d.ldb,
                    call.beta,
                    c.as_mut_ptr(),
                    d.ldc,
                )
            }
        }

        /// One `cblas_sgemm_batch_strided` call when possible (returns false otherwise, and the
        /// caller loops): symbol present, strides fit 32 bits, C matrices do not overlap.
        pub(super) fn sgemm_batch_strided(
            &self,
            call: &Call,
            a: &[f32],
            b: &[f32],
            c: &mut [f32],
            batch: usize,
            strides: [usize; 3],
        ) -> bool {
            let Some(f) = self.sgemm_batch_strided else {
                return false;
            };
            let Some(d) = Dims32::new(call) else {
                return false;
            };
            let c_footprint = footprint(call.m, call.n, call.ldc).unwrap_or(usize::MAX);
            if batch > 1 && strides[2] < c_footprint {
                return false; // interleaved or overlapping C: MKL would write it concurrently
            }
            let fits = |x: usize| c_int::try_from(x).ok();
            let (Some(sa), Some(sb), Some(sc), Some(nb)) = (
                fits(strides[0]),
                fits(strides[1]),
                fits(strides[2]),
                fits(batch),
            ) else {
                return false;
            };
            // SAFETY: `Call::validate` checked (batch-1)*stride + footprint <= len for A, B and
            // C; the C matrices are disjoint (checked above), every integer fits `MKL_INT`, and
            // `c` is a unique borrow, so it aliases neither input.
            unsafe {
                f(
                    ROW_MAJOR,
                    d.ta,
                    d.tb,
                    d.m,
                    d.n,
                    d.k,
                    call.alpha,
                    a.as_ptr(),
                    d.lda,
                    sa,
                    b.as_ptr(),
                    d.ldb,
                    sb,
                    call.beta,
                    c.as_mut_ptr(),
                    d.ldc,
                    sc,
                    nb,
                )
            };
            true
        }
    }

    /// libloading's `Display` says only "dlopen failed"; the loader's reason is its source.
    fn dl_error(e: &libloading::Error) -> String {
        use std::error::Error;
        match e.source() {
            Some(why) => why.to_string(),
            None => e.to_string(),
        }
    }

    /// A call's integers as MKL's LP64 `MKL_INT` (32-bit); `None` when one does not fit.
    struct Dims32 {
        ta: c_int,
        tb: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        lda: c_int,
        ldb: c_int,
        ldc: c_int,
    }

    impl Dims32 {
        fn new(call: &Call) -> Option<Dims32> {
            let t = |t: Transpose| if t == Transpose::Yes { TRANS } else { NO_TRANS };
            let i = |x: usize| c_int::try_from(x).ok();
            Some(Dims32 {
                ta: t(call.ta),
                tb: t(call.tb),
                m: i(call.m)?,
                n: i(call.n)?,
                k: i(call.k)?,
                lda: i(call.lda)?,
                ldb: i(call.ldb)?,
                ldc: i(call.ldc)?,
            })
        }
    }

    /// "Intel(R) oneAPI Math Kernel Library Version 2026.2-Product Build …" → "2026.2".
    fn short_version(full: &str) -> String {
        full.split_once("Version ")
            .and_then(|(_, rest)| rest.split(['-', ' ']).next())
            .filter(|v| !v.is_empty())
            .unwrap_or(full)
            .to_string()
    }

    /// Pick MKL's OpenMP layer: `(layer to set, description, OpenMP library to keep loaded)`.
    ///
    /// Measured on the 2-core dev box (8192x768x3072): Intel layer alone 300–320 GFLOP/s; GNU
    /// layer when libtorch's `libgomp` is loaded 265–295; Intel layer forced with `libgomp`
    /// loaded ~160 (one thread: `libgomp`'s `omp_*` shadow `libiomp5`'s).
    #[cfg(unix)]
    fn choose_threading(dir: Option<&Path>) -> (Option<c_int>, String, Option<Library>) {
        use libloading::os::unix::{Library as UnixLibrary, RTLD_GLOBAL, RTLD_NOW};
        if let Ok(layer) = std::env::var("MKL_THREADING_LAYER") {
            if !layer.is_empty() {
                return (
                    None,
                    format!("MKL_THREADING_LAYER={layer} from the environment"),
                    None,
                );
            }
        }
        let this = UnixLibrary::this();
        // SAFETY: only checks whether the symbols resolve in the process' global scope; the
        // pointers are never called or dereferenced.
        let has = |name: &[u8]| unsafe { this.get::<*mut c_void>(name).is_ok() };
        if has(b"__kmpc_fork_call\0") {
            return (
                Some(THREADING_INTEL),
                "intel openmp (libiomp5 already loaded)".into(),
                None,
            );
        }
        if has(b"GOMP_parallel\0") {
            let why = "gnu openmp (libgomp already loaded in the process, e.g. by libtorch)";
            return (Some(THREADING_GNU), why.into(), None);
        }
        let mut tried: Vec<PathBuf> = Vec::new();
        if let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) {
            tried.push(dir.join("libiomp5.so"));
        }
        tried.push(PathBuf::from("libiomp5.so"));
        for path in tried {
            if path.components().count() > 1 && !path.exists() {
                continue;
            }
            // SAFETY: loading runs libiomp5's initialisers (OpenMP runtime setup, no threads
            // yet). RTLD_GLOBAL is what makes its symbols visible to libmkl_intel_thread.
            if let Ok(lib) = unsafe { UnixLibrary::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) } {
                let why = format!("intel openmp ({})", path.display());
                return (Some(THREADING_INTEL), why, Some(lib.into()));
            }
        }
        let why = "sequential: no libiomp5.so next to libmkl_rt nor on the loader path (install \
                   the intel-openmp wheel)";
        (Some(THREADING_SEQUENTIAL), why.into(), None)
    }

    #[cfg(not(unix))]
    fn choose_threading(_dir: Option<&Path>) -> (Option<c_int>, String, Option<Library>) {
        (None, "MKL default".into(), None)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn version_is_shortened() {
            let full = "Intel(R) oneAPI Math Kernel Library Version 2026.2-Product Build 20260915 \
                        for Intel(R) 64 architecture applications";
            assert_eq!(short_version(full), "2026.2");
            assert_eq!(short_version("odd"), "odd");
        }

        #[test]
        fn missing_library_is_an_error_naming_what_was_searched() {
            let bogus = PathBuf::from("/nonexistent/ortbench/libmkl_rt.so.2");
            let err = MklLib::load(std::slice::from_ref(&bogus)).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains("/nonexistent/ortbench/libmkl_rt.so.2: not found"),
                "{msg}"
            );
            assert!(msg.contains("ORTBENCH_GEMM=gemm"), "{msg}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64: a tiny deterministic generator, so tests need no `rand`.
    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// Uniform in [-1, 1).
        fn f32(&mut self) -> f32 {
            ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }

        fn vec(&mut self, len: usize) -> Vec<f32> {
            (0..len).map(|_| self.f32()).collect()
        }
    }

    /// Relative tolerance against the reference, scaled by the magnitude of each output:
    /// |got - want| <= TOL * (|alpha|·Σ_p |a_ip||b_pj| + |beta|·|c_ij|). f32 accumulation over
    /// K <= 80 errs by ~K·6e-8 of that sum; an indexing bug errs by O(1) of it.
    const TOL: f64 = 1e-4;

    const SIZES: [(usize, usize, usize); 7] = [
        (1, 1, 1),
        (3, 5, 7),
        (7, 1, 3),
        (1, 9, 4),
        (17, 33, 65),
        (128, 96, 80),
        (64, 64, 1),
    ];
    const SCALARS: [(f32, f32); 3] = [(1.0, 0.0), (0.75, -1.25), (-2.0, 0.5)];
    const TRANSPOSES: [(Transpose, Transpose); 4] = [
        (Transpose::No, Transpose::No),
        (Transpose::No, Transpose::Yes),
        (Transpose::Yes, Transpose::No),
        (Transpose::Yes, Transpose::Yes),
    ];
    const SENTINEL: f32 = 12345.0;

    /// One random problem, stored with `pad` extra elements at the end of every row.
    struct Case {
        ta: Transpose,
        tb: Transpose,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        beta: f32,
        a: Vec<f32>, // A: (M, K) or (K, M), rows `lda` apart
        lda: usize,
        b: Vec<f32>, // B: (K, N) or (N, K), rows `ldb` apart
        ldb: usize,
        c: Vec<f32>, // C: (M, N), rows `ldc` apart; padding holds SENTINEL
        ldc: usize,
    }

    impl Case {
        #[allow(clippy::too_many_arguments)]
        fn new(
            rng: &mut Rng,
            (ta, tb): (Transpose, Transpose),
            (m, n, k): (usize, usize, usize),
            (alpha, beta): (f32, f32),
            pad: usize,
        ) -> Case {
            let call = Call {
                ta,
                tb,
                m,
                n,
                k,
                alpha,
                lda: 0,
                ldb: 0,
                beta,
                ldc: 0,
            };
            let ((ar, ac), (br, bc)) = (call.a_stored(), call.b_stored());
            let (lda, ldb, ldc) = (ac + pad, bc + pad, n + pad);
            let a = rng.vec(ar * lda);
            let b = rng.vec(br * ldb);
            let mut c = rng.vec(m * ldc);
            for i in 0..m {
                c[i * ldc + n..(i + 1) * ldc].fill(SENTINEL);
            }
            Case {
                ta,
                tb,
                m,
                n,
                k,
                alpha,
                beta,
                a,
                lda,
                b,
                ldb,
                c,
                ldc,
            }
        }

        fn run(&self, p: Provider) -> Vec<f32> {
            let mut c = self.c.clone();
            p.sgemm(
                self.ta, self.tb, self.m, self.n, self.k, self.alpha, &self.a, self.lda, &self.b,
                self.ldb, self.beta, &mut c, self.ldc,
            )
            .unwrap();
            c
        }

        /// Σ_p |a_ip||b_pj| scaled as in TOL's doc, for output (i, j).
        fn magnitude(&self, i: usize, j: usize) -> f64 {
            let a_at = |p: usize| match self.ta {
                Transpose::No => self.a[i * self.lda + p],
                Transpose::Yes => self.a[p * self.lda + i],
            };
            let b_at = |p: usize| match self.tb {
                Transpose::No => self.b[p * self.ldb + j],
                Transpose::Yes => self.b[j * self.ldb + p],
            };
            let ab: f64 = (0..self.k)
                .map(|p| (a_at(p) as f64 * b_at(p) as f64).abs())
                .sum();
            self.alpha.abs() as f64 * ab
                + self.beta.abs() as f64 * self.c[i * self.ldc + j].abs() as f64
        }

        fn check(&self, p: Provider) {
            let got = self.run(p);
            let want = self.run(Provider::Reference);
            let what = format!(
                "{p}: {:?}{:?} m={} n={} k={} alpha={} beta={} ld=({}, {}, {})",
                self.ta,
                self.tb,
                self.m,
                self.n,
                self.k,
                self.alpha,
                self.beta,
                self.lda,
                self.ldb,
                self.ldc
            );
            for i in 0..self.m {
                for j in 0..self.ldc {
                    let (g, w) = (got[i * self.ldc + j], want[i * self.ldc + j]);
                    if j >= self.n {
                        assert_eq!(
                            g, SENTINEL,
                            "{what}: wrote into the row padding at ({i}, {j})"
                        );
                        continue;
                    }
                    let tol = TOL * self.magnitude(i, j) + f64::from(f32::MIN_POSITIVE);
                    let err = (g as f64 - w as f64).abs();
                    assert!(
                        err <= tol,
                        "{what}: C[{i},{j}] = {g}, reference {w}, |err| {err} > {tol}"
                    );
                }
            }
        }
    }

    fn check_provider(p: Provider) {
        let mut rng = Rng(0x5EED);
        let mut cases = 0;
        for t in TRANSPOSES {
            for size in SIZES {
                for scalars in SCALARS {
                    for pad in [0, 3] {
                        Case::new(&mut rng, t, size, scalars, pad).check(p);
                        cases += 1;
                    }
                }
            }
        }
        eprintln!("{p}: {cases} cases match the reference");
    }

    /// MKL when it loads; otherwise a printed note and `None` (the suite must pass without it).
    fn mkl_or_skip() -> Option<Provider> {
        match Provider::load(ProviderKind::Mkl) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("note: skipping the MKL test, MKL is not available here:\n{e}");
                None
            }
        }
    }

    #[test]
    fn gemm_crate_matches_reference() {
        check_provider(Provider::Gemm);
    }

    #[test]
    fn mkl_matches_reference() {
        if let Some(p) = mkl_or_skip() {
            check_provider(p);
        }
    }

    #[test]
    fn active_provider_matches_reference() {
        let p = provider().expect("the active GEMM provider should load");
        eprintln!("active GEMM provider: {p}");
        let mut rng = Rng(7);
        let case = Case::new(&mut rng, TRANSPOSES[3], (17, 33, 65), SCALARS[1], 2);
        let mut c = case.c.clone();
        sgemm(
            case.ta, case.tb, case.m, case.n, case.k, case.alpha, &case.a, case.lda, &case.b,
            case.ldb, case.beta, &mut c, case.ldc,
        )
        .unwrap();
        case.check(p);
    }

    fn all_providers() -> Vec<Provider> {
        let mut ps = vec![Provider::Gemm, Provider::Reference];
        ps.extend(mkl_or_skip());
        ps
    }

    #[test]
    fn beta_zero_overwrites_nan_and_k_zero_scales() {
        for p in all_providers() {
            let (m, n, k) = (5, 6, 4);
            let mut rng = Rng(11);
            let (a, b) = (rng.vec(m * k), rng.vec(k * n));
            let mut c = vec![f32::NAN; m * n];
            p.sgemm(
                Transpose::No,
                Transpose::No,
                m,
                n,
                k,
                1.5,
                &a,
                k,
                &b,
                n,
                0.0,
                &mut c,
                n,
            )
            .unwrap();
            assert!(
                c.iter().all(|x| x.is_finite()),
                "{p}: beta = 0 must not read C"
            );

            let c0 = rng.vec(m * n);
            let mut c = c0.clone();
            p.sgemm(
                Transpose::No,
                Transpose::No,
                m,
                n,
                0,
                1.0,
                &[],
                1,
                &[],
                n,
                -0.5,
                &mut c,
                n,
            )
            .unwrap();
            assert!(
                c.iter().zip(&c0).all(|(x, y)| *x == -0.5 * y),
                "{p}: k = 0 is C = beta·C"
            );

            let mut c = c0.clone();
            p.sgemm(
                Transpose::No,
                Transpose::No,
                0,
                n,
                k,
                1.0,
                &[],
                k,
                &b,
                n,
                2.0,
                &mut c,
                n,
            )
            .unwrap();
            assert_eq!(c, c0, "{p}: m = 0 leaves C alone");
        }
    }

    /// Batched results against one reference call per matrix, with gaps between matrices,
    /// a broadcast operand (stride 0) and interleaved C matrices.
    #[test]
    fn batched_matches_reference_per_matrix() {
        for p in all_providers() {
            for (ta, tb) in TRANSPOSES {
                let (m, n, k, batch) = (9, 13, 11, 4);
                let call = Call {
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    alpha: 0.5,
                    lda: 0,
                    ldb: 0,
                    beta: -1.5,
                    ldc: 0,
                };
                let ((ar, ac), (br, bc)) = (call.a_stored(), call.b_stored());
                let (lda, ldb) = (ac + 1, bc + 2);
                // (stride_a, stride_b, stride_c, ldc): gaps; broadcast B; interleaved C.
                let layouts = [
                    (ar * lda + 5, br * ldb + 3, m * (n + 1) + 7, n + 1),
                    (ar * lda, 0, m * n, n),
                    (ar * lda, br * ldb, n, batch * n),
                ];
                for (sa, sb, sc, ldc) in layouts {
                    let mut rng = Rng(sa as u64 * 31 + sb as u64);
                    let a = rng.vec((batch - 1) * sa + ar * lda);
                    let b = rng.vec((batch - 1) * sb + br * ldb);
                    let c_len = ((batch - 1) * sc + (m - 1) * ldc + n).max(m * ldc);
                    let c0 = rng.vec(c_len);
                    let mut got = c0.clone();
                    p.sgemm_batched(
                        ta, tb, m, n, k, 0.5, &a, lda, &b, ldb, -1.5, &mut got, ldc, batch, sa, sb,
                        sc,
                    )
                    .unwrap();
                    let mut want = c0.clone();
                    for i in 0..batch {
                        sgemm_reference(
                            ta,
                            tb,
                            m,
                            n,
                            k,
                            0.5,
                            &a[i * sa..],
                            lda,
                            &b[i * sb..],
                            ldb,
                            -1.5,
                            &mut want[i * sc..],
                            ldc,
                        )
                        .unwrap();
                    }
                    for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
                        // Each output sums K=11 products of |x| < 1 plus 1.5·|c|: bound by 13.
                        let tol = TOL * 13.0;
                        assert!(
                            ((g - w) as f64).abs() <= tol,
                            "{p}: {ta:?}{tb:?} strides ({sa}, {sb}, {sc}) ldc {ldc}: \
                             c[{idx}] = {g}, reference {w}"
                        );
                    }
                }
            }
        }
    }

    /// The single-call MKL batch path (not the per-matrix loop) is taken and is right,
    /// broadcast A (stride 0) included.
    #[test]
    fn mkl_batch_strided_is_used_and_matches() {
        let Some(Provider::Mkl(lib)) = mkl_or_skip() else {
            return;
        };
        let (m, n, k, batch) = (8, 6, 5, 3);
        let call = Call {
            ta: Transpose::No,
            tb: Transpose::Yes,
            m,
            n,
            k,
            alpha: 1.25,
            lda: k,
            ldb: k,
            beta: 0.5,
            ldc: n,
        };
        let mut rng = Rng(99);
        let a = rng.vec(m * k); // A: (M, K), shared by the batch
        let b = rng.vec(batch * n * k); // B: (batch, N, K)
        let c0 = rng.vec(batch * m * n); // C: (batch, M, N)
        let mut got = c0.clone();
        let strides = [0, n * k, m * n];
        assert!(lib.sgemm_batch_strided(&call, &a, &b, &mut got, batch, strides));
        let mut want = c0;
        for i in 0..batch {
            sgemm_reference(
                call.ta,
                call.tb,
                m,
                n,
                k,
                1.25,
                &a,
                k,
                &b[i * n * k..],
                k,
                0.5,
                &mut want[i * m * n..],
                n,
            )
            .unwrap();
        }
        for (g, w) in got.iter().zip(&want) {
            assert!(((g - w) as f64).abs() <= TOL * 8.0, "{g} vs reference {w}");
        }
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let (a, b) = (vec![1.0f32; 12], vec![1.0f32; 12]);
        let mut c = vec![0.0f32; 9];
        for p in all_providers() {
            // A: (3, 4) needs lda >= 4.
            let e = p.sgemm(
                Transpose::No,
                Transpose::No,
                3,
                3,
                4,
                1.0,
                &a,
                3,
                &b,
                3,
                0.0,
                &mut c,
                3,
            );
            assert!(
                matches!(e, Err(GemmError::LeadingDim { operand: "A", .. })),
                "{e:?}"
            );
            // C: (3, 4) needs 12 elements, has 9.
            let e = p.sgemm(
                Transpose::No,
                Transpose::No,
                3,
                4,
                3,
                1.0,
                &a,
                3,
                &b,
                4,
                0.0,
                &mut c,
                4,
            );
            assert!(
                matches!(
                    e,
                    Err(GemmError::TooShort {
                        operand: "C",
                        need: 12,
                        ..
                    })
                ),
                "{e:?}"
            );
            // Bᵀ stored (N, K) = (4, 3) with ldb 3 fits 12; a batch of 2, 12 apart, does not.
            let e = p.sgemm_batched(
                Transpose::No,
                Transpose::Yes,
                3,
                4,
                3,
                1.0,
                &a,
                3,
                &b,
                3,
                0.0,
                &mut c,
                4,
                2,
                0,
                12,
                0,
            );
            assert!(
                matches!(
                    e,
                    Err(GemmError::TooShort {
                        operand: "B",
                        need: 24,
                        ..
                    })
                ),
                "{e:?}"
            );
            assert!(e.unwrap_err().to_string().contains("2 matrices 12 apart"));
        }
    }

    #[test]
    fn provider_selection() {
        assert_eq!(select(Some("gemm")).unwrap().kind(), ProviderKind::Gemm);
        assert_eq!(
            select(Some(" Reference ")).unwrap().kind(),
            ProviderKind::Reference
        );
        let e = select(Some("openblas")).unwrap_err();
        assert!(e.to_string().contains("use mkl, gemm or reference"), "{e}");
        match select(Some("mkl")) {
            Ok(p) => assert_eq!(p.kind(), ProviderKind::Mkl),
            Err(e) => assert!(matches!(e, GemmError::MklUnavailable { .. }), "{e}"),
        }
    }

    #[test]
    fn time_sgemm_reports_positive_rates() {
        let rates = time_sgemm(Provider::Gemm, 32, 16, 8, 1, 2).unwrap();
        assert_eq!(rates.len(), 2);
        assert!(rates.iter().all(|r| r.is_finite() && *r > 0.0));
    }
}
