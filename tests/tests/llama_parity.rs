//! The Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
//! LlamaForSequenceClassification) against HF Transformers 5.23 and the engine against the tch
//! baseline:
//!
//! - every Llama-family fixture (tests/fixtures/tiny-{llama,mistral,qwen2,qwen3}-*, made by
//!   scripts/make-fixtures.py with HF + torch.optim.AdamW for 8 steps): the `pytorch` baseline
//!   (tch, CPU) and `ort` (the engine's CPU planned executor through `EngineTrainer`) each
//!   reproduce HF's loss at every step within 1e-4 relative and its gradient norm within 1e-3,
//!   in fp32; the decay groups are HF Trainer's;
//! - the departure: with the fixture's feature ignored (llama3 rope scaling, the sliding window,
//!   the attention mask) the baseline's step-0 loss is HF's `loss0_without_…` and differs from
//!   HF's real loss by far more than the tolerance, so the tests above check the feature;
//! - engine gradients: for tiny configs of each type (GQA, MQA, q/k/v biases, q/k norms, a
//!   biting window, padding, tied and untied heads, a classifier) the engine's step-0 loss and
//!   every parameter's gradient match libtorch's (tolerances of tests/engine_parity.rs).

use std::path::{Path, PathBuf};

use ortbench_engine::DType;
use ortbench_models::graph::trainer::{EngineOptions, EngineTrainer};
use ortbench_models::graph::{build_training_graph, GraphOptions};
use ortbench_models::torch::{TorchTrainer, TrainOptions};
use ortbench_models::{resolve, Batch, DataSource, HubOptions, LrSchedule, ModelConfig, Weights};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

struct Fixture {
    dir: PathBuf,
    cfg: ModelConfig,
    weights: Weights,
    data: DataSource,
    expected: serde_json::Value,
    losses: Vec<f64>,
    norms: Vec<f64>,
}

fn load(name: &str) -> Fixture {
    let dir = fixture(name);
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let model = resolve(dir.to_str().unwrap(), &HubOptions::from_env()).unwrap();
    let cfg = model.config;
    assert_eq!(cfg.arch.hf_name(), expected["hf_class"].as_str().unwrap(), "{name}");
    let (weights, report) = Weights::load(&cfg, model.weights_file.as_ref().unwrap(), 0).unwrap();
    assert!(report.missing.is_empty(), "{name}: missing {:?}", report.missing);
    let batch = expected["batch_size"].as_u64().unwrap() as usize;
    let data =
        DataSource::from_file(&cfg, &dir.join("batches.safetensors"), batch, None, 0).unwrap();
    let floats = |k: &str| -> Vec<f64> {
        expected[k].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
    };
    let (losses, norms) = (floats("losses"), floats("grad_norms"));
    assert!(losses.len() >= 8);
    Fixture { dir, cfg, weights, data, expected, losses, norms }
}

fn train_options(f: &Fixture) -> TrainOptions {
    TrainOptions {
        lr: f.expected["lr"].as_f64().unwrap(),
        weight_decay: f.expected["weight_decay"].as_f64().unwrap(),
        max_grad_norm: f.expected["max_grad_norm"].as_f64().unwrap(),
        schedule: LrSchedule::Constant { warmup_steps: 0 },
        ..TrainOptions::default()
    }
}

/// Runs `step` for every fixture step; checks loss (1e-4 relative) and gradient norm (1e-3
/// relative) against HF's; returns the worst loss difference.
fn check_steps(label: &str, f: &Fixture, mut step: impl FnMut(usize) -> (f64, f64)) -> f64 {
    let mut worst = 0f64;
    for (i, (&want, &norm)) in f.losses.iter().zip(&f.norms).enumerate() {
        let (loss, grad_norm) = step(i);
        let rel = (loss - want).abs() / want.abs();
        worst = worst.max(rel);
        println!("{label} step {i}: ours {loss:.6} hf {want:.6} rel {rel:.2e}  norm {grad_norm:.5} vs {norm:.5}");
        assert!(rel < 1e-4, "{label} step {i}: loss {loss} vs HF {want} (rel {rel:.2e})");
        assert!(
            (grad_norm - norm).abs() / norm < 1e-3,
            "{label} step {i}: grad norm {grad_norm} vs HF {norm}"
        );
    }
    println!("{label}: worst loss rel diff over {} steps {worst:.2e}", f.losses.len());
    worst
}

