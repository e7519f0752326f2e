//! Each fast CPU kernel of the planned executor (`engine/src/backend/cpu/kernels`) against the
//! reference op it is tested against (`engine/src/ops`: plain loops, one thread), on the same
//! random inputs at bert-base's b8 × s128 training shapes. One group per kernel (and variant:
//! GELU erf and tanh, attention and causal attention, cross-entropy on bert's masked labels and
//! on every row), two lines: `kernel` and `reference` (attention has a third, the kernel on the
//! executor's strided layout); and the passes' fused kernels against the unfused kernels they
//! replace (`fused` vs `unfused`), rotary on strided rows against a permute copy and the dense
//! kernel (`rotary`), the LM head (`lm_head`, at gpt2's b8 × s512 head) last.
//!
//! `cargo bench -p ortbench --bench kernels`; one group: `cargo bench -p ortbench --bench
//! kernels -- lm_head`

mod common;

use common::*;
use criterion::{criterion_group, criterion_main, Criterion};
use ortbench_engine::backend::cpu::blas;
use ortbench_engine::backend::cpu::kernels::linear_cross_entropy::{self as lce, Lce, LceGrads};
use ortbench_engine::backend::cpu::kernels::{
    attention, cross_entropy, elementwise, embedding, layernorm, reduce, softmax,
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
    // erf (BERT's `gelu`) and the tanh approximation (GPT-2's `gelu_new`).
    for (approx, what) in [(GeluApprox::Erf, ""), (GeluApprox::Tanh, " tanh")] {
        let mut g = c.benchmark_group(format!("gelu_forward{what} ({ROWS}x{I})"));
        g.bench_function("kernel", |b| {
            b.iter(|| elementwise::map1(pool, &mut out, &x, elementwise::Gelu(approx)))
        });
        g.bench_function("reference", |b| b.iter(|| ops::gelu::gelu_forward(&mut out, &x, approx)));
        g.finish();
        let mut g = c.benchmark_group(format!("gelu_backward{what} ({ROWS}x{I})"));
        g.bench_function("kernel", |b| {
            b.iter(|| elementwise::map2(pool, &mut out, &x, &dy, elementwise::GeluBackward(approx)))
        });
        g.bench_function("reference", |b| {
            b.iter(|| ops::gelu::gelu_backward(&mut out, &x, &dy, approx))
        });
        g.finish();
    }
}

/// The residual add (two (B·T, 4C) operands; `kernel in place` writes into the first, as the
/// executor does when the operand dies there) and dropout at BERT's p = 0.1.
fn add_dropout(c: &mut Criterion) {
    let pool = Pool::global();
    let n = ROWS * I;
    let (a, r) = (random(n, 31), random(n, 32));
    let (mut out, mut ao) = (vec![0f32; n], a.clone());
    let mut g = c.benchmark_group(format!("add ({ROWS}x{I})"));
    g.bench_function("kernel", |b| {
        b.iter(|| elementwise::map2(pool, &mut out, &a, &r, elementwise::Add))
    });
    g.bench_function("kernel in place", |b| {
        b.iter(|| elementwise::map2_inplace_a(pool, &mut ao, &r, elementwise::Add))
    });
    g.bench_function("reference", |b| b.iter(|| ops::add::add_forward(&mut out, &a, &r)));
    g.finish();
    let (p, seed, offset) = (0.1f32, 5u64, 0u64);
    let mut g = c.benchmark_group(format!("dropout ({ROWS}x{I}, p 0.1)"));
    g.bench_function("kernel", |b| {
        b.iter(|| elementwise::dropout(pool, &mut out, &a, p, seed, offset))
    });
    g.bench_function("reference", |b| {
        b.iter(|| ops::dropout::dropout_forward(&mut out, &a, p, seed, offset))
    });
    g.finish();
}

