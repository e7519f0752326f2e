//! The engine's fused AdamW (engine/src/optim/adamw.rs: one pass over a flat buffer with decay
//! and no-decay segments, global-norm clipping folded into the gradient multiplier) against
//! what HF Trainer runs under libtorch: `torch.nn.utils.clip_grad_norm_` over all gradients,
//! then torch.optim.AdamW(fused=True) — ATen's `_fused_adamw_`, one call per param group
//! (weight decay, then none), through `ortbench_models::torch::FusedAdamW`.
//!
//! Cases: five tensors of uneven sizes (3001 and 517 among them, 5615 elements in all), two
//! decaying and three not, laid out interleaved in the engine's flat buffer; random parameters
//! and gradients, never zero; 6 steps with a changing learning rate (a schedule), gradient
//! scales putting the global norm above max_grad_norm at 3 steps (clipped) and below it at 3
//! (not clipped), checked on both sides.
//!
//! Tolerance, per element, f32 on both sides: |engine − torch| ≤ 4e-7·|torch| + 1e-9. Both
//! compute the same formula on the same f32 inputs (the clip coefficient in f32 on both sides)
//! but not in the same order of operations (torch's vectorised CPU kernel has its own, and may
//! contract into FMAs): about an ulp of p per step at most, |p| < 1 here, so 6 steps stay
//! within a few ulp (2^-23 ≈ 1.2e-7 relative; measured worst 0.28 of the bound, one ulp). The
//! 1e-9 floor is for a parameter near zero, where the rounding is that of the update (≤ 1e-3,
//! ulp ≈ 1e-10). The bound (< 5e-7) is a small fraction of one update (lr ≥ 2e-4 times
//! |m̂/√v̂|, of order 1 with these random gradients): a wrong moment, bias correction, clip
//! coefficient or learning rate moves parameters by far more, as does a decay of
//! lr·wd·|p| ≥ 2e-5·|p| in the wrong group.

use ortbench_engine::optim::adamw::{AdamW, AdamWConfig, ParamMirror, Segment};
use ortbench_models::torch::{FusedAdamW, StepOutcome};
use tch::{Kind, Tensor};

/// (name, elements, decays): weights decay, biases and LayerNorm parameters do not (HF's
/// `get_decay_parameter_names`).
const TENSORS: [(&str, usize, bool); 5] = [
    ("dense.weight", 3001, true),
    ("dense.bias", 517, false),
    ("LayerNorm.weight", 61, false),
    ("out.weight", 1999, true),
    ("out.bias", 37, false),
];

/// Per step: the learning rate and the gradients' scale. |g| is uniform in [0.01, 1) times the
/// scale, so the global norm is ≈ scale·√(5615/3) ≈ 43·scale: above max_grad_norm = 1 at
/// scales 1, 0.5 and 0.1, below it at 0.01, 0.02 and 0.005.
const STEPS: [(f32, f32); 6] =
    [(2e-4, 0.01), (1e-3, 1.0), (1e-3, 0.02), (8e-4, 0.5), (6e-4, 0.005), (4e-4, 0.1)];

const MAX_GRAD_NORM: f32 = 1.0;
const WEIGHT_DECAY: f32 = 0.1;

/// A deterministic generator (xorshift64): values in ±[0.01, 1), never zero.
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let mag = 0.01 + 0.99 * ((s >> 11) as f64 / (1u64 << 53) as f64);
            (if s & 1 == 0 { mag } else { -mag }) as f32
        })
        .collect()
}

fn to_vec(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()
}

