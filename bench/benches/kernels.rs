//! Each fast CPU kernel of the planned executor (`engine/src/backend/cpu/kernels`) against the
//! reference op it is tested against (`engine/src/ops`: plain loops, one thread), on the same
//! random inputs at bert-base's b8 × s128 training shapes. One group per kernel, two lines:
//! `kernel` and `reference`; and the passes' fused kernels against the unfused kernels they
//! replace (`fused` vs `unfused`).
//!
//! `cargo bench -p ortbench --bench kernels`

mod common;

use common::*;
use criterion::{criterion_group, criterion_main, Criterion};
use ortbench_engine::backend::cpu::kernels::{
    attention, cross_entropy, elementwise, embedding, layernorm, softmax,
};
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::ops::{self, attention::AttnCfg, attention::AttnDims, gelu::GeluApprox};
use std::hint::black_box;

/// bert's MLM loss ignores the labels of unmasked tokens (-100).
const IGNORE: i64 = -100;

fn gelu(c: &mut Criterion) {
    let pool = Pool::global();
    let n = ROWS * I; // the MLP activation: (B·T, 4C)
    let (x, dy) = (random(n, 1), random(n, 2));
    let mut out = vec![0f32; n];
    let mut g = c.benchmark_group(format!("gelu_forward ({ROWS}x{I})"));
    g.bench_function("kernel", |b| {
        b.iter(|| elementwise::map1(pool, &mut out, &x, elementwise::Gelu(GeluApprox::Erf)))
    });
    g.bench_function("reference", |b| {
        b.iter(|| ops::gelu::gelu_forward(&mut out, &x, GeluApprox::Erf))
    });
    g.finish();
    let mut g = c.benchmark_group(format!("gelu_backward ({ROWS}x{I})"));
    g.bench_function("kernel", |b| {
        b.iter(|| {
            elementwise::map2(pool, &mut out, &x, &dy, elementwise::GeluBackward(GeluApprox::Erf))
        })
    });
    g.bench_function("reference", |b| {
        b.iter(|| ops::gelu::gelu_backward(&mut out, &x, &dy, GeluApprox::Erf))
    });
    g.finish();
}

fn layernorm(c: &mut Criterion) {
    let pool = Pool::global();
    let n = ROWS * C;
    let (x, dy, w, bias) = (random(n, 3), random(n, 4), random(C, 5), random(C, 6));
    let (mut y, mut mean, mut rstd) = (vec![0f32; n], vec![0f32; ROWS], vec![0f32; ROWS]);
    let mut g = c.benchmark_group(format!("layernorm_forward ({ROWS}x{C})"));
    g.bench_function("kernel", |b| {
        b.iter(|| {
            layernorm::layernorm_forward(pool, &mut y, &mut mean, &mut rstd, &x, &w, &bias, 1e-12)
        })
    });
    g.bench_function("reference", |b| {
        b.iter(|| {
            ops::layernorm::layernorm_forward(&mut y, &mut mean, &mut rstd, &x, &w, &bias, 1e-12)
        })
    });
    g.finish();
    let (mut dx, mut dw, mut db) = (vec![0f32; n], vec![0f32; C], vec![0f32; C]);
    let mut ws = vec![0f32; layernorm::backward_workspace(pool.threads(), C)];
    let mut g = c.benchmark_group(format!("layernorm_backward ({ROWS}x{C})"));
    g.bench_function("kernel", |b| {
        b.iter(|| {
            layernorm::layernorm_backward(
                pool, &mut dx, &mut dw, &mut db, &dy, &x, &w, &mean, &rstd, &mut ws,
            )
        })
    });
    g.bench_function("reference", |b| {
        b.iter(|| {
            ops::layernorm::layernorm_backward(&mut dx, &mut dw, &mut db, &dy, &x, &w, &mean, &rstd)
        })
    });
    g.finish();
}

fn softmax(c: &mut Criterion) {
    // The attention scores of one layer: (B, H, T, T), scaled by 1/√D, with BERT's padding
    // mask (B, 1, 1, T) broadcast over heads and queries.
    let pool = Pool::global();
    let n = B * H * T * T;
    let full = [B, H, T, T];
    let (x, dy) = (random(n, 7), random(n, 8));
    let mask: Vec<f32> =
        random(B * T, 9).iter().map(|m| if *m > 0.8 { -1e4 } else { 0.0 }).collect();
    let (map, view) = (
        softmax::MaskMap::new(&[B, 1, 1, T], &full),
        ops::MaskView::new(&mask, &[B, 1, 1, T], &full),
    );
    let scale = 1.0 / (D as f32).sqrt();
    let (mut y, mut dx) = (vec![0f32; n], vec![0f32; n]);
    let mut g = c.benchmark_group(format!("softmax_forward ({B}x{H}x{T}x{T}, scale + mask)"));
    g.bench_function("kernel", |b| {
        b.iter(|| {
            softmax::softmax_forward(pool, &mut y, &x, T, scale, false, T, Some((&mask, &map)))
        })
    });
    g.bench_function("reference", |b| {
        b.iter(|| ops::softmax::softmax_forward(&mut y, &x, T, scale, false, T, Some(&view)))
    });
    g.finish();
    let mut g = c.benchmark_group(format!("softmax_backward ({B}x{H}x{T}x{T})"));
    g.bench_function("kernel", |b| {
        b.iter(|| softmax::softmax_backward(pool, &mut dx, &y, &dy, T, scale))
    });
    g.bench_function("reference", |b| {
        b.iter(|| ops::softmax::softmax_backward(&mut dx, &y, &dy, T, scale))
    });
    g.finish();
}

