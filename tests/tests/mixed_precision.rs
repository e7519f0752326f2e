//! The engine's mixed precision on the CPU: f16/bf16 activations and gradients (values rounded
//! to the dtype at every op output, compute in f32), fp32 master weights and Adam moments, the
//! compute copy written by the fused AdamW pass, dynamic loss scaling for fp16.
//!
//! `cargo test --release -p ortbench-tests --test mixed_precision -- --nocapture` prints the
//! measured curve differences.

use ortbench_engine::optim::LossScaler;
use ortbench_engine::DType;
use ortbench_models::graph::trainer::{EngineOptions, EngineTrainer};
use ortbench_models::spec::builtin_config;
use ortbench_models::{DataSource, LrSchedule, ModelConfig, Weights};

const STEPS: usize = 10;
const BATCH: usize = 4;
const SEQ: usize = 32;

fn cfg(name: &str) -> ModelConfig {
    let mut c = builtin_config(name).unwrap();
    c.set_dropout(0.0);
    c
}

fn trainer(cfg: &ModelConfig, w: &Weights, precision: DType) -> EngineTrainer {
    let opts = EngineOptions {
        lr: 1e-3,
        weight_decay: 0.01,
        max_grad_norm: 1.0,
        schedule: LrSchedule::Constant { warmup_steps: 0 },
        precision,
        seed: 0,
    };
    EngineTrainer::new(cfg, w, BATCH, SEQ, opts).unwrap()
}

/// Per step: (loss, skipped, loss scale, gradient norm).
fn curve(name: &str, precision: DType) -> Vec<(f32, bool, f32, f32)> {
    let cfg = cfg(name);
    let w = Weights::init(&cfg, 11);
    let data = DataSource::synthetic(&cfg, BATCH, SEQ, 5).unwrap();
    let mut t = trainer(&cfg, &w, precision);
    // Two batches in turn: random tokens cannot be learned, repeated ones can, so the curve
    // moves (a flat curve would hide a precision that stops training).
    (0..STEPS)
        .map(|k| {
            let st = t.step(&data.batch(k % 2)).unwrap();
            (st.loss, st.skipped, st.loss_scale, st.grad_norm)
        })
        .collect()
}

/// fp16 and bf16 track the fp32 curve, step by step, for 10 AdamW steps — the loss and the
/// gradient norm (before clipping, after unscaling).
///
/// Tolerance: 2 unit roundoffs of the storage dtype, relative — 2·2^-11 ≈ 1e-3 for fp16 and
/// 2·2^-8 ≈ 8e-3 for bf16. One stored value may be off by one roundoff; the loss is a mean over
/// the batch's tokens of values that went through ~10 rounded stores per layer, whose errors
/// are independent and average out, so its error stays well under one roundoff (measured on
/// these models: ≤ 2.2e-5 for fp16 and ≤ 4e-4 for bf16, printed below); 2 roundoffs leaves room
/// for the slow drift of 10 updates and still fails on a real defect (a missed rounding of
/// the parameters, a broken master copy are all ≫ 1e-2). The gradient norm is what catches a
/// gradient left scaled by the loss scale (2^16 × fp32's) or unscaled twice: AdamW's update
/// divides the scale out again, so the loss alone would not show it. And the curves must
/// differ from fp32's by at least 1e-6: the rounding is engaged.
#[test]
fn fp16_and_bf16_track_the_fp32_curve() {
    for name in ["tiny-bert", "tiny-gpt2"] {
        let fp32 = curve(name, DType::F32);
        for (precision, tol) in [(DType::F16, 1e-3f32), (DType::BF16, 8e-3)] {
            let c = curve(name, precision);
            let (mut worst, mut worst_norm) = (0f32, 0f32);
            for (k, ((a, _, _, na), (b, skipped, scale, nb))) in fp32.iter().zip(&c).enumerate() {
                assert!(!skipped, "{name} {precision}: step {k} skipped (scale {scale})");
                assert!(b.is_finite(), "{name} {precision}: step {k} loss {b}");
                let rel = (a - b).abs() / a.abs();
                assert!(
                    rel < tol,
                    "{name} {precision}: step {k}: fp32 {a} vs {b} (rel {rel:.2e} ≥ {tol:.0e})"
                );
                let rel_norm = (na - nb).abs() / na.abs();
                assert!(rel_norm < tol, "{name} {precision}: step {k}: gradient norm fp32 {na} vs {nb} (rel {rel_norm:.2e} ≥ {tol:.0e})");
                worst = worst.max(rel);
                worst_norm = worst_norm.max(rel_norm);
            }
            assert!(
                worst > 1e-6,
                "{name} {precision}: identical to fp32 — the storage rounding is not engaged"
            );
            // Training still trains: the last loss is below the first.
            assert!(c[STEPS - 1].0 < c[0].0, "{name} {precision}: {:?}", c);
            println!("{name} {precision}: max relative difference to fp32 over {STEPS} steps: loss {worst:.2e}, gradient norm {worst_norm:.2e} (tolerance {tol:.0e})");
        }
        // bf16 trains unscaled; fp16 with GradScaler's initial scale.
        assert!(curve(name, DType::BF16).iter().all(|&(_, _, s, _)| s == 1.0));
        assert!(curve(name, DType::F16).iter().all(|&(_, _, s, _)| s == 65536.0));
    }
}

