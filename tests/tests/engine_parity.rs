//! The engine computes the same function as the tch baseline: for tiny-bert (MLM), tiny-gpt2 and
//! a tiny BertForSequenceClassification, in fp32 with dropout off, from identical weights and
//! batches, the engine graph's step-0 loss and EVERY parameter's gradient match libtorch's
//! (`TorchTrainer::gradients_of`), the way llm.c's test_gpt2 checks its kernels against PyTorch.
//!
//! Tolerances. Loss: 1e-5 relative. Gradients, per tensor g (torch) vs e (engine):
//!     max |e − g| ≤ ATOL + RTOL · max |g|,   RTOL = 1e-5, ATOL = 1e-9.
//! Both sides are fp32 and differ only in summation order (torch's oneDNN/MKL GEMM blocking,
//! its reductions in LayerNorm, softmax and cross-entropy backward vs the engine's loops and
//! GEMM), which moves each value by a few ulps of the *terms* summed — bounded by the tensor's
//! scale, not by the (possibly cancelling) value itself — hence an error relative to max |g|.
//! Measured (x86-64, libtorch 2.11 CPU): the worst tensor of each model is at 3e-7 to 1e-6 of its
//! max |g| (printed by the test), so RTOL = 1e-5 leaves ~10× headroom for other CPUs' GEMM
//! kernels, and still catches any real mistake (a wrong rule, a missing 1/√D, an unshifted label,
//! a padding row that gets a gradient: each is an O(1) relative error on some tensor). ATOL only
//! keeps a tensor whose gradient is exactly zero on both sides from dividing by zero.

use ortbench_engine::passes::PassConfig;
use ortbench_models::graph::{build_training_graph, GraphOptions};
use ortbench_models::spec::builtin_config;
use ortbench_models::torch::{TorchTrainer, TrainOptions};
use ortbench_models::{Batch, DataSource, ModelConfig, Weights, IGNORE_INDEX};

const LOSS_RTOL: f64 = 1e-5;
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-9;

/// The worst tensor of one model: (name, max |e − g|, max |g|, ratio to its tolerance).
struct Worst {
    name: String,
    max_diff: f64,
    max_abs: f64,
    ratio: f64,
}

fn check_parity(label: &str, cfg: &ModelConfig, batch: &Batch) -> Worst {
    check_parity_on(label, cfg, batch, false, PassConfig::all())
}

/// `check_parity` with the engine's planned executor (memory plan, fast kernels) instead of
/// the reference one, at the same tolerances.
fn check_parity_planned(label: &str, cfg: &ModelConfig, batch: &Batch) -> Worst {
    check_parity_on(&format!("{label} [planned]"), cfg, batch, true, PassConfig::all())
}

