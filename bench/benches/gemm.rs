//! The fp32 GEMM at bert-base's and gpt2's training shapes (b8 × s128: M = 1024 rows), as a
//! linear layer runs it: the forward Y = X·Wᵀ with W stored (out, in) as HF stores it, and the
//! backward's dX = dY·W and dW = dYᵀ·X. Three lines per shape: `pool` is what the planned
//! executor calls (`blas::sgemm_par`: single-threaded GEMMs split over the engine's thread
//! pool); `one thread` is one of those single-threaded GEMMs alone (`blas::sgemm_st`);
//! `provider` is `gemm::sgemm` on the library's own threads (MKL when it loads, else the
//! pure-Rust `gemm` crate; the group's name says which). `provider` runs last in each group:
//! after a library-threaded call MKL's OpenMP team spin-waits (Intel OpenMP's KMP_BLOCKTIME,
//! 200 ms) and would take cores from the pool's threads; the next group's warm-up outlasts it.
//!
//! Then `sgemm_st concurrency`: two single-threaded GEMMs at once on two pool threads
//! (`concurrent`) against the same two one after the other (`sequential`), per transpose
//! combination — whether a second core speeds each up.
//!
//! Then `bf16`: the same shapes with bf16 values (a bf16 graph's matmuls), split over the pool,
//! on the f32 GEMM (`f32 gemm`, what runs with ORTBENCH_CPU_BF16_GEMM=0) against the AVX-512
//! BF16 kernel (`bf16 kernel`, on AMX tiles where the CPU has AMX-BF16 and ORTBENCH_CPU_AMX is not
//! 0); skipped, with a note, where the CPU has no AVX-512 BF16. Where it has AMX, two more lines
//! compare the two bf16 kernels on one thread: `vdpbf16ps one thread` and `amx one thread`.
//!
//! Throughput is in FLOP, so criterion's "elem/s" reads as FLOP/s.
//!
//! `cargo bench -p ortbench --bench gemm`

mod common;

use common::*;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ortbench_engine::backend::cpu::pool::{Pool, SyncPtr};
use ortbench_engine::backend::cpu::{blas, gemm};

/// (name, M, N, K, ta, tb): C (M, N) = op(A)·op(B); A stored (K, M) when `ta`, else (M, K);
/// B stored (N, K) when `tb`, else (K, N).
const SHAPES: &[(&str, usize, usize, usize, bool, bool)] = &[
    ("attention projection", ROWS, C, C, false, true),
    ("mlp up", ROWS, I, C, false, true),
    ("mlp down", ROWS, C, I, false, true),
    ("bert lm head", ROWS, V, C, false, true),
    ("gpt2 lm head", ROWS, 50257, C, false, true),
    // The backward of Y = X·Wᵀ: dX = dY·W (W (out, in) as stored), dW = dYᵀ·X.
    ("attention projection dX", ROWS, C, C, false, false),
    ("attention projection dW", C, C, ROWS, true, false),
    ("mlp up dW", I, C, ROWS, true, false),
    ("bert lm head dW", V, C, ROWS, true, false),
];

fn transpose(t: bool) -> gemm::Transpose {
    if t {
        gemm::Transpose::Yes
    } else {
        gemm::Transpose::No
    }
}

fn gemm_shapes(c: &mut Criterion) {
    let pool = Pool::global();
    let provider = gemm::provider().map(|p| p.kind().name()).unwrap_or("unavailable");
    for &(name, m, n, k, ta, tb) in SHAPES {
        let (a, b) = (random(m * k, 1), random(n * k, 2));
        let (lda, ldb) = (if ta { m } else { k }, if tb { k } else { n });
        let mut y = vec![0f32; m * n];
        let mut g = c.benchmark_group(format!("sgemm {name} {m}x{n}x{k} (provider: {provider})"));
        g.throughput(Throughput::Elements(2 * (m * n * k) as u64));
        if m * n * k > 1 << 30 {
            flat(&mut g);
        }
        g.bench_function("pool", |bench| {
            // SAFETY: op(A) is (M, K) at lda, op(B) is (K, N) at ldb, y is (M, N), all dense;
            // y overlaps neither.
            bench.iter(|| unsafe {
                blas::sgemm_par(
                    pool,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    1.0,
                    a.as_ptr(),
                    lda,
                    b.as_ptr(),
                    ldb,
                    0.0,
                    y.as_mut_ptr(),
                    n,
                )
            })
        });
        g.bench_function("one thread", |bench| {
            // SAFETY: as for `pool`.
            bench.iter(|| unsafe {
                blas::sgemm_st(
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    1.0,
                    a.as_ptr(),
                    lda,
                    b.as_ptr(),
                    ldb,
                    0.0,
                    y.as_mut_ptr(),
                    n,
                )
            })
        });
        g.bench_function("provider", |bench| {
            bench.iter(|| {
                gemm::sgemm(
                    transpose(ta),
                    transpose(tb),
                    m,
                    n,
                    k,
                    1.0,
                    &a,
                    lda,
                    &b,
                    ldb,
                    0.0,
                    &mut y,
                    n,
                )
                .expect("sgemm")
            })
        });
        g.finish();
    }
}

