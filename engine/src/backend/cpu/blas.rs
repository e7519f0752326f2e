//! Single-threaded f32 GEMM on raw pointers, and its split across the CPU pool: what the
//! planned executor's kernels call.
//!
//! Why not `gemm::sgemm` directly: (1) the kernels run on the pool's threads, so each GEMM must
//! stay on its own thread — MKL's OpenMP team (or the `gemm` crate's Rayon pool) next to our
//! pool would oversubscribe the cores, and an OpenMP team spin-waits after each call, stealing
//! the core our worker needs; (2) strided operands (attention heads inside a (B, T, C) row,
//! q/k/v inside GPT-2's (B, T, 3C) row) make C matrices interleave across tasks, which raw
//! pointers express without overlapping `&mut` slices.
//!
//! Providers follow [`gemm::provider`]: MKL's `cblas_sgemm` with `MKL_Set_Num_Threads_Local(1)`
//! (a thread-local setting, restored after each call on the caller's thread), the pure-Rust
//! `gemm` crate with `Parallelism::None`, or a reference triple loop.
//!
//! One 2-thread MKL call and two 1-thread MKL calls on halves of M on the pool reach about the
//! same GEMM throughput (bert-base shapes, idle machine; measured with the former
//! `bench_gemm_split` test, now `cargo bench -p ortbench --bench gemm`). The split
//! keeps MKL's OpenMP team idle — after a threaded call that team spin-waits (Intel OpenMP:
//! KMP_BLOCKTIME, 200 ms), and any pool kernel that runs meanwhile loses half its core — so the
//! split is what [`sgemm_par`] does. `ORTBENCH_GEMM_THREADS=library` switches to MKL's threads
//! for comparison; bert-base's step was slower that way (figures: docs/measurements.md).

use super::gemm::{self, GemmError, Provider};
use super::pool::{Pool, SyncPtr};
use std::ffi::c_int;
use std::sync::OnceLock;

use super::gemm::mkl::{SetLocalFn, SgemmFn};

enum St {
    /// MKL's entry points, from the library the provider loaded (it lives for the process).
    Mkl {
        sgemm: SgemmFn,
        set_local: SetLocalFn,
    },
    Gemm,
    Reference,
}

static ST: OnceLock<Result<St, GemmError>> = OnceLock::new();

fn st() -> Result<&'static St, GemmError> {
    ST.get_or_init(|| match gemm::provider()? {
        Provider::Mkl(lib) => Ok(St::Mkl {
            sgemm: lib.sgemm_fn(),
            set_local: lib.set_num_threads_local_fn().ok_or_else(|| GemmError::MklUnavailable {
                searched: format!(
                    "  {}: no symbol MKL_Set_Num_Threads_Local",
                    lib.path().display()
                ),
            })?,
        }),
        Provider::Gemm => Ok(St::Gemm),
        Provider::Reference => Ok(St::Reference),
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Checks that the GEMM provider loads and the bf16 switch is valid (the planned executor calls
/// it at build time, so that a missing MKL is an error there and not a panic inside a step).
pub fn check() -> Result<(), GemmError> {
    // A bad bf16 switch stops every engine user (`run`, `train`), not only `ortbench run`.
    bf16_gemm_setting().map_err(GemmError::Bf16Setting)?;
    amx_setting().map_err(GemmError::Bf16Setting)?;
    st().map(|_| ())
}

/// What a GEMM's operands A and B hold: f32 values, or bf16 values in f32 slots (a bf16 graph's
/// tensors, whose producers rounded them), which [`super::bf16_gemm`] multiplies two products
/// per f32 lane where the CPU has AVX-512 BF16. C is f32 either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GemmKind {
    #[default]
    F32,
    Bf16,
}

impl GemmKind {
    /// `Bf16` when both operands are bf16 tensors and [`bf16_gemm_enabled`]; `F32` otherwise.
    pub fn of(a: crate::graph::ElemType, b: crate::graph::ElemType) -> GemmKind {
        use crate::{graph::ElemType, DType};
        let bf16 = |e| e == ElemType::Float(DType::BF16);
        if bf16(a) && bf16(b) && bf16_gemm_enabled() {
            GemmKind::Bf16
        } else {
            GemmKind::F32
        }
    }
}

/// The variable that chooses what multiplies bf16 operands: `0` the f32 GEMM (for
/// comparisons), `1` the bf16 kernel (an error where the CPU lacks AVX-512 BF16); unset, the
/// kernel where the CPU has it.
pub const BF16_GEMM_VAR: &str = "ORTBENCH_CPU_BF16_GEMM";

/// [`BF16_GEMM_VAR`] read: Ok(Some(on)) when set to `0`/`1`, an error for another value or for
/// `1` on a CPU without AVX-512 BF16.
pub fn bf16_gemm_setting() -> Result<Option<bool>, String> {
    switch(BF16_GEMM_VAR, super::bf16_gemm::available, "this CPU has no AVX-512 BF16")
}

/// A 0/1 switch in `var`: None unset, Some(on), or an error for another value or for `1` where
/// the kernel it asks for is not `available` (`missing` says why). `available` is asked only
/// for `1`: AMX's check asks Linux for the tile state, which `0` or unset should not do here.
fn switch(var: &str, available: fn() -> bool, missing: &str) -> Result<Option<bool>, String> {
    match std::env::var(var).as_deref() {
        Err(_) => Ok(None),
        Ok("0") => Ok(Some(false)),
        Ok("1") if available() => Ok(Some(true)),
        Ok("1") => Err(format!("{var}=1: {missing}")),
        Ok(v) => Err(format!("{var} must be 0 or 1, got {v:?}")),
    }
}

/// Whether bf16 operands run on the bf16 kernel (see [`BF16_GEMM_VAR`]). Where it is false,
/// bf16 values are multiplied by the f32 GEMM: the same products, each on an f32 FMA.
pub fn bf16_gemm_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        super::bf16_gemm::available() && bf16_gemm_setting().ok().flatten() != Some(false)
    })
}