/// With `passes`: `PassConfig::none()` checks the builders' unfused eager graphs.
fn check_parity_on(
    label: &str,
    cfg: &ModelConfig,
    batch: &Batch,
    planned: bool,
    passes: PassConfig,
) -> Worst {
    let weights = Weights::init(cfg, 0);

    let mut torch =
        TorchTrainer::new(cfg, &weights, tch::Device::Cpu, TrainOptions::default()).unwrap();
    let torch_loss = torch.eval_loss(batch);
    let torch_grads = torch.gradients_of(batch);

    let gopts = GraphOptions::new(batch.batch_size, batch.seq_len)
        .with_passes(passes)
        .with_attention_mask(batch.attention_mask.is_some());
    let model = build_training_graph(cfg, &gopts).unwrap();
    let params = model.flatten(&weights).unwrap();
    let mut grads = vec![f32::NAN; params.len()];
    let engine_loss = if planned {
        let feed = model.feed(batch).unwrap();
        let mut exec = ortbench_engine::exec::planned::PlannedExecutor::new(&model.graph).unwrap();
        exec.train_step(&params, &feed.inputs(), 0, &mut grads).unwrap() as f64
    } else {
        model.ref_train_step(&params, batch, 0, &mut grads).unwrap() as f64
    };
    let engine_grads = model.unflatten(&grads).unwrap();

    let rel = (engine_loss - torch_loss).abs() / torch_loss.abs();
    println!("{label}: loss engine {engine_loss:.8} torch {torch_loss:.8} (rel diff {rel:.2e})");
    assert!(
        rel <= LOSS_RTOL,
        "{label}: loss engine {engine_loss} vs torch {torch_loss} (rel {rel:.3e})"
    );

    assert_eq!(engine_grads.tensors.len(), torch_grads.tensors.len(), "{label}: parameter count");
    let mut worst = Worst { name: String::new(), max_diff: 0.0, max_abs: 0.0, ratio: -1.0 };
    for e in &engine_grads.tensors {
        let g = torch_grads
            .get(&e.name)
            .unwrap_or_else(|| panic!("{label}: torch has no gradient for {}", e.name));
        assert_eq!(e.shape, g.shape, "{label}: {}", e.name);
        let max_abs = g.data.iter().fold(0.0f64, |m, &v| m.max((v as f64).abs()));
        let max_diff = e
            .data
            .iter()
            .zip(&g.data)
            .fold(0.0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()));
        assert!(
            e.data.iter().all(|v| v.is_finite()),
            "{label}: {} has a non-finite gradient",
            e.name
        );
        let tol = ATOL + RTOL * max_abs;
        let ratio = max_diff / tol;
        assert!(
            max_diff <= tol,
            "{label}: gradient of {} differs: max |engine − torch| = {max_diff:.3e} > {tol:.3e} (max |g| = {max_abs:.3e})",
            e.name
        );
        if ratio > worst.ratio {
            worst = Worst { name: e.name.clone(), max_diff, max_abs, ratio };
        }
    }
    println!(
        "{label}: {} gradients match; worst {}: max diff {:.3e}, max |g| {:.3e}, diff/max|g| {:.2e} ({:.1}% of tolerance)",
        engine_grads.tensors.len(),
        worst.name,
        worst.max_diff,
        worst.max_abs,
        worst.max_diff / worst.max_abs.max(f64::MIN_POSITIVE),
        100.0 * worst.ratio
    );
    worst
}

fn fp32_no_dropout(mut cfg: ModelConfig) -> ModelConfig {
    cfg.set_dropout(0.0);
    cfg
}

/// Puts BERT's padding token (id 0, nn.Embedding's padding_idx) at a few positions of every
/// row — some of them MLM-labelled — so the rule "the padding row gets no gradient from the
/// lookup" is exercised.
fn with_padding_tokens(mut batch: Batch, cfg: &ModelConfig) -> Batch {
    let pad = cfg.raw["pad_token_id"].as_i64().expect("tiny-bert has a pad_token_id");
    assert_eq!(pad, 0);
    let t = batch.seq_len;
    for row in 0..batch.batch_size {
        for pos in [2, 5, t - 3] {
            batch.input_ids[row * t + pos] = pad;
        }
    }
    assert!(batch.input_ids.contains(&0));
    batch
}

#[test]
fn bert_mlm_engine_matches_torch() {
    let cfg = fp32_no_dropout(builtin_config("tiny-bert").unwrap());
    let (b, t) = (4, 32);
    assert!(t < cfg.max_positions());
    let batch = with_padding_tokens(DataSource::synthetic(&cfg, b, t, 11).unwrap().batch(0), &cfg);
    assert!(batch.labels.iter().any(|&l| l != IGNORE_INDEX));
    check_parity("tiny-bert (BertForMaskedLM)", &cfg, &batch);
}

#[test]
fn gpt2_engine_matches_torch() {
    let cfg = fp32_no_dropout(builtin_config("tiny-gpt2").unwrap());
    let (b, t) = (4, 32);
    let batch = DataSource::synthetic(&cfg, b, t, 12).unwrap().batch(0);
    check_parity("tiny-gpt2 (GPT2LMHeadModel)", &cfg, &batch);
}

#[test]
fn bert_sequence_classification_engine_matches_torch() {
    let mut raw = builtin_config("tiny-bert").unwrap().raw;
    raw["architectures"] = serde_json::json!(["BertForSequenceClassification"]);
    raw["num_labels"] = serde_json::json!(3);
    let cfg =
        fp32_no_dropout(ModelConfig::from_value(raw, "tiny-bert + classification head").unwrap());
    let (b, t) = (4, 16);
    let batch = with_padding_tokens(DataSource::synthetic(&cfg, b, t, 13).unwrap().batch(0), &cfg);
    assert_eq!(batch.labels.len(), b);
    check_parity("tiny BertForSequenceClassification (3 labels)", &cfg, &batch);
}