/// (M, N, K, ta, tb) of each of the two GEMMs: half of bert-base's 1024 rows through the
/// attention projection and the MLP's up projection, B transposed (the forward) and not.
const CONCURRENCY: &[(usize, usize, usize, bool, bool)] = &[
    (ROWS / 2, C, C, false, true),
    (ROWS / 2, C, C, false, false),
    (ROWS / 2, I, C, false, true),
    (ROWS / 2, I, C, false, false),
];

fn gemm_concurrency(c: &mut Criterion) {
    let pool = Pool::global();
    for &(m, n, k, ta, tb) in CONCURRENCY {
        let (a, b) = (random(m * k, 1), random(n * k, 2));
        let (lda, ldb) = (if ta { m } else { k }, if tb { k } else { n });
        // One C per GEMM, side by side.
        let mut y = vec![0f32; 2 * m * n];
        let yp = SyncPtr(y.as_mut_ptr());
        // SAFETY: op(A) is (M, K) at lda and op(B) (K, N) at ldb; GEMM `i` writes only its own
        // C, y[i·M·N..(i + 1)·M·N], which overlaps neither A nor B; y outlives every call.
        let run = |i: usize| unsafe {
            blas::sgemm_st(
                ta,
                tb,
                m,
                n,
                k,
                1.0,
                a.as_ptr(),
                lda,
                b.as_ptr(),
                ldb,
                0.0,
                yp.ptr().add(i * m * n),
                n,
            )
        };
        let t = |x: bool| if x { "T" } else { "N" };
        let mut g =
            c.benchmark_group(format!("sgemm_st concurrency 2x {m}x{n}x{k} {}{}", t(ta), t(tb)));
        g.throughput(Throughput::Elements(2 * 2 * (m * n * k) as u64));
        g.bench_function("sequential", |bench| {
            bench.iter(|| {
                run(0);
                run(1);
            })
        });
        g.bench_function("concurrent", |bench| bench.iter(|| pool.run(2, &run)));
        g.finish();
    }
}

fn gemm_bf16(c: &mut Criterion) {
    use blas::GemmKind;
    if !ortbench_engine::backend::cpu::bf16_gemm::available() {
        eprintln!("bf16: skipped, this CPU has no AVX-512 BF16");
        return;
    }
    let pool = Pool::global();
    let bf16 = |v: Vec<f32>| -> Vec<f32> {
        v.into_iter().map(|x| half::bf16::from_f32(x).to_f32()).collect()
    };
    for &(name, m, n, k, ta, tb) in SHAPES {
        let (a, b) = (bf16(random(m * k, 1)), bf16(random(n * k, 2)));
        let (lda, ldb) = (if ta { m } else { k }, if tb { k } else { n });
        let mut y = vec![0f32; m * n];
        let mut g = c.benchmark_group(format!("bf16 {name} {m}x{n}x{k}"));
        g.throughput(Throughput::Elements(2 * (m * n * k) as u64));
        if m * n * k > 1 << 30 {
            flat(&mut g);
        }
        for (label, kind) in [("f32 gemm", GemmKind::F32), ("bf16 kernel", GemmKind::Bf16)] {
            g.bench_function(label, |bench| {
                // SAFETY: as in `gemm_shapes`.
                bench.iter(|| unsafe {
                    blas::gemm_par(
                        pool,
                        kind,
                        ta,
                        tb,
                        m,
                        n,
                        k,
                        1.0,
                        a.as_ptr(),
                        lda,
                        b.as_ptr(),
                        ldb,
                        0.0,
                        y.as_mut_ptr(),
                        n,
                    )
                })
            });
        }
        if ortbench_engine::backend::cpu::amx_gemm::available() {
            use ortbench_engine::backend::cpu::{amx_gemm, bf16_gemm};
            let kernels: [(&str, bf16_gemm::GemmSt); 2] = [
                ("vdpbf16ps one thread", bf16_gemm::gemm_st),
                ("amx one thread", amx_gemm::gemm_st),
            ];
            for (label, f) in kernels {
                g.bench_function(label, |bench| {
                    // SAFETY: as in `gemm_shapes`; both kernels are available.
                    bench.iter(|| unsafe {
                        f(
                            ta,
                            tb,
                            m,
                            n,
                            k,
                            1.0,
                            a.as_ptr(),
                            lda,
                            b.as_ptr(),
                            ldb,
                            0.0,
                            y.as_mut_ptr(),
                            n,
                        )
                    })
                });
            }
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = criterion();
    targets = gemm_shapes, gemm_concurrency, gemm_bf16
}
criterion_main!(benches);