/// The column sum over rows that makes a bias's gradient: a hidden-width bias (B·T, C) and the
/// LM head's vocabulary-wide one (B·T, V).
fn reduce_sum_leading(c: &mut Criterion) {
    let pool = Pool::global();
    for (n, seed) in [(C, 33), (V, 34)] {
        let x = random(ROWS * n, seed);
        let mut out = vec![0f32; n];
        let mut g = c.benchmark_group(format!("reduce_sum_leading ({ROWS}x{n})"));
        g.bench_function("kernel", |b| b.iter(|| reduce::reduce_sum_leading(pool, &mut out, &x)));
        g.bench_function("reference", |b| b.iter(|| ops::add::reduce_sum_leading(&mut out, &x)));
        g.finish();
    }
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
    // One layer's attention, attention dropout 0.1 (BERT's): the fused kernel (GEMMs + row
    // softmax per (b, h), dropout mask regenerated) against the reference op (scores, softmax,
    // dropout and the two products as plain loops), then the same causal (GPT-2's); the
    // kernel's backward recomputes the probabilities from the forward's row statistics, the
    // reference's reads them. Lines:
    // `kernel` with q/k/v, the output and their gradients contiguous (B, H, T, D), as the
    // reference reads them; `kernel (B,T,C) rows` with each of them inside the (B, T, C) rows
    // of the projection that makes or reads it (head h at columns h·D..(h + 1)·D), as the
    // planned executor lays them out when it folds the head permutes; `reference`.
    let pool = Pool::global();
    let n = B * H * T * D;
    assert_eq!(n, ROWS * C, "the (B, T, C) rows hold every head");
    let (q, k, v, dout) = (random(n, 10), random(n, 11), random(n, 12), random(n, 13));
    let (scale, p, seed, offset) = (1.0 / (D as f32).sqrt(), 0.1f32, 5u64, 0u64);
    let s = [H * T * D, T * D, D];
    let r = [T * C, D, C];
    let (mut out, mut probs) = (vec![0f32; n], vec![0f32; B * H * T * T]);
    let mut stats = vec![0f32; B * H * T * 2];
    let (mut dq, mut dk, mut dv) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    for causal in [false, true] {
        let plan = attention::AttnPlan {
            b: B,
            h: H,
            hkv: H,
            tq: T,
            tk: T,
            d: D,
            dv: D,
            scale,
            causal,
            dropout_p: p,
            offset,
            softcap: None,
            q: s,
            k: s,
            v: s,
            o: s,
            dq: s,
            dk: s,
            dvs: s,
            mask: None,
        };
        let rows =
            attention::AttnPlan { q: r, k: r, v: r, o: r, dq: r, dk: r, dvs: r, ..plan.clone() };
        let dims = AttnDims { bh: B * H, rep: 1, tq: T, tk: T, d: D, dv: D };
        let cfg = AttnCfg { scale, causal, dropout_p: p, seed, offset, softcap: None };
        let threads = pool.threads();
        let ws_len = [&plan, &rows]
            .iter()
            .map(|pl| pl.backward_workspace(threads).max(pl.forward_workspace(threads)))
            .max()
            .unwrap_or(0);
        let mut ws = vec![0f32; ws_len];
        let what = if causal { " causal" } else { "" };
        let mut g =
            c.benchmark_group(format!("attention_forward{what} ({B}x{H}x{T}x{D}, dropout 0.1)"));
        flat(&mut g);
        for (line, pl) in [("kernel", &plan), ("kernel (B,T,C) rows", &rows)] {
            g.bench_function(line, |b| {
                // SAFETY: every buffer holds B·H·T·D = B·T·C elements, which both layouts'
                // strides stay within, and the outputs overlap nothing.
                b.iter(|| unsafe {
                    attention::attention_forward(
                        pool,
                        pl,
                        out.as_mut_ptr(),
                        &mut stats,
                        q.as_ptr(),
                        k.as_ptr(),
                        v.as_ptr(),
                        None,
                        seed,
                        &mut ws,
                    )
                })
            });
        }
        g.bench_function("reference", |b| {
            b.iter(|| {
                ops::attention::attention_forward(
                    &mut out, &mut probs, &q, &k, &v, &dims, &cfg, None,
                )
            })
        });
        g.finish();
        let mut g =
            c.benchmark_group(format!("attention_backward{what} ({B}x{H}x{T}x{D}, dropout 0.1)"));
        flat(&mut g);
        for (line, pl) in [("kernel", &plan), ("kernel (B,T,C) rows", &rows)] {
            g.bench_function(line, |b| {
                // SAFETY: as for the forward.
                b.iter(|| unsafe {
                    attention::attention_backward(
                        pool,
                        pl,
                        (dq.as_mut_ptr(), dk.as_mut_ptr(), dv.as_mut_ptr()),
                        dout.as_ptr(),
                        q.as_ptr(),
                        k.as_ptr(),
                        v.as_ptr(),
                        None,
                        &stats,
                        seed,
                        &mut ws,
                    )
                })
            });
        }
        g.bench_function("reference", |b| {
            b.iter(|| {
                ops::attention::attention_backward(
                    &mut dq, &mut dk, &mut dv, &dout, &q, &k, &v, &probs, &dims, &cfg,
                )
            })
        });
        g.finish();
    }
}