/// Both configs against HF for 8 AdamW steps.
fn check_fixture(name: &str) {
    let f = load(name);
    let decay: Vec<&str> = f.expected["decay_params"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for spec in ortbench_models::param_specs(&f.cfg) {
        assert_eq!(
            spec.decay,
            decay.contains(&spec.name.as_str()),
            "{name}: decay of {}",
            spec.name
        );
    }

    let mut torch =
        TorchTrainer::new(&f.cfg, &f.weights, tch::Device::Cpu, train_options(&f)).unwrap();
    check_steps(&format!("{name} pytorch"), &f, |i| {
        let s = torch.step(&f.data.batch(i)).unwrap();
        (s.loss, s.grad_norm)
    });

    let t = train_options(&f);
    let opts = EngineOptions {
        lr: t.lr,
        weight_decay: t.weight_decay,
        max_grad_norm: t.max_grad_norm,
        schedule: t.schedule,
        precision: DType::F32,
        seed: 0,
    };
    let graph = GraphOptions::new(f.data.batch_size, f.data.seq_len)
        .with_attention_mask(f.data.has_attention_mask());
    let group = ortbench_engine::collective::LocalGroup::new(1).pop().unwrap();
    let mut engine = EngineTrainer::with_graph_options(
        &f.cfg,
        &f.weights,
        &graph,
        opts,
        group,
        ortbench_engine::parallel::Strategy::Ddp,
    )
    .unwrap();
    check_steps(&format!("{name} ort"), &f, |i| {
        let s = engine.step(&f.data.batch(i)).unwrap();
        (s.loss as f64, s.grad_norm as f64)
    });
}

#[test]
fn tiny_llama_padded_matches_hf_for_pytorch_and_ort() {
    check_fixture("tiny-llama-padded");
}

#[test]
fn tiny_llama_mqa_matches_hf_for_pytorch_and_ort() {
    check_fixture("tiny-llama-mqa");
}

#[test]
fn tiny_llama_rope_llama3_matches_hf_for_pytorch_and_ort() {
    check_fixture("tiny-llama-rope-llama3");
}

#[test]
fn tiny_llama_rope_linear_dynamic_yarn_and_longrope_match_hf_for_pytorch_and_ort() {
    for name in [
        "tiny-llama-rope-linear",
        "tiny-llama-rope-dynamic",
        "tiny-llama-rope-yarn",
        "tiny-llama-rope-longrope",
    ] {
        check_fixture(name);
    }
}

#[test]
fn tiny_smollm3_padded_matches_hf_for_pytorch_and_ort() {
    check_fixture("tiny-smollm3-padded");
}

/// Phi-3: fused qkv_proj / gate_up_proj, every layer sliding, padded; its longrope given as
/// the legacy "su"; its partial rotary embedding (half of each head); its classifier.
#[test]
fn tiny_phi3_matches_hf_for_pytorch_and_ort() {
    for name in
        ["tiny-phi3-padded", "tiny-phi3-longrope", "tiny-phi3-partial", "tiny-phi3-cls-padded"]
    {
        check_fixture(name);
    }
}

/// Gemma: (1 + w) RMSNorms, the embedding × √hidden, GeGLU, head_dim ≠ hidden / heads; padded;
/// its classifier.
#[test]
fn tiny_gemma_matches_hf_for_pytorch_and_ort() {
    for name in ["tiny-gemma-padded", "tiny-gemma-cls-padded"] {
        check_fixture(name);
    }
}

/// Gemma 2: query_pre_attn_scalar, sandwich norms, alternating sliding and global layers,
/// saturating soft-caps on the attention scores and the logits (HF's eager attention); its
/// classifier.
#[test]
fn tiny_gemma2_matches_hf_for_pytorch_and_ort() {
    for name in ["tiny-gemma2-padded", "tiny-gemma2-cls-padded"] {
        check_fixture(name);
    }
}

/// Gemma 3: q/k norms, the sliding layer's own rope (local base) beside the global layer's
/// linear-scaled one, a window shorter than the sequence; its classifier.
#[test]
fn tiny_gemma3_matches_hf_for_pytorch_and_ort() {
    for name in ["tiny-gemma3-padded", "tiny-gemma3-cls-padded"] {
        check_fixture(name);
    }
}

#[test]
fn tiny_mistral_window_matches_hf_for_pytorch_and_ort() {
    check_fixture("tiny-mistral-window");
}

#[test]
fn tiny_qwen2_matches_hf_for_pytorch_and_ort() {
    check_fixture("tiny-qwen2");
}

#[test]
fn tiny_qwen2_window_matches_hf_for_pytorch_and_ort() {
    check_fixture("tiny-qwen2-window");
}

#[test]
fn tiny_qwen3_matches_hf_for_pytorch_and_ort() {
    check_fixture("tiny-qwen3");
}

#[test]
fn tiny_llama_sequence_classification_matches_hf_for_pytorch_and_ort() {
    check_fixture("tiny-llama-cls-padded");
}

#[test]
fn tiny_mistral_qwen2_qwen3_sequence_classification_match_hf_for_pytorch_and_ort() {
    for name in ["tiny-mistral-cls-padded", "tiny-qwen2-cls-padded", "tiny-qwen3-cls-padded"] {
        check_fixture(name);
    }
}

/// The fixture's config with `edit` applied, everything else (weights, batches) unchanged.
fn edited(f: &Fixture, edit: impl FnOnce(&mut serde_json::Value)) -> ModelConfig {
    let mut raw = f.cfg.raw.clone();
    edit(&mut raw);
    ModelConfig::from_value(raw, &format!("{} (edited)", f.dir.display())).unwrap()
}

/// The baseline's step-0 loss of `cfg` on the fixture's first batch (`mask`: keep the
/// attention mask).
fn step0(f: &Fixture, cfg: &ModelConfig, mask: bool) -> f64 {
    let mut torch = TorchTrainer::new(cfg, &f.weights, tch::Device::Cpu, train_options(f)).unwrap();
    let mut batch = f.data.batch(0);
    if !mask {
        batch.attention_mask = None;
    }
    torch.step(&batch).unwrap().loss
}

/// (fixture, HF's step-0 loss without the feature, the config edit removing it, keep the mask)
type Departure = (&'static str, &'static str, fn(&mut serde_json::Value), bool);

/// With the feature ignored, our step-0 loss is HF's `loss0_without_…` (1e-4), and both are
/// far (> 1e-3 relative) from HF's loss with it: the parity tests check the feature.
#[test]
fn ignoring_rope_scaling_window_softcap_or_mask_departs_from_hf() {
    let no_scaling: fn(&mut serde_json::Value) = |r| {
        r["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": r["rope_parameters"]["rope_theta"]});
    };
    let full_types: fn(&mut serde_json::Value) =
        |r| r["layer_types"] = serde_json::json!(["full_attention", "full_attention"]);
    let cases: [Departure; 18] = [
        (
            "tiny-gemma2-padded",
            "loss0_without_softcapping",
            |r| {
                r["attn_logit_softcapping"] = serde_json::Value::Null;
                r["final_logit_softcapping"] = serde_json::Value::Null;
            },
            true,
        ),
        ("tiny-gemma2-padded", "loss0_without_sliding_window", full_types, true),
        (
            "tiny-gemma2-padded",
            "loss0_with_head_dim_scale",
            |r| r["query_pre_attn_scalar"] = serde_json::json!(24),
            true,
        ),
        (
            "tiny-gemma3-padded",
            "loss0_without_local_rope",
            |r| {
                let full = r["rope_parameters"]["full_attention"].clone();
                r["rope_parameters"]["sliding_attention"] = full;
            },
            true,
        ),
        ("tiny-gemma3-padded", "loss0_without_sliding_window", full_types, true),
        ("tiny-llama-rope-llama3", "loss0_without_rope_scaling", no_scaling, true),
        ("tiny-llama-rope-linear", "loss0_without_rope_scaling", no_scaling, true),
        ("tiny-llama-rope-dynamic", "loss0_without_rope_scaling", no_scaling, true),
        ("tiny-llama-rope-yarn", "loss0_without_rope_scaling", no_scaling, true),
        ("tiny-llama-rope-longrope", "loss0_without_rope_scaling", no_scaling, true),
        (
            "tiny-phi3-longrope",
            "loss0_without_rope_scaling",
            |r| {
                r["rope_parameters"] =
                    serde_json::json!({"rope_type": "default", "rope_theta": 10000.0});
            },
            true,
        ),
        (
            "tiny-phi3-partial",
            "loss0_without_partial_rotary",
            |r| r["rope_parameters"]["partial_rotary_factor"] = serde_json::json!(1.0),
            true,
        ),
        (
            "tiny-phi3-padded",
            "loss0_without_sliding_window",
            |r| {
                r["sliding_window"] = serde_json::Value::Null;
            },
            true,
        ),
        (
            "tiny-smollm3-padded",
            "loss0_without_nope",
            |r| r["no_rope_layers"] = serde_json::json!([1, 1]),
            true,
        ),
        (
            "tiny-mistral-window",
            "loss0_without_sliding_window",
            |r| {
                r["sliding_window"] = serde_json::Value::Null;
            },
            true,
        ),
        (
            "tiny-qwen2-window",
            "loss0_without_sliding_window",
            |r| {
                r["use_sliding_window"] = serde_json::json!(false);
                r["layer_types"] = serde_json::json!(["full_attention", "full_attention"]);
            },
            true,
        ),
        ("tiny-llama-padded", "loss0_without_attention_mask", |_| {}, false),
        ("tiny-llama-cls-padded", "loss0_without_attention_mask", |_| {}, false),
    ];
    for (name, key, edit, mask) in cases {
        let f = load(name);
        let without = f.expected[key].as_f64().unwrap_or_else(|| panic!("{name}: no {key}"));
        let cfg = edited(&f, edit);
        let ours = step0(&f, &cfg, mask);
        let hf = f.losses[0];
        let (agree, depart) = ((ours - without).abs() / without, (ours - hf).abs() / hf);
        println!(
            "{name}: {key}: ours {ours:.6} HF {without:.6} (rel {agree:.2e}); HF with it {hf:.6} (rel {depart:.2e})"
        );
        assert!(agree < 1e-4, "{name}: ignoring the feature, ours {ours} vs HF's {without}");
        assert!(depart > 1e-3, "{name}: the feature changes nothing on this data");
    }
}