#[test]
fn bert_mlm_planned_engine_matches_torch() {
    let cfg = fp32_no_dropout(builtin_config("tiny-bert").unwrap());
    let batch = with_padding_tokens(DataSource::synthetic(&cfg, 4, 32, 11).unwrap().batch(0), &cfg);
    check_parity_planned("tiny-bert (BertForMaskedLM)", &cfg, &batch);
}

#[test]
fn gpt2_planned_engine_matches_torch() {
    let cfg = fp32_no_dropout(builtin_config("tiny-gpt2").unwrap());
    let batch = DataSource::synthetic(&cfg, 4, 32, 12).unwrap().batch(0);
    check_parity_planned("tiny-gpt2 (GPT2LMHeadModel)", &cfg, &batch);
}

#[test]
fn bert_sequence_classification_planned_engine_matches_torch() {
    let mut raw = builtin_config("tiny-bert").unwrap().raw;
    raw["architectures"] = serde_json::json!(["BertForSequenceClassification"]);
    raw["num_labels"] = serde_json::json!(3);
    let cfg =
        fp32_no_dropout(ModelConfig::from_value(raw, "tiny-bert + classification head").unwrap());
    let batch = with_padding_tokens(DataSource::synthetic(&cfg, 4, 16, 13).unwrap().batch(0), &cfg);
    check_parity_planned("tiny BertForSequenceClassification (3 labels)", &cfg, &batch);
}

/// A classifier of `base` with `extra` config keys (num_labels, problem_type, pad_token_id).
fn classifier(base: &str, arch: &str, extra: serde_json::Value) -> ModelConfig {
    let mut raw = builtin_config(base).unwrap().raw;
    raw["architectures"] = serde_json::json!([arch]);
    for (k, v) in extra.as_object().unwrap() {
        raw[k] = v.clone();
    }
    fp32_no_dropout(ModelConfig::from_value(raw, &format!("{base} as {arch}")).unwrap())
}

/// HF's attention_mask on `batch`: even rows padded on the right (last 5), odd rows on the
/// left (first 7), pad positions' ids set to `pad`.
fn padded(mut batch: Batch, pad: i64) -> Batch {
    let t = batch.seq_len;
    let mut mask = vec![1i64; batch.batch_size * t];
    for row in 0..batch.batch_size {
        let r = &mut mask[row * t..(row + 1) * t];
        if row % 2 == 0 {
            r[t - 5..].fill(0)
        } else {
            r[..7].fill(0)
        }
    }
    for (id, &m) in batch.input_ids.iter_mut().zip(&mask) {
        if m == 0 {
            *id = pad;
        }
    }
    batch.attention_mask = Some(mask);
    batch
}

/// The other heads and losses, on padded batches, planned executor: GPT-2 classification
/// (last non-pad token), multi-label BERT (BCE as two-class cross-entropy), regression (MSE as
/// dᵀd) for BERT and GPT-2, BERT token classification.
#[test]
fn classification_heads_planned_engine_match_torch() {
    let cases = [
        (
            "tiny-gpt2",
            "GPT2ForSequenceClassification",
            serde_json::json!({"num_labels": 3, "pad_token_id": 0}),
        ),
        (
            "tiny-bert",
            "BertForSequenceClassification",
            serde_json::json!({"num_labels": 4, "problem_type": "multi_label_classification"}),
        ),
        ("tiny-bert", "BertForSequenceClassification", serde_json::json!({"num_labels": 1})),
        (
            "tiny-gpt2",
            "GPT2ForSequenceClassification",
            serde_json::json!({"num_labels": 1, "pad_token_id": 0}),
        ),
        ("tiny-bert", "BertForTokenClassification", serde_json::json!({"num_labels": 5})),
    ];
    for (base, arch, extra) in cases {
        let cfg = classifier(base, arch, extra.clone());
        let batch = padded(DataSource::synthetic(&cfg, 4, 16, 14).unwrap().batch(0), 0);
        check_parity_planned(&format!("{arch} {extra}"), &cfg, &batch);
    }
}