/// The variable that keeps the bf16 kernel off AMX where the CPU has it: `0` the AVX-512 BF16
/// kernel (for comparisons), `1` AMX (an error where the CPU or kernel lacks it); unset, AMX
/// where available.
pub const AMX_VAR: &str = "ORTBENCH_CPU_AMX";

/// [`AMX_VAR`] read, as [`bf16_gemm_setting`].
pub fn amx_setting() -> Result<Option<bool>, String> {
    switch(AMX_VAR, super::amx_gemm::available, "this CPU or kernel has no AMX-BF16")
}

/// Whether the bf16 kernel runs on AMX tiles (see [`AMX_VAR`]).
pub fn amx_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        bf16_gemm_enabled()
            && super::amx_gemm::available()
            && amx_setting().ok().flatten() != Some(false)
    })
}

/// What multiplies a bf16 graph's matmuls on this machine, in words (for run records).
pub fn bf16_gemm_description() -> String {
    if amx_enabled() {
        "AMX kernel (tdpbf16ps, f32 accumulation)".into()
    } else if bf16_gemm_enabled() && super::amx_gemm::available() {
        format!("AVX-512 BF16 kernel (vdpbf16ps, f32 accumulation; {AMX_VAR}=0)")
    } else if bf16_gemm_enabled() {
        "AVX-512 BF16 kernel (vdpbf16ps, f32 accumulation)".into()
    } else if super::bf16_gemm::available() {
        format!("f32 GEMM on bf16 values ({BF16_GEMM_VAR}=0)")
    } else {
        "f32 GEMM on bf16 values (this CPU has no AVX-512 BF16)".into()
    }
}

