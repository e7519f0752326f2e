//! The fp32 GEMM at bert-base's and gpt2's training shapes (b8 × s128: M = 1024 rows), as a
//! linear layer runs it, Y = X·Wᵀ with W stored (out, in) as HF stores it. Two lines per shape:
//! `pool` is what the planned executor calls (`blas::sgemm_par`: single-threaded GEMMs split
//! over the engine's thread pool); `provider` is `gemm::sgemm` (MKL when it loads, else the
//! pure-Rust `gemm` crate; the group's name says which). Throughput is in FLOP, so criterion's
//! "elem/s" reads as FLOP/s.
//!
//! `cargo bench -p ortbench --bench gemm`

mod common;

use common::*;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ortbench_engine::backend::cpu::{blas, gemm, pool::Pool};

/// (name, M, N, K): Y (M, N) = X (M, K) · Wᵀ, W (N, K).
const SHAPES: &[(&str, usize, usize, usize)] = &[
    ("attention projection", ROWS, C, C),
    ("mlp up", ROWS, I, C),
    ("mlp down", ROWS, C, I),
    ("bert lm head", ROWS, V, C),
    ("gpt2 lm head", ROWS, 50257, C),
];

fn gemm_shapes(c: &mut Criterion) {
    let pool = Pool::global();
    let provider = gemm::provider().map(|p| p.kind().name()).unwrap_or("unavailable");
    for &(name, m, n, k) in SHAPES {
        let (x, w) = (random(m * k, 1), random(n * k, 2));
        let mut y = vec![0f32; m * n];
        let mut g = c.benchmark_group(format!("sgemm {name} {m}x{n}x{k} (provider: {provider})"));
        g.throughput(Throughput::Elements(2 * (m * n * k) as u64));
        if m * n * k > 1 << 30 {
            flat(&mut g);
        }
        g.bench_function("pool", |b| {
            // SAFETY: x is (M, K), w is (N, K), y is (M, N), all dense; y overlaps neither.
            b.iter(|| unsafe {
                blas::sgemm_par(
                    pool,
                    false,
                    true,
                    m,
                    n,
                    k,
                    1.0,
                    x.as_ptr(),
                    k,
                    w.as_ptr(),
                    k,
                    0.0,
                    y.as_mut_ptr(),
                    n,
                )
            })
        });
        g.bench_function("provider", |b| {
            b.iter(|| {
                gemm::sgemm(
                    gemm::Transpose::No,
                    gemm::Transpose::Yes,
                    m,
                    n,
                    k,
                    1.0,
                    &x,
                    k,
                    &w,
                    k,
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

criterion_group! {
    name = benches;
    config = criterion();
    targets = gemm_shapes
}
criterion_main!(benches);