// ---- engine gradients against torch -------------------------------------------------------

const LOSS_RTOL: f64 = 1e-5;
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-9;

/// The engine (CPU planned executor) and torch on `cfg` from the same HF-initialised weights:
/// loss within 1e-5 relative, each gradient tensor within 1e-9 + 1e-5·max|g|. Returns the
/// worst tensor's diff/max|g|.
fn check_gradients(label: &str, cfg: &ModelConfig, batch: &Batch) -> f64 {
    check_gradients_with(label, cfg, batch, ortbench_engine::passes::PassConfig::all())
}

/// [`check_gradients`] with the engine passes `passes` (`none()`: the builder's eager graph).
fn check_gradients_with(
    label: &str,
    cfg: &ModelConfig,
    batch: &Batch,
    passes: ortbench_engine::passes::PassConfig,
) -> f64 {
    let weights = Weights::init(cfg, 0);
    let mut torch =
        TorchTrainer::new(cfg, &weights, tch::Device::Cpu, TrainOptions::default()).unwrap();
    let torch_loss = torch.eval_loss(batch);
    let torch_grads = torch.gradients_of(batch);
    let gopts = GraphOptions::new(batch.batch_size, batch.seq_len)
        .with_passes(passes)
        .with_attention_mask(batch.attention_mask.is_some());
    let model = build_training_graph(cfg, &gopts).unwrap();
    // The SiLU-gated MLP of every layer is one `swiglu` when the pass is on (Gemma's GeGLU is not).
    let silu = cfg.activation() == ortbench_models::config::Activation::Silu;
    let swiglu = if passes.enabled("fuse_swiglu") && silu { cfg.num_layers() } else { 0 };
    assert_eq!(model.pass_report.rewrites("fuse_swiglu"), swiglu, "{label}: {}", model.pass_report);
    let params = model.flatten(&weights).unwrap();
    let mut grads = vec![f32::NAN; params.len()];
    let feed = model.feed(batch).unwrap();
    let mut exec = ortbench_engine::exec::planned::PlannedExecutor::new(&model.graph).unwrap();
    let engine_loss = exec.train_step(&params, &feed.inputs(), 0, &mut grads).unwrap() as f64;
    let engine_grads = model.unflatten(&grads).unwrap();
    let rel = (engine_loss - torch_loss).abs() / torch_loss.abs();
    println!("{label}: loss engine {engine_loss:.8} torch {torch_loss:.8} (rel {rel:.2e})");
    assert!(rel <= LOSS_RTOL, "{label}: loss engine {engine_loss} vs torch {torch_loss}");
    assert_eq!(engine_grads.tensors.len(), torch_grads.tensors.len());
    let (mut worst, mut worst_name) = (0f64, String::new());
    for e in &engine_grads.tensors {
        let g = torch_grads.get(&e.name).unwrap_or_else(|| panic!("{label}: no {}", e.name));
        assert_eq!(e.shape, g.shape, "{label}: {}", e.name);
        let max_abs = g.data.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
        let max_diff =
            e.data.iter().zip(&g.data).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()));
        assert!(e.data.iter().all(|v| v.is_finite()), "{label}: {} not finite", e.name);
        assert!(
            max_diff <= ATOL + RTOL * max_abs,
            "{label}: gradient of {} differs: {max_diff:.3e} (max |g| {max_abs:.3e})",
            e.name
        );
        let r = max_diff / max_abs.max(f64::MIN_POSITIVE);
        if r > worst {
            (worst, worst_name) = (r, e.name.clone());
        }
    }
    println!(
        "{label}: {} gradients match; worst {worst_name}: diff/max|g| {worst:.2e}",
        engine_grads.tensors.len()
    );
    worst
}