fn attention(c: &mut Criterion) {
    // One layer's attention, q/k/v contiguous (B, H, T, D), attention dropout 0.1 (BERT's):
    // the fused kernel (GEMMs + row softmax per (b, h), dropout mask regenerated) against the
    // reference op (scores, softmax, dropout and the two products as plain loops).
    let pool = Pool::global();
    let n = B * H * T * D;
    let (q, k, v, dout) = (random(n, 10), random(n, 11), random(n, 12), random(n, 13));
    let (scale, p, seed, offset) = (1.0 / (D as f32).sqrt(), 0.1f32, 5u64, 0u64);
    let s = [H * T * D, T * D, D];
    let plan = attention::AttnPlan {
        b: B,
        h: H,
        hkv: H,
        tq: T,
        tk: T,
        d: D,
        dv: D,
        scale,
        causal: false,
        dropout_p: p,
        offset,
        q: s,
        k: s,
        v: s,
        o: s,
        dq: s,
        dk: s,
        dvs: s,
        mask: None,
    };
    let dims = AttnDims { bh: B * H, rep: 1, tq: T, tk: T, d: D, dv: D };
    let cfg = AttnCfg { scale, causal: false, dropout_p: p, seed, offset };
    let (mut out, mut probs) = (vec![0f32; n], vec![0f32; B * H * T * T]);
    let mut ws = vec![
        0f32;
        plan.backward_workspace(pool.threads())
            .max(plan.forward_workspace(pool.threads()))
    ];
    let mut g = c.benchmark_group(format!("attention_forward ({B}x{H}x{T}x{D}, dropout 0.1)"));
    flat(&mut g);
    g.bench_function("kernel", |b| {
        // SAFETY: every buffer has the plan's (B, H, T, D) or (B·H, T, T) extent and the outputs
        // overlap nothing.
        b.iter(|| unsafe {
            attention::attention_forward(
                pool,
                &plan,
                out.as_mut_ptr(),
                &mut probs,
                q.as_ptr(),
                k.as_ptr(),
                v.as_ptr(),
                None,
                seed,
                &mut ws,
            )
        })
    });
    g.bench_function("reference", |b| {
        b.iter(|| {
            ops::attention::attention_forward(&mut out, &mut probs, &q, &k, &v, &dims, &cfg, None)
        })
    });
    g.finish();
    let (mut dq, mut dk, mut dv) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    let mut g = c.benchmark_group(format!("attention_backward ({B}x{H}x{T}x{D}, dropout 0.1)"));
    flat(&mut g);
    g.bench_function("kernel", |b| {
        // SAFETY: as for the forward.
        b.iter(|| unsafe {
            attention::attention_backward(
                pool,
                &plan,
                dq.as_mut_ptr(),
                dk.as_mut_ptr(),
                dv.as_mut_ptr(),
                dout.as_ptr(),
                q.as_ptr(),
                k.as_ptr(),
                v.as_ptr(),
                &probs,
                seed,
                &mut ws,
            )
        })
    });
    g.bench_function("reference", |b| {
        b.iter(|| {
            ops::attention::attention_backward(
                &mut dq, &mut dk, &mut dv, &dout, &q, &k, &v, &probs, &dims, &cfg,
            )
        })
    });
    g.finish();
}