/// A loss scale too large for f16: the scaled backward overflows in f16 storage (the values
/// exceed 65504 and round to inf), so the step is skipped, the weights are untouched and the
/// scale halves — until it fits, then training proceeds. In fp32 the same scale fits.
#[test]
fn an_fp16_overflow_skips_the_step_and_halves_the_scale() {
    let cfg = cfg("tiny-gpt2");
    let w = Weights::init(&cfg, 11);
    let data = DataSource::synthetic(&cfg, BATCH, SEQ, 5).unwrap();
    let huge = 2f32.powi(40);
    let run = |precision: DType| {
        let mut t = trainer(&cfg, &w, precision);
        let mut scaler = LossScaler::default();
        scaler.scale = huge;
        t.set_loss_scaler(Some(scaler));
        let mut out = Vec::new();
        for k in 0..40 {
            let before = t.weights().unwrap().tensors;
            let st = t.step(&data.batch(k)).unwrap();
            let changed = t.weights().unwrap().tensors != before;
            out.push((st.skipped, st.loss_scale, changed));
            if !st.skipped {
                break;
            }
        }
        out
    };
    let f16 = run(DType::F16);
    let skipped = f16.len() - 1;
    assert!(skipped >= 1, "a 2^40 loss scale must overflow f16 gradients: {f16:?}");
    for (k, &(s, scale, changed)) in f16.iter().enumerate() {
        assert_eq!(
            scale,
            huge / 2f32.powi(k as i32),
            "step {k}: the scale halves on every overflow"
        );
        assert_eq!(
            (s, changed),
            (k < skipped, k == skipped),
            "step {k}: skipped steps change nothing"
        );
    }
    println!("fp16 with an initial loss scale of 2^40: {skipped} overflowing steps skipped, then scale 2^{}", 40 - skipped);
    let f32_run = run(DType::F32);
    assert_eq!(f32_run, vec![(false, huge, true)], "fp32 has the range for it");
}

/// The fused LM head (`fuse_linear_cross_entropy` + its one-sweep backward) in f16/bf16
/// storage is as close to fp32 as the unfused head: one step of GPT-2 CLM and BERT MLM, tied
/// and untied, on the planned executor, fp16 with GradScaler's 2^16 seeded into the backward
/// (then divided out), against the unfused fp32 step: the loss within 2 roundoffs (as above)
/// and each parameter's gradient within `grad_tol`·max|g| + `grad_tol`/100·G (G the largest
/// gradient of the step: attention's key bias has an exactly-zero gradient, so its own max|g|
/// is rounding noise) — for the fused and the unfused
/// graph alike. The fused head's logits never exist in the half dtype (they are f32 chunks),
/// so it is expected to be at least as close; both errors are printed.
#[test]
fn fused_lm_head_in_fp16_and_bf16_is_as_close_to_fp32_as_the_unfused_head() {
    use ortbench_engine::exec::planned::PlannedExecutor;
    use ortbench_engine::passes::PassConfig;
    use ortbench_models::graph::{build_training_graph, GraphOptions};
    let off = PassConfig::all()
        .with("fuse_linear_cross_entropy", false)
        .with("fuse_linear_cross_entropy_backward", false);
    for base in ["tiny-gpt2", "tiny-bert"] {
        for tied in [true, false] {
            let mut raw = cfg(base).raw;
            raw["tie_word_embeddings"] = serde_json::json!(tied);
            raw["vocab_size"] = serde_json::json!(1999);
            let cfg = ModelConfig::from_value(raw, base).unwrap();
            let w = Weights::init(&cfg, 4);
            let batch = DataSource::synthetic(&cfg, BATCH, SEQ, 8).unwrap().batch(0);
            let step = |dtype: DType, passes: PassConfig| {
                let opts = GraphOptions::new(BATCH, SEQ).with_dtype(dtype).with_passes(passes);
                let m = build_training_graph(&cfg, &opts).unwrap();
                let compute: Vec<f32> =
                    m.flatten(&w).unwrap().iter().map(|&x| dtype.round(x)).collect();
                let feed = m.feed(&batch).unwrap();
                let mut ex = PlannedExecutor::new(&m.graph).unwrap();
                let scale = if dtype == DType::F16 { 65536.0 } else { 1.0 };
                ex.set_loss_scale(scale).unwrap();
                let mut g = vec![f32::NAN; compute.len()];
                let l = ex.train_step(&compute, &feed.inputs(), 0, &mut g).unwrap();
                (l, g.iter().map(|x| x / scale).collect::<Vec<f32>>(), m)
            };
            let (l32, g32, m32) = step(DType::F32, off);
            let g_all = g32.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (dtype, loss_tol, grad_tol) in
                [(DType::F16, 1e-3f32, 5e-3f32), (DType::BF16, 8e-3, 4e-2)]
            {
                for (what, passes) in [("fused", PassConfig::all()), ("unfused", off)] {
                    let (l, g, _) = step(dtype, passes);
                    let rel = (l - l32).abs() / l32.abs();
                    let label = format!("{base} tied {tied} {dtype} {what}");
                    assert!(rel <= loss_tol, "{label}: loss {l} vs fp32 {l32} (rel {rel:.2e})");
                    let mut worst = (0f32, String::new());
                    for s in &m32.params {
                        let r = s.offset..s.offset + s.len;
                        let big = g32[r.clone()].iter().fold(0f32, |m, v| m.max(v.abs()));
                        let d = g[r.clone()]
                            .iter()
                            .zip(&g32[r])
                            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                        let ratio = d / (big + g_all / 100.0);
                        assert!(
                            ratio <= grad_tol,
                            "{label}: {} off by {ratio:.2e} of max|g| + G/100",
                            s.name
                        );
                        if ratio > worst.0 {
                            worst = (ratio, s.name.clone());
                        }
                    }
                    println!(
                        "{label}: loss rel {rel:.2e}, worst gradient {} at {:.2e} of max|g| + G/100",
                        worst.1, worst.0
                    );
                }
            }
        }
    }
}
