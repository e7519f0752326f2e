//! The engine's fused multi-tensor AdamW (one pass over the flat buffer: gradient norm, then
//! clip, decay, both moments and the update in one loop) against a per-tensor AdamW written
//! the way torch.optim.AdamW(foreach=False) runs: `clip_grad_norm_` tensor by tensor, then per
//! parameter tensor one op after another (`mul_`, `lerp_`, `mul_`/`addcmul_`, `sqrt`/`div`/
//! `add_` into a fresh `denom`, `addcdiv_`), each a separate pass over memory. On bert-base's
//! parameter tensors (the group's name gives their count and size).
//!
//! Lines: `fused` (all cores), `fused 1 thread` and `per-tensor 1 thread` — the last two
//! compare the fusion alone, the first adds the threads the engine uses.
//!
//! `cargo bench -p ortbench --bench adamw`

mod common;

use common::*;
use criterion::{criterion_group, criterion_main, Criterion};
use ortbench_engine::optim::{AdamW, AdamWConfig, ParamMirror, Segment};
use ortbench_models::{param_specs, spec::builtin_config};

/// torch's `_single_tensor_adamw` for one tensor at step `t` (weight decay when `decay`).
#[allow(
    clippy::too_many_arguments,
    reason = "torch's fused AdamW takes each tensor list and hyperparameter"
)]
fn adamw_tensor(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    cfg: &AdamWConfig,
    lr: f32,
    t: i32,
    decay: bool,
) {
    let (b1, b2) = (cfg.beta1, cfg.beta2);
    // param.mul_(1 - lr * weight_decay)
    if decay {
        let f = 1.0 - lr * cfg.weight_decay;
        p.iter_mut().for_each(|x| *x *= f);
    }
    // exp_avg.lerp_(grad, 1 - beta1)
    m.iter_mut().zip(g).for_each(|(m, &g)| *m += (1.0 - b1) * (g - *m));
    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    v.iter_mut().for_each(|v| *v *= b2);
    v.iter_mut().zip(g).for_each(|(v, &g)| *v += (1.0 - b2) * g * g);
    let bc1 = 1.0 - b1.powi(t);
    let bc2_sqrt = (1.0 - b2.powi(t)).sqrt();
    // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps): a new tensor
    let mut denom: Vec<f32> = v.iter().map(|v| v.sqrt()).collect();
    denom.iter_mut().for_each(|d| *d /= bc2_sqrt);
    denom.iter_mut().for_each(|d| *d += cfg.eps);
    // param.addcdiv_(exp_avg, denom, value=-step_size)
    let step_size = lr / bc1;
    p.iter_mut().zip(m.iter()).zip(&denom).for_each(|((p, &m), &d)| *p -= step_size * m / d);
}

/// `clip_grad_norm_(foreach=False)`: one norm per tensor, the total, then each gradient scaled.
fn clip_per_tensor(grads: &mut [Vec<f32>], max_norm: f32) {
    let norms: Vec<f32> =
        grads.iter().map(|g| g.iter().map(|x| x * x).sum::<f32>().sqrt()).collect();
    let total = norms.iter().map(|n| n * n).sum::<f32>().sqrt();
    let coef = (max_norm / (total + 1e-6)).min(1.0);
    for g in grads.iter_mut() {
        g.iter_mut().for_each(|x| *x *= coef);
    }
}

fn adamw(c: &mut Criterion) {
    let specs = param_specs(&builtin_config("bert-base-uncased").expect("bert-base config"));
    let sizes: Vec<usize> = specs.iter().map(|s| s.shape.iter().product()).collect();
    let total: usize = sizes.iter().sum();
    let cfg =
        AdamWConfig { lr: 5e-5, weight_decay: 0.01, max_grad_norm: 1.0, ..AdamWConfig::default() };

    // Fused: flat buffers, one segment per tensor (the engine merges neighbours with the same
    // decay; one per tensor is its worst case).
    let mut segments = Vec::new();
    let mut start = 0;
    for (s, &len) in specs.iter().zip(&sizes) {
        segments.push(Segment { start, len, decay: s.decay });
        start += len;
    }
    let grads = random(total, 1);
    let mut params = random(total, 2);
    let mut fused = AdamW::new(cfg, segments.clone(), total);
    let mut fused_1t = AdamW::new(cfg, segments, total);
    fused_1t.threads = 1;

    // Per-tensor: one allocation per parameter, its gradient and both moments.
    let mut p_t: Vec<Vec<f32>> =
        sizes.iter().enumerate().map(|(i, &n)| random(n, 100 + i as u64)).collect();
    let mut g_t: Vec<Vec<f32>> =
        sizes.iter().enumerate().map(|(i, &n)| random(n, 1000 + i as u64)).collect();
    let mut m_t: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0f32; n]).collect();
    let mut v_t: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0f32; n]).collect();
    let mut t = 0;

    let mut g = c.benchmark_group(format!(
        "adamw step (bert-base: {} tensors, {total} params)",
        sizes.len()
    ));
    flat(&mut g);
    g.bench_function("fused", |b| {
        b.iter(|| fused.step(&mut params, &grads, 1.0, cfg.lr, ParamMirror::None))
    });
    g.bench_function("fused 1 thread", |b| {
        b.iter(|| fused_1t.step(&mut params, &grads, 1.0, cfg.lr, ParamMirror::None))
    });
    g.bench_function("per-tensor 1 thread", |b| {
        b.iter(|| {
            t += 1;
            clip_per_tensor(&mut g_t, cfg.max_grad_norm);
            for (i, s) in specs.iter().enumerate() {
                adamw_tensor(
                    &mut p_t[i],
                    &g_t[i],
                    &mut m_t[i],
                    &mut v_t[i],
                    &cfg,
                    cfg.lr,
                    t,
                    s.decay,
                );
            }
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = criterion();
    targets = adamw
}
criterion_main!(benches);