/// RoBERTa and DistilBERT, every head, on padded batches with pad ids inside the text too,
/// planned executor: RoBERTa's positions after pad (left-padded rows included) and its heads,
/// DistilBERT's names, ReLU classifier and a relu `activation`, untied MLM decoders.
#[test]
fn roberta_and_distilbert_heads_planned_engine_match_torch() {
    let untied = serde_json::json!({"tie_word_embeddings": false});
    let cases = [
        ("tiny-roberta", "RobertaForMaskedLM", untied.clone()),
        ("tiny-roberta", "RobertaForSequenceClassification", serde_json::json!({"num_labels": 3})),
        ("tiny-roberta", "RobertaForTokenClassification", serde_json::json!({"num_labels": 5})),
        (
            "tiny-distilbert",
            "DistilBertForMaskedLM",
            serde_json::json!({"tie_word_embeddings": false, "activation": "relu"}),
        ),
        (
            "tiny-distilbert",
            "DistilBertForSequenceClassification",
            serde_json::json!({"num_labels": 3}),
        ),
        (
            "tiny-distilbert",
            "DistilBertForTokenClassification",
            serde_json::json!({"num_labels": 4}),
        ),
    ];
    for (base, arch, extra) in cases {
        let cfg = classifier(base, arch, extra.clone());
        let pad = cfg.raw["pad_token_id"].as_i64().unwrap();
        let mut batch = padded(DataSource::synthetic(&cfg, 4, 16, 15).unwrap().batch(0), pad);
        for row in 0..4 {
            batch.input_ids[row * 16 + 9] = pad; // a pad inside the text
        }
        check_parity_planned(&format!("{arch} {extra}"), &cfg, &batch);
    }
}

/// With every pass off: the builders' eager graphs (unfused attention, matmul + bias add, dropout
/// nodes at p = 0) on the planned executor, at the same tolerances.
#[test]
fn unfused_graphs_planned_engine_match_torch() {
    let cfg = fp32_no_dropout(builtin_config("tiny-bert").unwrap());
    let batch = with_padding_tokens(DataSource::synthetic(&cfg, 4, 32, 11).unwrap().batch(0), &cfg);
    check_parity_on(
        "tiny-bert (BertForMaskedLM) [planned, no passes]",
        &cfg,
        &batch,
        true,
        PassConfig::none(),
    );
    let cfg = fp32_no_dropout(builtin_config("tiny-gpt2").unwrap());
    let batch = DataSource::synthetic(&cfg, 4, 32, 12).unwrap().batch(0);
    check_parity_on(
        "tiny-gpt2 (GPT2LMHeadModel) [planned, no passes]",
        &cfg,
        &batch,
        true,
        PassConfig::none(),
    );
}

/// The `ort` config's training loop against the `pytorch` config's: same weights, same
/// batches, HF Trainer's AdamW (decay groups, clipping at 1.0), 10 steps. Every step's loss must
/// agree within 1e-4 relative, and the final weights closely.
fn check_training_curve(name: &str) {
    use ortbench_engine::DType;
    use ortbench_models::graph::trainer::{EngineOptions, EngineTrainer};
    use ortbench_models::LrSchedule;
    let cfg = fp32_no_dropout(builtin_config(name).unwrap());
    let w = Weights::init(&cfg, 11);
    let (lr, wd, clip) = (1e-3, 0.01, 1.0);
    let schedule = LrSchedule::Linear { warmup_steps: 2, total_steps: 10 };
    let topts = TrainOptions {
        lr,
        weight_decay: wd,
        max_grad_norm: clip,
        schedule,
        ..TrainOptions::default()
    };
    let mut torch = TorchTrainer::new(&cfg, &w, tch::Device::Cpu, topts).unwrap();
    let eopts = EngineOptions {
        lr,
        weight_decay: wd,
        max_grad_norm: clip,
        schedule,
        precision: DType::F32,
        seed: 0,
    };
    let mut engine = EngineTrainer::new(&cfg, &w, 4, 32, eopts).unwrap();
    let data = DataSource::synthetic(&cfg, 4, 32, 5).unwrap();
    for step in 0..10 {
        let b = data.batch(step);
        let (t, e) = (torch.step(&b).unwrap(), engine.step(&b).unwrap());
        let rel = (t.loss - f64::from(e.loss)).abs() / t.loss;
        println!(
            "{name} step {step}: torch {:.6} engine {:.6} rel {rel:.1e} | norm {:.5} vs {:.5}",
            t.loss, e.loss, t.grad_norm, e.grad_norm
        );
        assert!(
            rel < 1e-4,
            "{name} step {step}: torch {} engine {} (rel {rel:.1e})",
            t.loss,
            e.loss
        );
        assert!((t.grad_norm - f64::from(e.grad_norm)).abs() < 1e-3 * t.grad_norm);
    }
    // After 10 updates of size ~lr the weights agree to a small fraction of lr. First the same
    // tensors by name, in order, with the same shapes: the zip below would pass over a missing
    // one.
    let (tw, ew) = (torch.weights(), engine.weights().unwrap());
    let names = |w: &Weights| w.tensors.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    let (tn, en) = (names(&tw), names(&ew));
    let only = |x: &[String], y: &[String]| {
        x.iter().filter(|n| !y.contains(n)).cloned().collect::<Vec<_>>()
    };
    assert_eq!(
        tn,
        en,
        "{name}: {} torch vs {} engine tensors; only in torch: {:?}; only in the engine: {:?}",
        tn.len(),
        en.len(),
        only(&tn, &en),
        only(&en, &tn)
    );
    for (a, b) in tw.tensors.iter().zip(&ew.tensors) {
        assert_eq!(a.shape, b.shape, "{name}: {} shape", a.name);
        assert_eq!(a.data.len(), b.data.len(), "{name}: {} length", a.name);
        let worst = a.data.iter().zip(&b.data).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-4, "{}: weights differ by {worst:e}", a.name);
    }
}