fn cross_entropy(c: &mut Criterion) {
    // The loss over the vocabulary: (B·T, V) logits; the MLM's labels, 15 % of rows labelled
    // (HF's collator; the kernels skip the ignored rows), and every row labelled (a causal
    // LM's).
    let pool = Pool::global();
    let logits = random(ROWS * V, 14);
    let every = ids(ROWS, V, 15);
    let mlm: Vec<i64> =
        every.iter().enumerate().map(|(i, &l)| if i % 20 < 3 { l } else { IGNORE }).collect();
    let mut ws = vec![0f32; ROWS];
    let mut dlogits = vec![0f32; ROWS * V];
    for (labels, what) in [(&mlm, ""), (&every, " every row labelled")] {
        let mut g = c.benchmark_group(format!("cross_entropy_forward{what} ({ROWS}x{V})"));
        flat(&mut g);
        g.bench_function("kernel", |b| {
            b.iter(|| {
                black_box(
                    cross_entropy::cross_entropy_forward(pool, &logits, labels, V, IGNORE, &mut ws)
                        .unwrap(),
                )
            })
        });
        g.bench_function("reference", |b| {
            b.iter(|| {
                black_box(
                    ops::cross_entropy::cross_entropy_forward(&logits, labels, V, IGNORE).unwrap(),
                )
            })
        });
        g.finish();
        let mut g = c.benchmark_group(format!("cross_entropy_backward{what} ({ROWS}x{V})"));
        flat(&mut g);
        g.bench_function("kernel", |b| {
            b.iter(|| {
                cross_entropy::cross_entropy_backward(
                    pool,
                    &mut dlogits,
                    1.0,
                    Some(&logits),
                    labels,
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
                    labels,
                    V,
                    IGNORE,
                )
                .unwrap()
            })
        });
        g.finish();
    }
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

/// The fused LM head (`linear_cross_entropy`: the loss and every gradient from one sweep over
/// chunks of rows, the logits never whole) against the unfused kernels it replaces (logits
/// GEMM, cross-entropy forward, its backward in place, dx GEMM, dw GEMM), at gpt2's b8 × s512
/// head: 4096 rows (8 of them ignored), C 768, V 50257, no bias, the chunk the executor picks
/// for this pool. Each iteration takes seconds on 2 cores, so this group takes minutes.
fn lm_head(c: &mut Criterion) {
    let pool = Pool::global();
    let (r, v) = (B * 512, 50257usize); // gpt2's head at b8 × s512
    let x = random(r * C, 41);
    let w: Vec<f32> = random(v * C, 42).iter().map(|a| 0.05 * a).collect();
    let labels: Vec<i64> = ids(r, v, 43)
        .iter()
        .enumerate()
        .map(|(i, &l)| if i % 512 == 511 { IGNORE } else { l })
        .collect();
    let chunk = lce::chunk_rows(v, pool.threads());
    let mut ws = vec![0f32; lce::workspace(r, C, v, chunk)];
    let (mut dx, mut dw) = (vec![0f32; r * C], vec![0f32; v * C]);
    let (mut logits, mut losses) = (vec![0f32; r * v], vec![0f32; r]);
    let p = Lce {
        x: &x,
        w: &w,
        labels: &labels,
        bias: None,
        c: C,
        v,
        ignore_index: IGNORE,
        softcap: None,
        chunk,
        skip_ignored: true,
        kind: ortbench_engine::backend::cpu::blas::GemmKind::F32,
    };
    let mut g = c.benchmark_group(format!(
        "lm_head loss and gradients ({r}x{C} x vocab {v}, chunk {chunk} rows)"
    ));
    flat(&mut g);
    g.bench_function("fused", |b| {
        b.iter(|| {
            let grads = LceGrads { dloss: 1.0, dx: &mut dx, dw: &mut dw, db: None };
            black_box(lce::linear_cross_entropy(pool, &p, &mut ws, Some(grads)).unwrap())
        })
    });
    g.bench_function("unfused", |b| {
        b.iter(|| {
            // SAFETY: x (R, C), w (V, C), logits (R, V), dx (R, C) and dw (V, C) are dense at
            // these leading dimensions, and no output overlaps an input.
            unsafe {
                blas::sgemm_par(
                    pool,
                    false,
                    true,
                    r,
                    v,
                    C,
                    1.0,
                    x.as_ptr(),
                    C,
                    w.as_ptr(),
                    C,
                    0.0,
                    logits.as_mut_ptr(),
                    v,
                )
            };
            let loss = cross_entropy::cross_entropy_forward(
                pool,
                &logits,
                &labels,
                v,
                IGNORE,
                &mut losses,
            )
            .unwrap();
            cross_entropy::cross_entropy_backward(pool, &mut logits, 1.0, None, &labels, v, IGNORE)
                .unwrap();
            // SAFETY: as above.
            unsafe {
                blas::sgemm_par(
                    pool,
                    false,
                    false,
                    r,
                    C,
                    v,
                    1.0,
                    logits.as_ptr(),
                    v,
                    w.as_ptr(),
                    C,
                    0.0,
                    dx.as_mut_ptr(),
                    C,
                );
                blas::sgemm_par(
                    pool,
                    true,
                    false,
                    v,
                    C,
                    r,
                    1.0,
                    logits.as_ptr(),
                    v,
                    x.as_ptr(),
                    C,
                    0.0,
                    dw.as_mut_ptr(),
                    C,
                );
            }
            black_box(loss)
        })
    });
    g.finish();
}

/// Rotary on q as a Llama step runs it (smollm2-135m's 9 heads of 64 at b8 × s128): `strided`
/// reads q where its projection wrote it, (B, T, H, D) seen as (B, H, T, D), and writes y
/// dense (what the plan runs since the head permute folds into the kernel's rows);
/// `permute then dense` is what ran before: the permute's strided copy, then the dense kernel.
fn rotary(c: &mut Criterion) {
    use ortbench_engine::backend::cpu::kernels::{copy, rotary::*, rows::RowsAt};
    use ortbench_engine::backend::cpu::pool::SyncPtr;
    let pool = Pool::global();
    let (h, n) = (9usize, ROWS * 9 * D);
    let q = random(n, 61); // (B, T, H, D)
    let (cos, sin) = (random(T * D, 62), random(T * D, 63));
    let (mut tmp, mut y) = (vec![0f32; n], vec![0f32; n]);
    let lead = [B, h, T];
    let (qs, ys) = ([T * h * D, D, h * D], [h * T * D, T * D, D]);
    let mut g = c.benchmark_group(format!("rotary (B {B}, H {h}, T {T}, D {D})"));
    g.bench_function("strided", |b| {
        b.iter(|| {
            let at = |p: *mut f32, strides| RowsAt { ptr: SyncPtr(p), lead: &lead, strides };
            let x = at(q.as_ptr() as *mut f32, &qs[..]);
            // SAFETY: both layouts address B·H·T rows of D inside their vectors; y is apart.
            unsafe { rotary_rows(pool, at(y.as_mut_ptr(), &ys[..]), Some(x), &cos, &sin, D, false) }
        })
    });
    g.bench_function("permute then dense", |b| {
        b.iter(|| {
            // SAFETY: q (B, T, H, D) read as (B, H, T, D) into the dense tmp of the same size.
            unsafe {
                copy::copy_strided(
                    pool,
                    q.as_ptr(),
                    &[B, h, T, D],
                    &[T * h * D, D, h * D, 1],
                    tmp.as_mut_ptr(),
                    &[B, h, T, D],
                    &[h * T * D, T * D, D, 1],
                )
            };
            ortbench_engine::backend::cpu::kernels::rotary::rotary(
                pool,
                &mut y,
                Some(&tmp),
                &cos,
                &sin,
                D,
                false,
            )
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = criterion();
    targets = gelu, add_dropout, reduce_sum_leading, layernorm, softmax, attention, cross_entropy,
        embedding, fused, rotary, lm_head
}
criterion_main!(benches);