fn cross_entropy(c: &mut Criterion) {
    // The MLM loss over the vocabulary: (B·T, V) logits, 15 % of rows labelled (HF's collator).
    let pool = Pool::global();
    let logits = random(ROWS * V, 14);
    let labels: Vec<i64> = ids(ROWS, V, 15)
        .iter()
        .enumerate()
        .map(|(i, &l)| if i % 20 < 3 { l } else { IGNORE })
        .collect();
    let mut ws = vec![0f32; ROWS];
    let mut dlogits = vec![0f32; ROWS * V];
    let mut g = c.benchmark_group(format!("cross_entropy_forward ({ROWS}x{V})"));
    flat(&mut g);
    g.bench_function("kernel", |b| {
        b.iter(|| {
            black_box(
                cross_entropy::cross_entropy_forward(pool, &logits, &labels, V, IGNORE, &mut ws)
                    .unwrap(),
            )
        })
    });
    g.bench_function("reference", |b| {
        b.iter(|| {
            black_box(
                ops::cross_entropy::cross_entropy_forward(&logits, &labels, V, IGNORE).unwrap(),
            )
        })
    });
    g.finish();
    let mut g = c.benchmark_group(format!("cross_entropy_backward ({ROWS}x{V})"));
    flat(&mut g);
    g.bench_function("kernel", |b| {
        b.iter(|| {
            cross_entropy::cross_entropy_backward(
                pool,
                &mut dlogits,
                1.0,
                Some(&logits),
                &labels,
                V,
                IGNORE,
            )
            .unwrap()
        })
    });
    g.bench_function("reference", |b| {
        b.iter(|| {
            ops::cross_entropy::cross_entropy_backward(
                &mut dlogits,
                1.0,
                &logits,
                &labels,
                V,
                IGNORE,
            )
            .unwrap()
        })
    });
    g.finish();
}

fn embedding(c: &mut Criterion) {
    // The word embedding: gather (B·T) rows of a (V, C) table; backward scatter-adds them.
    let pool = Pool::global();
    let table = random(V * C, 16);
    let tokens = ids(ROWS, V, 17);
    let dy = random(ROWS * C, 18);
    let (mut out, mut dtable) = (vec![0f32; ROWS * C], vec![0f32; V * C]);
    let mut g = c.benchmark_group(format!("embedding_forward ({ROWS} of {V}x{C})"));
    g.bench_function("kernel", |b| {
        b.iter(|| embedding::embedding_forward(pool, &mut out, &tokens, &table, C).unwrap())
    });
    g.bench_function("reference", |b| {
        b.iter(|| ops::embedding::embedding_forward(&mut out, &tokens, &table, C).unwrap())
    });
    g.finish();
    let mut g = c.benchmark_group(format!("embedding_backward ({ROWS} into {V}x{C})"));
    g.bench_function("kernel", |b| {
        b.iter(|| embedding::embedding_backward(pool, &mut dtable, &tokens, &dy, C).unwrap())
    });
    g.bench_function("reference", |b| {
        b.iter(|| ops::embedding::embedding_backward(&mut dtable, &tokens, &dy, C).unwrap())
    });
    g.finish();
}

/// The fused kernels of the passes' ops against the unfused kernels they replace (the planned
/// executor's own, so the difference is the fusion alone): `add_layernorm` (`fuse_add_layernorm`:
/// residual add + LayerNorm in one pass over each row) vs `add` then `layernorm`; the
/// `linear` epilogue (`fuse_matmul_bias`: bias + GELU in one pass after the GEMM) vs
/// `bias_add` then `gelu`.
fn fused(c: &mut Criterion) {
    let pool = Pool::global();
    let n = ROWS * C;
    let (a, r, w, bias) = (random(n, 21), random(n, 22), random(C, 23), random(C, 24));
    let (mut sum, mut y, mut mean, mut rstd) =
        (vec![0f32; n], vec![0f32; n], vec![0f32; ROWS], vec![0f32; ROWS]);
    let mut g = c.benchmark_group(format!("add_layernorm_forward ({ROWS}x{C})"));
    g.bench_function("fused", |b| {
        b.iter(|| {
            layernorm::add_layernorm_forward(
                pool,
                &mut sum,
                &mut y,
                &mut mean,
                &mut rstd,
                Some(&a),
                &r,
                &w,
                &bias,
                1e-12,
            )
        })
    });
    g.bench_function("unfused", |b| {
        b.iter(|| {
            elementwise::map2(pool, &mut sum, &a, &r, elementwise::Add);
            layernorm::layernorm_forward(
                pool, &mut y, &mut mean, &mut rstd, &sum, &w, &bias, 1e-12,
            );
        })
    });
    g.finish();
    // The MLP's first linear: pre = x·W (the GEMM, not timed here), then bias and GELU.
    let m = ROWS * I;
    let (x0, b1) = (random(m, 25), random(I, 26));
    let (mut pre, mut act) = (x0.clone(), vec![0f32; m]);
    let mut g = c.benchmark_group(format!("linear_bias_gelu_epilogue ({ROWS}x{I})"));
    g.bench_function("fused", |b| {
        b.iter(|| {
            pre.copy_from_slice(&x0);
            elementwise::bias_gelu(pool, &mut act, &mut pre, &b1, GeluApprox::Erf);
        })
    });
    g.bench_function("unfused", |b| {
        b.iter(|| {
            pre.copy_from_slice(&x0);
            elementwise::map2_inplace_a(pool, &mut pre, &b1, elementwise::Add);
            elementwise::map1(pool, &mut act, &pre, elementwise::Gelu(GeluApprox::Erf));
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = criterion();
    targets = gelu, layernorm, softmax, attention, cross_entropy, embedding, fused
}
criterion_main!(benches);