#[test]
fn tiny_bert_training_curve_matches_torch() {
    check_training_curve("tiny-bert");
}

#[test]
fn tiny_gpt2_training_curve_matches_torch() {
    check_training_curve("tiny-gpt2");
}

/// `base` (an LM) at gpt2's vocabulary, its head tied to the embedding or not. At 50 257
/// tokens the fused head's chunk is `chunk_rows(50257, threads)` rows (672 on 2 to 84
/// threads), so a 16 × 64 batch with every unpadded row labelled takes two chunks, the second
/// partial (asserted below).
fn lm_at_gpt2_vocab(base: &str, tied: bool) -> ModelConfig {
    let mut raw = builtin_config(base).unwrap().raw;
    raw["vocab_size"] = serde_json::json!(50257);
    raw["tie_word_embeddings"] = serde_json::json!(tied);
    let label = format!("{base} at vocab 50257, tied {tied}");
    fp32_no_dropout(ModelConfig::from_value(raw, &label).unwrap())
}

/// The fused LM head (`fuse_linear_cross_entropy`, on by default: no logits, loss and
/// gradients in one sweep) against torch's unfused `lm_head` + `CrossEntropyLoss`, planned
/// executor, tolerances as above: GPT-2 CLM and BERT MLM, tied and untied, on padded batches
/// (HF's attention mask, padding right and left, label −100 at pads) — BERT with the
/// collator's sparse labels and with every token labelled (several chunks).
#[test]
fn fused_lm_heads_tied_and_untied_planned_engine_match_torch() {
    for base in ["tiny-gpt2", "tiny-bert"] {
        for tied in [true, false] {
            let cfg = lm_at_gpt2_vocab(base, tied);
            let densities: &[bool] = if base == "tiny-bert" { &[false, true] } else { &[true] };
            for &dense in densities {
                let raw = DataSource::synthetic(&cfg, 16, 64, 21).unwrap().batch(0);
                let mut batch = padded(raw.clone(), if base == "tiny-bert" { 0 } else { 999 });
                let mask = batch.attention_mask.clone().unwrap();
                for (i, l) in batch.labels.iter_mut().enumerate() {
                    *l = match (mask[i], dense) {
                        (0, _) => IGNORE_INDEX,
                        (_, true) => raw.input_ids[i],
                        (_, false) => *l,
                    };
                }
                if dense {
                    use ortbench_engine::backend::cpu::{kernels::linear_cross_entropy, pool};
                    let labelled = batch.labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
                    let chunk =
                        linear_cross_entropy::chunk_rows(50257, pool::Pool::global().threads());
                    assert!(
                        labelled > chunk && labelled < 2 * chunk,
                        "{labelled} rows, chunk {chunk}"
                    );
                }
                let opts = GraphOptions::new(16, 64).with_attention_mask(true);
                let counts = ortbench_engine::passes::op_counts(
                    &build_training_graph(&cfg, &opts).unwrap().graph,
                );
                assert_eq!(counts.get("linear_cross_entropy_backward"), Some(&1), "{counts:?}");
                let label =
                    format!("{base} tied {tied}, labels {}", if dense { "all" } else { "15 %" });
                check_parity_on(&label, &cfg, &batch, true, PassConfig::all());
            }
        }
    }
}