#[test]
fn engine_adamw_matches_torch_fused_adamw_after_clip_grad_norm_with_decay_groups() {
    let cfg = AdamWConfig {
        lr: STEPS[0].0,
        weight_decay: WEIGHT_DECAY,
        max_grad_norm: MAX_GRAD_NORM,
        ..AdamWConfig::default()
    };
    // The engine: one flat buffer, one segment per tensor, in TENSORS order.
    let mut segments = Vec::new();
    let mut start = 0;
    for &(_, len, decay) in &TENSORS {
        segments.push(Segment { start, len, decay });
        start += len;
    }
    let n = start;
    let mut opt = AdamW::new(cfg, segments.clone(), n);
    let mut p = random(n, 1);

    // torch: one leaf tensor per parameter, from the same values, in two param groups.
    let params: Vec<Tensor> = segments
        .iter()
        .map(|s| Tensor::from_slice(&p[s.start..s.start + s.len]).set_requires_grad(true))
        .collect();
    let group = |decay: bool| -> Vec<Tensor> {
        TENSORS
            .iter()
            .zip(&params)
            .filter(|((_, _, d), _)| *d == decay)
            .map(|(_, t)| t.shallow_clone())
            .collect()
    };
    let mut torch = FusedAdamW::new(
        vec![(group(true), f64::from(WEIGHT_DECAY)), (group(false), 0.0)],
        f64::from(cfg.lr),
        f64::from(cfg.beta1),
        f64::from(cfg.beta2),
        f64::from(cfg.eps),
    );

    let mut clipped = Vec::new();
    for (step, &(lr, scale)) in STEPS.iter().enumerate() {
        let g: Vec<f32> = random(n, 100 + step as u64).iter().map(|x| x * scale).collect();

        let stats = opt.step(&mut p, &g, 1.0, lr, ParamMirror::None);
        assert!(stats.finite, "step {step}: engine found a non-finite gradient");

        // torch: p.grad = g exactly (d/dp Σ p·g), then clip_grad_norm_ as torch writes it
        // (foreach norms, the norm of the stacked norms, coef = max/(norm + 1e-6) clamped at 1,
        // every gradient multiplied in place, all f32 tensors), then the optimizer step.
        torch.zero_grad();
        for (t, s) in params.iter().zip(&segments) {
            let gt = Tensor::from_slice(&g[s.start..s.start + s.len]);
            (t * gt).sum(Kind::Float).backward();
        }
        let torch_norm = tch::no_grad(|| {
            let grads: Vec<Tensor> = params.iter().map(Tensor::grad).collect();
            let norms: Vec<Tensor> = grads.iter().map(Tensor::norm).collect();
            let total = Tensor::stack(&norms, 0).norm();
            let coef = (f64::from(MAX_GRAD_NORM) / (&total + 1e-6)).clamp_max(1.0);
            for gr in &grads {
                let _ = gr.shallow_clone().g_mul_(&coef);
            }
            total.double_value(&[])
        });
        torch.set_lr(f64::from(lr));
        assert_eq!(tch::no_grad(|| torch.step(None)).unwrap(), StepOutcome::Applied);

        // Both saw the same global norm, and clipping acted where the case says it does.
        let rel = (f64::from(stats.norm) - torch_norm).abs() / torch_norm;
        assert!(rel < 1e-6, "step {step}: norm engine {} torch {torch_norm}", stats.norm);
        clipped.push(stats.norm > MAX_GRAD_NORM);
        assert_eq!(
            opt.clip_coef(stats.norm) < 1.0,
            stats.norm > MAX_GRAD_NORM,
            "step {step}: engine clip coefficient at norm {}",
            stats.norm
        );

        // Every tensor after every step, so a failure names where it starts.
        let mut worst = 0f32;
        for ((&(name, _, _), s), t) in TENSORS.iter().zip(&segments).zip(&params) {
            let want = to_vec(t);
            assert_eq!(want.len(), s.len, "{name}: torch tensor size");
            for (i, (&got, &w)) in p[s.start..s.start + s.len].iter().zip(&want).enumerate() {
                let (err, bound) = ((got - w).abs(), 4e-7 * w.abs() + 1e-9);
                worst = worst.max(err / bound);
                assert!(
                    err <= bound,
                    "step {step} (lr {lr}, norm {}): {name}[{i}] engine {got} torch {w} \
                     (|err| {err:.3e} > {bound:.3e})",
                    stats.norm
                );
            }
        }
        println!(
            "step {step}: lr {lr:e} norm {:.4} ({}), worst |err|/bound {worst:.3}",
            stats.norm,
            if clipped[step] { "clipped" } else { "not clipped" }
        );
    }
    assert_eq!(clipped, [false, true, false, true, false, true], "which steps were clipped");
}
