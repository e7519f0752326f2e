//! Shared by the criterion benches: shapes, random inputs and a short criterion set-up.
//!
//! Every bench keeps `cargo bench -p ortbench` within minutes on 2 cores: 10 samples, short
//! warm-up and measurement, flat sampling for the slow (reference) paths. Read the results as
//! ratios between the lines of one group, measured in one run on an idle machine.

#![allow(dead_code, reason = "each bench binary includes this module and uses a part of it")]

use std::time::Duration;

use criterion::{Criterion, SamplingMode};

/// bert-base's training shapes at batch 8 × seq 128: rows B·T, hidden C, heads H, head dim D,
/// MLP width I, vocabulary V.
pub const B: usize = 8;
pub const T: usize = 128;
pub const C: usize = 768;
pub const H: usize = 12;
pub const D: usize = 64;
pub const I: usize = 3072;
pub const V: usize = 30522;
pub const ROWS: usize = B * T;

pub fn criterion() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .without_plots()
}

/// Slow benchmarks (a reference loop, a whole step) run the same iterations per sample instead
/// of criterion's 1, 2, … 10 (which would be 55 iterations at least).
pub fn flat(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    g.sampling_mode(SamplingMode::Flat);
}

/// Uniform values in [-1, 1) from a fixed seed, never exactly 0 (the kernels' tests use random
/// non-zero inputs too; zeros would let a kernel skip work the real data makes it do).
pub fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            // xorshift64*
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
            let x = 2.0 * u - 1.0;
            if x == 0.0 {
                1e-3
            } else {
                x
            }
        })
        .collect()
}

/// Integer ids in 0..v.
pub fn ids(n: usize, v: usize, seed: u64) -> Vec<i64> {
    random(n, seed)
        .iter()
        .map(|x| (((x + 1.0) * 0.5 * v as f32) as usize).min(v - 1) as i64)
        .collect()
}