/// [`sgemm_st`], or the bf16 kernel (on AMX where [`amx_enabled`]) for `GemmKind::Bf16`.
///
/// # Safety
/// As [`sgemm_st`].
#[allow(clippy::too_many_arguments, reason = "BLAS-shaped on purpose: it mirrors cblas_sgemm")]
pub unsafe fn gemm_st(
    kind: GemmKind,
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    if kind == GemmKind::Bf16 && m > 0 && n > 0 && k > 0 {
        let bf16_st: super::bf16_gemm::GemmSt =
            if amx_enabled() { super::amx_gemm::gemm_st } else { super::bf16_gemm::gemm_st };
        bf16_st(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    } else {
        sgemm_st(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    }
}

/// Pool workers run MKL on one thread each (a thread-local MKL setting).
pub(crate) fn init_worker_thread() {
    if let Ok(St::Mkl { set_local, .. }) = st() {
        // SAFETY: plain C call on this thread's MKL state.
        unsafe { set_local(1) };
    }
}

/// `C = alpha·op(A)·op(B) + beta·C` on this thread only. Row-major; `ta`: A is stored (K, M),
/// else (M, K); `tb`: B is stored (N, K), else (K, N); rows `ld*` apart. `beta = 0` does not
/// read C.
///
/// # Safety
/// Every element of op(A), op(B) and C at these leading dimensions must be valid; C must not
/// overlap A or B, and no other thread may touch C's elements during the call.
#[allow(clippy::too_many_arguments, reason = "BLAS-shaped on purpose: it mirrors cblas_sgemm")]
pub unsafe fn sgemm_st(
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32, // (M, K) or (K, M) when ta, rows lda apart
    lda: usize,
    b: *const f32, // (K, N) or (N, K) when tb, rows ldb apart
    ldb: usize,
    beta: f32,
    c: *mut f32, // (M, N), rows ldc apart
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for i in 0..m {
            let row = std::slice::from_raw_parts_mut(c.add(i * ldc), n);
            if beta == 0.0 {
                row.fill(0.0);
            } else {
                row.iter_mut().for_each(|x| *x *= beta);
            }
        }
        return;
    }
    match st().unwrap_or_else(|e| panic!("GEMM provider: {e}")) {
        St::Mkl { sgemm, set_local, .. } => {
            let i = |x: usize| c_int::try_from(x).expect("GEMM dimension beyond MKL's 32-bit ints");
            let t = |x: bool| if x { 112 } else { 111 }; // CblasTrans / CblasNoTrans
            let prev = set_local(1);
            sgemm(
                101, // CblasRowMajor
                t(ta),
                t(tb),
                i(m),
                i(n),
                i(k),
                alpha,
                a,
                i(lda.max(1)),
                b,
                i(ldb.max(1)),
                beta,
                c,
                i(ldc.max(1)),
            );
            if prev != 1 {
                set_local(prev);
            }
        }
        St::Gemm => {
            let _scope = GemmCrateScope::enter();
            let (a_rs, a_cs) = if ta { (1, lda as isize) } else { (lda as isize, 1) };
            let (b_rs, b_cs) = if tb { (1, ldb as isize) } else { (ldb as isize, 1) };
            // The crate computes dst = alpha·dst + beta·lhs·rhs (its names), reading dst only
            // when asked.
            ::gemm::gemm(
                m,
                n,
                k,
                c,
                1,
                ldc as isize,
                beta != 0.0,
                a,
                a_cs,
                a_rs,
                b,
                b_cs,
                b_rs,
                beta,
                alpha,
                false,
                false,
                false,
                ::gemm::Parallelism::None,
            );
        }
        St::Reference => {
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0f64;
                    for p in 0..k {
                        let av = if ta { *a.add(p * lda + i) } else { *a.add(i * lda + p) };
                        let bv = if tb { *b.add(j * ldb + p) } else { *b.add(p * ldb + j) };
                        acc += av as f64 * bv as f64;
                    }
                    let o = c.add(i * ldc + j);
                    let prev = if beta == 0.0 { 0.0 } else { beta as f64 * *o as f64 };
                    *o = (alpha as f64 * acc + prev) as f32;
                }
            }
        }
    }
}

/// `ORTBENCH_GEMM_THREADS=library`: large GEMMs use MKL's own threads instead of the pool
/// split (for comparisons; see the module docs).
fn library_threads() -> bool {
    static LIB: OnceLock<bool> = OnceLock::new();
    *LIB.get_or_init(|| {
        std::env::var("ORTBENCH_GEMM_THREADS").is_ok_and(|v| v.eq_ignore_ascii_case("library"))
    })
}

