//! The tch baseline on its own: HF parameter counts, the loss at initialisation, and that
//! training lowers the loss.

use ortbench_models::spec::builtin_config;
use ortbench_models::torch::{TorchTrainer, TrainOptions};
use ortbench_models::{DataSource, Weights};

fn trainer(name: &str, lr: f64) -> (TorchTrainer, ortbench_models::ModelConfig) {
    let mut cfg = builtin_config(name).unwrap();
    cfg.set_dropout(0.0);
    let w = Weights::init(&cfg, 0);
    let opts = TrainOptions { lr, ..TrainOptions::default() };
    (TorchTrainer::new(&cfg, &w, tch::Device::Cpu, opts).unwrap(), cfg)
}

fn var_store_params(t: &TorchTrainer) -> i64 {
    t.var_store().trainable_variables().iter().map(|v| v.numel() as i64).sum()
}

#[test]
fn torch_modules_have_hf_parameter_counts() {
    // HF: BertForMaskedLM(bert-base-uncased) 109,514,298; GPT2LMHeadModel(gpt2) 124,439,808
    // (tied embeddings counted once).
    let (bert, _) = trainer("bert", 1e-4);
    assert_eq!(var_store_params(&bert), 109_514_298);
    drop(bert);
    let (gpt2, _) = trainer("gpt2", 1e-4);
    assert_eq!(var_store_params(&gpt2), 124_439_808);
}

#[test]
fn loss_at_init_is_about_ln_vocab() {
    for name in ["tiny-bert", "tiny-gpt2", "bert", "gpt2"] {
        let (t, cfg) = trainer(name, 1e-4);
        let data = DataSource::synthetic(&cfg, 2, 32, 7).unwrap();
        let loss = t.eval_loss(&data.batch(0));
        let ln_v = (cfg.vocab_size() as f64).ln();
        // Logits are small at init (std 0.02 weights), so the loss is close to uniform's.
        // BERT sits a little above: its tied head sees the LayerNorm-ed input embedding of
        // [MASK] again, so that one logit is large (bert-base: 10.73 vs ln V = 10.33).
        assert!((loss - ln_v).abs() / ln_v < 0.05, "{name}: loss {loss} vs ln(V) {ln_v}");
    }
}

#[test]
fn training_on_one_batch_lowers_the_loss() {
    for name in ["tiny-bert", "tiny-gpt2"] {
        let (mut t, cfg) = trainer(name, 1e-3);
        let batch = DataSource::synthetic(&cfg, 4, 32, 3).unwrap().batch(0);
        let first = t.step(&batch).unwrap().loss;
        let mut last = first;
        for _ in 0..30 {
            last = t.step(&batch).unwrap().loss;
        }
        assert!(last < 0.7 * first, "{name}: loss {first} -> {last}");
    }
}

#[test]
fn weights_round_trip_through_the_baseline() {
    let (t, cfg) = trainer("tiny-gpt2", 1e-3);
    let out = t.weights();
    assert_eq!(out.tensors, Weights::init(&cfg, 0).tensors);
}

#[test]
fn bf16_autocast_on_cpu_tracks_fp32() {
    use ortbench_models::torch::Precision;
    for name in ["tiny-bert", "tiny-gpt2"] {
        let mut cfg = builtin_config(name).unwrap();
        cfg.set_dropout(0.0);
        let w = Weights::init(&cfg, 0);
        let make = |precision| {
            let opts = TrainOptions { lr: 1e-3, precision, ..TrainOptions::default() };
            TorchTrainer::new(&cfg, &w, tch::Device::Cpu, opts).unwrap()
        };
        let (mut fp32, mut bf16) = (make(Precision::Fp32), make(Precision::Bf16));
        let data = DataSource::synthetic(&cfg, 4, 32, 9).unwrap();
        let mut max_rel: f64 = 0.0;
        for step in 0..8 {
            let (a, b) = (fp32.step(&data.batch(step)).unwrap().loss, bf16.step(&data.batch(step)).unwrap().loss);
            max_rel = max_rel.max((a - b).abs() / a);
        }
        // bf16 keeps 8 mantissa bits (relative rounding 2^-9 ≈ 0.2% per matmul input); the
        // loss curve should stay within 2% of fp32, and must differ (autocast really ran).
        assert!(max_rel < 0.02, "{name}: bf16 vs fp32 loss differs by {max_rel:.3e}");
        assert!(max_rel > 1e-6, "{name}: bf16 identical to fp32: autocast did not engage");
    }
}