fn config(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> ModelConfig {
    let mut raw = ortbench_models::spec::builtin_config(name).unwrap().raw;
    edit(&mut raw);
    let mut cfg = ModelConfig::from_value(raw, name).unwrap();
    cfg.set_dropout(0.0);
    cfg
}

/// A synthetic batch with right padding in row 0 and left padding in row 1 (pad id 0), or none.
fn batch(cfg: &ModelConfig, b: usize, t: usize, seed: u64, padded: bool) -> Batch {
    let mut batch = DataSource::synthetic(cfg, b, t, seed).unwrap().batch(0);
    if padded {
        let mut mask = vec![1i64; b * t];
        // Row 0: the last 5 positions; row 1: the first 3.
        for j in (t - 5..t).chain(t..t + 3) {
            mask[j] = 0;
            batch.input_ids[j] = 0;
        }
        if batch.labels.len() == b * t {
            for (l, m) in batch.labels.iter_mut().zip(&mask) {
                if *m == 0 {
                    *l = -100;
                }
            }
        }
        batch.attention_mask = Some(mask);
    }
    batch
}

#[test]
fn llama_engine_gradients_match_torch() {
    for name in [
        "tiny-llama",
        "tiny-mistral",
        "tiny-qwen2",
        "tiny-qwen3",
        "tiny-phi3",
        "tiny-gemma",
        "tiny-gemma2",
        "tiny-gemma3",
    ] {
        let cfg = config(name, |_| {});
        check_gradients(name, &cfg, &batch(&cfg, 3, 16, 21, false));
        let padded = config(name, |r| r["pad_token_id"] = serde_json::json!(0));
        check_gradients(&format!("{name} padded"), &padded, &batch(&padded, 3, 16, 22, true));
    }
}

#[test]
fn llama_engine_gradients_match_torch_mqa_window_llama3_untied_biases() {
    let cfg = config("tiny-llama", |r| {
        r["num_key_value_heads"] = serde_json::json!(1);
        r["tie_word_embeddings"] = serde_json::json!(false);
        r["attention_bias"] = serde_json::json!(true);
        r["mlp_bias"] = serde_json::json!(true);
        r["pad_token_id"] = serde_json::json!(0);
        r["rope_parameters"] = serde_json::json!({"rope_type": "llama3", "rope_theta": 500000.0,
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8});
    });
    check_gradients(
        "tiny-llama MQA, untied, biases, llama3 rope",
        &cfg,
        &batch(&cfg, 3, 16, 23, true),
    );
    let mistral = config("tiny-mistral", |r| {
        r["sliding_window"] = serde_json::json!(5);
        r["pad_token_id"] = serde_json::json!(0);
    });
    check_gradients("tiny-mistral window 5", &mistral, &batch(&mistral, 3, 16, 24, false));
    check_gradients("tiny-mistral window 5 padded", &mistral, &batch(&mistral, 3, 16, 25, true));
    let qwen3 = config("tiny-qwen3", |r| {
        r["use_sliding_window"] = serde_json::json!(true);
        r["sliding_window"] = serde_json::json!(4);
        r["max_window_layers"] = serde_json::json!(1);
        r["pad_token_id"] = serde_json::json!(0);
    });
    check_gradients("tiny-qwen3 window 4 from layer 1", &qwen3, &batch(&qwen3, 3, 16, 26, true));
    // Gemma 2's soft-caps where tanh bends (scores and logits of a few caps), a window of 5;
    // Gemma 3's local rope on its sliding layer, a window of 5.
    let gemma2 = config("tiny-gemma2", |r| {
        r["sliding_window"] = serde_json::json!(5);
        r["attn_logit_softcapping"] = serde_json::json!(0.05);
        r["final_logit_softcapping"] = serde_json::json!(0.2);
    });
    check_gradients("tiny-gemma2 window 5, caps", &gemma2, &batch(&gemma2, 3, 16, 28, true));
    let gemma3 = config("tiny-gemma3", |r| r["sliding_window"] = serde_json::json!(5));
    check_gradients("tiny-gemma3 window 5", &gemma3, &batch(&gemma3, 3, 16, 29, true));
    // A Gemma 3 given attention soft-capping runs eager, as HF must run it.
    let capped = config("tiny-gemma3", |r| r["attn_logit_softcapping"] = serde_json::json!(0.05));
    check_gradients("tiny-gemma3 capped", &capped, &batch(&capped, 3, 16, 30, true));
}

#[test]
fn llama_sequence_classification_engine_gradients_match_torch() {
    for name in ["tiny-llama", "tiny-qwen2"] {
        let cfg = config(name, |r| {
            let arch = if name == "tiny-llama" {
                "LlamaForSequenceClassification"
            } else {
                "Qwen2ForSequenceClassification"
            };
            r["architectures"] = serde_json::json!([arch]);
            r["num_labels"] = serde_json::json!(3);
            r["pad_token_id"] = serde_json::json!(0);
        });
        check_gradients(&format!("{name} classifier"), &cfg, &batch(&cfg, 3, 16, 27, true));
    }
}

/// `ort --device cuda`: every op of the family's training graph has a GPU kernel (RMSNorm,
/// rotary, SwiGLU, grouped-query attention), so planning for the GPU succeeds.
#[test]
fn gpu_planning_accepts_the_family() {
    use ortbench_engine::exec::gpu::support::GpuSupport;
    for name in ["tiny-llama", "tiny-qwen3", "tiny-mistral"] {
        let cfg = config(name, |_| {});
        let model = build_training_graph(&cfg, &GraphOptions::new(2, 8)).unwrap();
        let g = &model.graph;
        if let Err(e) = ortbench_engine::plan::build(g, &GpuSupport::for_graph(g)) {
            panic!("{name}: {e}");
        }
    }
}

/// The builder's eager graph without any pass (repeat_kv as reshape/concat/reshape, the
/// softmax reading the padding or window mask) on the planned executor: the same numbers.
#[test]
fn unfused_llama_engine_gradients_match_torch() {
    let none = ortbench_engine::passes::PassConfig::none();
    let llama = config("tiny-llama", |r| r["pad_token_id"] = serde_json::json!(0));
    check_gradients_with(
        "tiny-llama padded, no passes",
        &llama,
        &batch(&llama, 3, 16, 31, true),
        none,
    );
    let mistral = config("tiny-mistral", |r| {
        r["sliding_window"] = serde_json::json!(5);
        r["pad_token_id"] = serde_json::json!(0);
    });
    let b = batch(&mistral, 3, 16, 32, true);
    check_gradients_with("tiny-mistral window 5 padded, no passes", &mistral, &b, none);
}
