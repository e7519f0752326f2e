//! Fast f32 CPU kernels of the planned executor, one small module per op family, each with a
//! shape comment per tensor argument, a reference to the op it implements, and a test against
//! that reference op (`crate::ops`) on random, never-zero inputs with a stated tolerance.
//!
//! Threading: every kernel takes the [`Pool`](super::pool::Pool) and splits its work into at
//! most `threads` contiguous parts (rows, columns, (batch, head) pairs, GEMM row blocks), or
//! stays on the calling thread when the work is too small to pay a wake-up. Vectorisation: hot
//! loops are compiled for AVX-512 / AVX2 and picked at run time ([`simd`]).

pub mod attention;
pub mod copy;
pub mod cross_entropy;
pub mod elementwise;
pub mod embedding;
pub mod layernorm;
pub mod linear_cross_entropy;
pub mod matmul;
pub mod pointwise;
pub mod reduce;
pub mod rmsnorm;
pub mod rotary;
pub mod simd;
pub mod softmax;

/// `cargo test --release -p ortbench-engine --lib bench_kernels -- --ignored --nocapture`:
/// throughput of each kernel on bert-base's b8×s128 shapes (run on an idle machine).
#[cfg(test)]
mod bench {
    use super::*;
    use crate::backend::cpu::pool::Pool;
    use crate::ops::gelu::GeluApprox;
    use std::time::Instant;

    fn time(reps: usize, mut f: impl FnMut()) -> f64 {
        f();
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        t.elapsed().as_secs_f64() / reps as f64
    }

