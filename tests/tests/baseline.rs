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
            let (a, b) = (
                fp32.step(&data.batch(step)).unwrap().loss,
                bf16.step(&data.batch(step)).unwrap().loss,
            );
            max_rel = max_rel.max((a - b).abs() / a);
        }
        // bf16 keeps 8 mantissa bits (relative rounding 2^-9 ≈ 0.2% per matmul input); the
        // loss curve should stay within 2% of fp32, and must differ (autocast really ran).
        assert!(max_rel < 0.02, "{name}: bf16 vs fp32 loss differs by {max_rel:.3e}");
        assert!(max_rel > 1e-6, "{name}: bf16 identical to fp32: autocast did not engage");
    }
}

/// The baseline's DDP all-reduces its gradients in buckets (torch DDP's `bucket_cap_mb`), last
/// parameters first: with buckets far smaller than the model (many collectives, tensors split
/// across none) two ranks still reproduce one rank on the global batch, bit for bit against the
/// default single bucket.
#[test]
fn ddp_buckets_reproduce_one_rank() {
    use ortbench_engine::collective::LocalGroup;
    use ortbench_models::torch::{TorchTrainer, TrainOptions};
    use ortbench_models::{DataSource, Weights};
    let mut cfg = ortbench_models::spec::builtin_config("tiny-gpt2").unwrap();
    cfg.set_dropout(0.0); // torch's dropout draws from one global RNG shared by the runs here
    let weights = Weights::init(&cfg, 1);
    let data = DataSource::synthetic(&cfg, 4, 16, 3).unwrap();
    let opts = TrainOptions { lr: 1e-3, ..TrainOptions::default() };
    let mut one = TorchTrainer::new(&cfg, &weights, tch::Device::Cpu, opts.clone()).unwrap();
    let want: Vec<f64> = (0..3).map(|s| one.step(&data.batch(s)).unwrap().loss).collect();
    let run = |bucket: Option<usize>| -> Vec<Vec<f64>> {
        std::thread::scope(|sc| {
            let hs: Vec<_> = LocalGroup::new(2)
                .into_iter()
                .map(|g| {
                    let (weights, data, opts, cfg) = (&weights, &data, opts.clone(), &cfg);
                    sc.spawn(move || {
                        let mut t =
                            TorchTrainer::new(cfg, weights, tch::Device::Cpu, opts).unwrap();
                        if let Some(b) = bucket {
                            t.set_ddp_bucket_bytes(b);
                        }
                        let r = ortbench_engine::collective::Collective::rank(&g);
                        (0..3)
                            .map(|s| {
                                let b = data.batch(s);
                                let local = b.rows(r * 2..(r + 1) * 2);
                                let task = ortbench_models::Task::for_config(cfg);
                                let w =
                                    task.label_count(&local) as f32 / task.label_count(&b) as f32;
                                t.step_ddp(&local, Some((&g, w))).unwrap().loss
                            })
                            .collect::<Vec<f64>>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let small = run(Some(4096));
    let default = run(None);
    assert_eq!(small, default, "bucketing changes nothing");
    for (s, (a, b)) in want.iter().zip(&small[0]).enumerate() {
        assert!(((a - b) / a).abs() <= 1e-5, "step {s}: 2 ranks {b} vs one rank {a}");
    }
}