/// [`sgemm_st`] split over the pool: along M in row blocks when M is large enough, else along N.
/// Below ~1 MFLOP it runs on the calling thread only (a wake-up costs more than it saves).
///
/// # Safety
/// As [`sgemm_st`].
#[allow(clippy::too_many_arguments, reason = "BLAS-shaped on purpose: it mirrors cblas_sgemm")]
pub unsafe fn sgemm_par(
    pool: &Pool,
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    gemm_par(pool, GemmKind::F32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

/// [`gemm_st`] split over the pool, as [`sgemm_par`].
///
/// # Safety
/// As [`sgemm_st`].
#[allow(clippy::too_many_arguments, reason = "BLAS-shaped on purpose: it mirrors cblas_sgemm")]
pub unsafe fn gemm_par(
    pool: &Pool,
    kind: GemmKind,
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    let t = pool.threads();
    let flops = 2 * m * n * k;
    if t <= 1 || flops < (1 << 20) {
        return gemm_st(kind, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    if library_threads() && kind == GemmKind::F32 {
        if let Ok(St::Mkl { sgemm, set_local, .. }) = st() {
            // MKL's own threads (its global count), from the calling thread.
            let i = |x: usize| c_int::try_from(x).expect("GEMM dimension beyond MKL's 32-bit ints");
            let tr = |x: bool| if x { 112 } else { 111 };
            let prev = set_local(0);
            sgemm(
                101,
                tr(ta),
                tr(tb),
                i(m),
                i(n),
                i(k),
                alpha,
                a,
                i(lda.max(1)),
                b,
                i(ldb.max(1)),
                beta,
                c,
                i(ldc.max(1)),
            );
            set_local(prev);
            return;
        }
    }
    let (ap, bp, cp) = (SyncPtr(a as *mut f32), SyncPtr(b as *mut f32), SyncPtr(c));
    // The bf16 kernel packs (converts) its operands: each task packs its share of the split
    // dimension's operand and all of the other's, so it splits the larger of M and N.
    let by_rows = match kind {
        GemmKind::F32 => m >= 16 * t,
        GemmKind::Bf16 => m >= 16 * t && m >= n,
    };
    if by_rows {
        let per = m.div_ceil(t).next_multiple_of(8);
        pool.run(t, &|i| {
            let (r0, r1) = ((i * per).min(m), ((i + 1) * per).min(m));
            if r0 < r1 {
                let a_i = if ta { ap.ptr().add(r0) } else { ap.ptr().add(r0 * lda) };
                // SAFETY: row block [r0, r1) of C is this task's alone.
                gemm_st(
                    kind,
                    ta,
                    tb,
                    r1 - r0,
                    n,
                    k,
                    alpha,
                    a_i,
                    lda,
                    bp.ptr(),
                    ldb,
                    beta,
                    cp.ptr().add(r0 * ldc),
                    ldc,
                );
            }
        });
    } else {
        let per = n.div_ceil(t).next_multiple_of(16);
        pool.run(t, &|i| {
            let (c0, c1) = ((i * per).min(n), ((i + 1) * per).min(n));
            if c0 < c1 {
                let b_i = if tb { bp.ptr().add(c0 * ldb) } else { bp.ptr().add(c0) };
                // SAFETY: column block [c0, c1) of C is this task's alone.
                gemm_st(
                    kind,
                    ta,
                    tb,
                    m,
                    c1 - c0,
                    k,
                    alpha,
                    ap.ptr(),
                    lda,
                    b_i,
                    ldb,
                    beta,
                    cp.ptr().add(c0),
                    ldc,
                );
            }
        });
    }
}

thread_local! {
    static IN_GEMM_CRATE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is inside a call of the `gemm` crate (single-threaded here, so its
/// allocations happen on the calling thread). The crate allocates its packing buffers on
/// every call; the no-allocation test (`engine/tests/no_alloc.rs`) counts those apart, so that
/// it checks the executor's own claim on the default provider too.
pub fn in_gemm_crate() -> bool {
    IN_GEMM_CRATE.try_with(|f| f.get()).unwrap_or(false)
}

/// Marks the current thread as inside the `gemm` crate until dropped.
struct GemmCrateScope;

impl GemmCrateScope {
    fn enter() -> Self {
        IN_GEMM_CRATE.with(|f| f.set(true));
        GemmCrateScope
    }
}

impl Drop for GemmCrateScope {
    fn drop(&mut self) {
        IN_GEMM_CRATE.with(|f| f.set(false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0 + 1e-3
            })
            .collect()
    }

    #[test]
    fn split_and_single_match_the_reference_for_all_flags() {
        let pool = Pool::new(2);
        for &(m, n, k) in &[(1, 1, 1), (5, 7, 3), (64, 40, 33), (300, 20, 17), (3, 700, 9)] {
            for ta in [false, true] {
                for tb in [false, true] {
                    let (lda, ldb, ldc) =
                        (if ta { m } else { k } + 3, if tb { k } else { n } + 1, n + 2);
                    let a = fill(if ta { k } else { m } * lda, 1);
                    let b = fill(if tb { n } else { k } * ldb, 2);
                    let c0 = fill(m * ldc, 3);
                    let (mut c1, mut c2, mut c3) = (c0.clone(), c0.clone(), c0.clone());
                    gemm::sgemm_reference(
                        if ta { gemm::Transpose::Yes } else { gemm::Transpose::No },
                        if tb { gemm::Transpose::Yes } else { gemm::Transpose::No },
                        m,
                        n,
                        k,
                        0.7,
                        &a,
                        lda,
                        &b,
                        ldb,
                        0.5,
                        &mut c1,
                        ldc,
                    )
                    .unwrap();
                    unsafe {
                        sgemm_st(
                            ta,
                            tb,
                            m,
                            n,
                            k,
                            0.7,
                            a.as_ptr(),
                            lda,
                            b.as_ptr(),
                            ldb,
                            0.5,
                            c2.as_mut_ptr(),
                            ldc,
                        );
                        sgemm_par(
                            &pool,
                            ta,
                            tb,
                            m,
                            n,
                            k,
                            0.7,
                            a.as_ptr(),
                            lda,
                            b.as_ptr(),
                            ldb,
                            0.5,
                            c3.as_mut_ptr(),
                            ldc,
                        );
                    }
                    // f32 sums of k terms of magnitude <= 1: summation-order differences.
                    let tol = 4.0 * (k as f32 + 2.0) * f32::EPSILON;
                    for i in 0..m * ldc {
                        assert!(
                            (c1[i] - c2[i]).abs() <= tol,
                            "st {m}x{n}x{k} ta={ta} tb={tb} @{i}"
                        );
                        assert!(
                            (c1[i] - c3[i]).abs() <= tol,
                            "par {m}x{n}x{k} ta={ta} tb={tb} @{i}"
                        );
                    }
                }
            }
        }
    }
}