    #[test]
    #[ignore]
    fn bench_kernels() {
        let pool = Pool::global();
        println!("simd level {:?}, {} threads", simd::level(), pool.threads());
        let (rows, c, i) = (1024usize, 768usize, 3072usize);
        let n = rows * i;
        let x: Vec<f32> =
            (0..n).map(|k| ((k * 7919 % 2000) as f32 - 1000.0) / 300.0 + 1e-3).collect();
        let dy: Vec<f32> =
            (0..n).map(|k| ((k * 104729 % 2000) as f32 - 1000.0) / 1000.0 + 1e-3).collect();
        let mut out = vec![0f32; n];
        let report = |name: &str, secs: f64, elems: usize| {
            println!(
                "{name:<28} {:>8.3} ms  {:>6.2} ns/elem",
                secs * 1e3,
                secs * 1e9 / elems as f64
            )
        };
        for approx in [GeluApprox::Erf, GeluApprox::Tanh] {
            report(
                &format!("gelu {approx:?}"),
                time(10, || elementwise::map1(pool, &mut out, &x, elementwise::Gelu(approx))),
                n,
            );
            report(
                &format!("gelu_backward {approx:?}"),
                time(10, || {
                    elementwise::map2(pool, &mut out, &x, &dy, elementwise::GeluBackward(approx))
                }),
                n,
            );
        }
        report("add", time(10, || elementwise::map2(pool, &mut out, &x, &dy, elementwise::Add)), n);
        let mut xo = x.clone();
        report(
            "add in place",
            time(10, || elementwise::map2_inplace_a(pool, &mut xo, &dy, elementwise::Add)),
            n,
        );
        report("dropout", time(10, || elementwise::dropout(pool, &mut out, &x, 0.1, 1, 0)), n);
        let m = rows * c;
        let (w, b) = (vec![1.1f32; c], vec![0.1f32; c]);
        let (mut mean, mut rstd) = (vec![0f32; rows], vec![0f32; rows]);
        report(
            "layernorm",
            time(10, || {
                layernorm::layernorm_forward(
                    pool,
                    &mut out[..m],
                    &mut mean,
                    &mut rstd,
                    &x[..m],
                    &w,
                    &b,
                    1e-12,
                )
            }),
            m,
        );
        let (mut dw, mut db) = (vec![0f32; c], vec![0f32; c]);
        let mut ws = vec![0f32; layernorm::backward_workspace(pool.threads(), c)];
        let mut dx = vec![0f32; m];
        report(
            "layernorm_backward",
            time(10, || {
                layernorm::layernorm_backward(
                    pool,
                    &mut dx,
                    &mut dw,
                    &mut db,
                    &dy[..m],
                    &x[..m],
                    &w,
                    &mean,
                    &rstd,
                    &mut ws,
                )
            }),
            m,
        );
        let mut bias = vec![0f32; c];
        report(
            "reduce_sum_leading",
            time(10, || reduce::reduce_sum_leading(pool, &mut bias, &dy[..m])),
            m,
        );
        // Cross-entropy on (1024, 30522).
        let v = 30522;
        let logits: Vec<f32> =
            (0..rows * v).map(|k| ((k * 7919 % 2000) as f32 - 1000.0) / 300.0).collect();
        let labels: Vec<i64> = (0..rows).map(|r| (r * 31 % v) as i64).collect();
        let mut lws = vec![0f32; rows];
        report(
            "cross_entropy",
            time(3, || {
                cross_entropy::cross_entropy_forward(pool, &logits, &labels, v, -100, &mut lws)
                    .unwrap();
            }),
            rows * v,
        );
        let mut dl = vec![0f32; rows * v];
        report(
            "cross_entropy_backward",
            time(3, || {
                cross_entropy::cross_entropy_backward(
                    pool,
                    &mut dl,
                    1.0,
                    Some(&logits),
                    &labels,
                    v,
                    -100,
                )
                .unwrap()
            }),
            rows * v,
        );
        let mut vb = vec![0f32; v];
        report(
            "reduce_sum_leading (V)",
            time(3, || reduce::reduce_sum_leading(pool, &mut vb, &logits)),
            rows * v,
        );
        let mut table = vec![0f32; v * c];
        let ids: Vec<i64> = (0..rows).map(|r| (r * 7 % v) as i64).collect();
        report(
            "embedding_backward (V)",
            time(3, || embedding::embedding_backward(pool, &mut table, &ids, &dy[..m], c).unwrap()),
            v * c,
        );
        // attention (B=8, H=12, T=128, D=64) with q/k/v inside (B, T, C) rows.
        let (bb, h, t, d) = (8usize, 12usize, 128usize, 64usize);
        let s = [t * c, d, c];
        let plan = attention::AttnPlan {
            b: bb,
            h,
            hkv: h,
            tq: t,
            tk: t,
            d,
            dv: d,
            scale: 0.125,
            causal: false,
            dropout_p: 0.1,
            offset: 0,
            q: s,
            k: s,
            v: s,
            o: s,
            dq: s,
            dk: s,
            dvs: s,
            mask: None,
        };
        let mut probs = vec![0f32; bb * h * t * t];
        let mut aws = vec![0f32; plan.backward_workspace(pool.threads())];
        let qkv = &x[..m];
        let mut o = vec![0f32; m];
        let fwd = time(5, || unsafe {
            attention::attention_forward(
                pool,
                &plan,
                o.as_mut_ptr(),
                &mut probs,
                qkv.as_ptr(),
                qkv.as_ptr(),
                qkv.as_ptr(),
                None,
                1,
                &mut aws,
            )
        });
        report("attention (per layer)", fwd, bb * h * t * t);
        let (mut g1, mut g2, mut g3) = (vec![0f32; m], vec![0f32; m], vec![0f32; m]);
        let bwd = time(5, || unsafe {
            attention::attention_backward(
                pool,
                &plan,
                g1.as_mut_ptr(),
                g2.as_mut_ptr(),
                g3.as_mut_ptr(),
                dy.as_ptr(),
                qkv.as_ptr(),
                qkv.as_ptr(),
                qkv.as_ptr(),
                &probs,
                1,
                &mut aws,
            )
        });
        report("attention_backward (per layer)", bwd, bb * h * t * t);
        let flops = 4.0 * (bb * h * t * t * d) as f64;
        println!(
            "attention GEMM rate: forward {:.0} GFLOP/s, backward {:.0} GFLOP/s",
            flops / fwd / 1e9,
            2.0 * flops / bwd / 1e9
        );
        let causal = attention::AttnPlan { causal: true, ..plan.clone() };
        let cf = time(5, || unsafe {
            attention::attention_forward(
                pool,
                &causal,
                o.as_mut_ptr(),
                &mut probs,
                qkv.as_ptr(),
                qkv.as_ptr(),
                qkv.as_ptr(),
                None,
                1,
                &mut aws,
            )
        });
        report("causal attention (per layer)", cf, bb * h * t * t);
        let cb = time(5, || unsafe {
            attention::attention_backward(
                pool,
                &causal,
                g1.as_mut_ptr(),
                g2.as_mut_ptr(),
                g3.as_mut_ptr(),
                dy.as_ptr(),
                qkv.as_ptr(),
                qkv.as_ptr(),
                qkv.as_ptr(),
                &probs,
                1,
                &mut aws,
            )
        });
        report("causal attention_backward", cb, bb * h * t * t);
    }
}
