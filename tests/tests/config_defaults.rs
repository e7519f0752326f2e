//! Config readers against HF's AutoConfig: tests/fixtures/config-defaults.json (made by
//! scripts/make-fixtures.py config-defaults with transformers 5.23) holds, for minimal and
//! partly sized config.json files of every model type ortbench reads (and the published
//! Llama-family configs in their legacy rope_theta/rope_scaling form), the attributes
//! of the config HF builds from each. Every family's parsed config must equal HF's on each
//! field it reads: a field HF defaults is never an error here, and takes HF's value.

use std::path::Path;

use ortbench_models::family::bert::Variant as BertVariant;
use ortbench_models::family::llama::{LayerType, Rope, RopeScaling, Variant};
use ortbench_models::family::Family;
use ortbench_models::ModelConfig;
use serde_json::Value;

macro_rules! j {
    ($e:expr) => {
        serde_json::to_value($e)
    };
}

fn cases() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/config-defaults.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(v["transformers"].as_str().unwrap(), "5.23.0");
    v["cases"].as_array().unwrap().clone()
}

/// `ours` equals HF's `key` (numbers compared as f64, null as None).
fn same(label: &str, key: &str, hf: &Value, ours: Value) {
    let want = &hf[key];
    let eq = match (want.as_f64(), ours.as_f64()) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-12 * a.abs().max(1.0),
        _ => *want == ours,
    };
    assert!(eq, "{label}: {key}: ours {ours}, HF {want}");
}

#[test]
fn parsed_configs_equal_hf_autoconfig_defaults() {
    let mut seen = std::collections::BTreeSet::new();
    for case in cases() {
        let (mt, name) = (case["model_type"].as_str().unwrap(), case["name"].as_str().unwrap());
        let label = format!("{mt} {name}");
        let hf = &case["hf"];
        let cfg = ModelConfig::from_value(case["config"].clone(), &label)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let mut n = 0;
        let mut check = |key: &str, ours: Value| {
            same(&label, key, hf, ours);
            n += 1;
        };
        match &cfg.family {
            Family::Bert(c) => {
                let want = if mt == "roberta" { BertVariant::Roberta } else { BertVariant::Bert };
                assert_eq!(c.variant, want, "{label}");
                check("vocab_size", j!(c.vocab_size).unwrap());
                check("hidden_size", j!(c.hidden_size).unwrap());
                check("num_hidden_layers", j!(c.num_hidden_layers).unwrap());
                check("num_attention_heads", j!(c.num_attention_heads).unwrap());
                check("intermediate_size", j!(c.intermediate_size).unwrap());
                check("hidden_act", j!(&c.hidden_act).unwrap());
                check("hidden_dropout_prob", j!(c.hidden_dropout_prob).unwrap());
                check("attention_probs_dropout_prob", j!(c.attention_probs_dropout_prob).unwrap());
                check("max_position_embeddings", j!(c.max_position_embeddings).unwrap());
                check("type_vocab_size", j!(c.type_vocab_size).unwrap());
                check("initializer_range", j!(c.initializer_range).unwrap());
                check("layer_norm_eps", j!(c.layer_norm_eps).unwrap());
                check("pad_token_id", j!(c.pad_token_id).unwrap());
                check("classifier_dropout", j!(c.classifier_dropout).unwrap());
                check("tie_word_embeddings", j!(c.tie_word_embeddings).unwrap());
            }
            Family::DistilBert(c) => {
                check("vocab_size", j!(c.vocab_size).unwrap());
                check("max_position_embeddings", j!(c.max_position_embeddings).unwrap());
                check("sinusoidal_pos_embds", j!(c.sinusoidal_pos_embds).unwrap());
                check("n_layers", j!(c.n_layers).unwrap());
                check("n_heads", j!(c.n_heads).unwrap());
                check("dim", j!(c.dim).unwrap());
                check("hidden_dim", j!(c.hidden_dim).unwrap());
                check("dropout", j!(c.dropout).unwrap());
                check("attention_dropout", j!(c.attention_dropout).unwrap());
                check("activation", j!(&c.activation).unwrap());
                check("initializer_range", j!(c.initializer_range).unwrap());
                check("qa_dropout", j!(c.qa_dropout).unwrap());
                check("seq_classif_dropout", j!(c.seq_classif_dropout).unwrap());
                check("pad_token_id", j!(c.pad_token_id).unwrap());
                check("tie_word_embeddings", j!(c.tie_word_embeddings).unwrap());
            }
            Family::Gpt2(c) => {
                check("vocab_size", j!(c.vocab_size).unwrap());
                check("n_positions", j!(c.n_positions).unwrap());
                check("n_embd", j!(c.n_embd).unwrap());
                check("n_layer", j!(c.n_layer).unwrap());
                check("n_head", j!(c.n_head).unwrap());
                check("n_inner", j!(c.n_inner).unwrap());
                check("activation_function", j!(&c.activation_function).unwrap());
                check("resid_pdrop", j!(c.resid_pdrop).unwrap());
                check("embd_pdrop", j!(c.embd_pdrop).unwrap());
                check("attn_pdrop", j!(c.attn_pdrop).unwrap());
                check("layer_norm_epsilon", j!(c.layer_norm_epsilon).unwrap());
                check("initializer_range", j!(c.initializer_range).unwrap());
                check("scale_attn_weights", j!(c.scale_attn_weights).unwrap());
                check(
                    "scale_attn_by_inverse_layer_idx",
                    j!(c.scale_attn_by_inverse_layer_idx).unwrap(),
                );
                check("reorder_and_upcast_attn", j!(c.reorder_and_upcast_attn).unwrap());
                check("tie_word_embeddings", j!(c.tie_word_embeddings).unwrap());
                check("pad_token_id", j!(c.pad_token_id).unwrap());
            }
            Family::Llama(c) => {
                let want_variant = match mt {
                    "llama" => Variant::Llama,
                    "mistral" => Variant::Mistral,
                    "qwen2" => Variant::Qwen2,
                    "qwen3" => Variant::Qwen3,
                    "smollm3" => Variant::SmolLM3,
                    "phi3" => Variant::Phi3,
                    "gemma" => Variant::Gemma,
                    "gemma2" => Variant::Gemma2,
                    "gemma3_text" => Variant::Gemma3,
                    other => panic!("{label}: model_type {other}"),
                };
                assert_eq!(c.variant, want_variant, "{label}");
                check("vocab_size", j!(c.vocab_size).unwrap());
                check("hidden_size", j!(c.hidden_size).unwrap());
                check("intermediate_size", j!(c.intermediate_size).unwrap());
                check("num_hidden_layers", j!(c.num_hidden_layers).unwrap());
                check("num_attention_heads", j!(c.num_attention_heads).unwrap());
                check("num_key_value_heads", j!(c.num_key_value_heads).unwrap());
                // Qwen2's config has no head_dim: its modeling takes hidden / heads.
                let hd = if hf["head_dim"].is_null() {
                    c.hidden_size / c.num_attention_heads
                } else {
                    hf["head_dim"].as_u64().unwrap() as usize
                };
                assert_eq!(c.head_dim, hd, "{label}: head_dim");
                // Gemma 2/3's MLP reads hidden_activation.
                let gemma23 = matches!(c.variant, Variant::Gemma2 | Variant::Gemma3);
                let act = if gemma23 { "hidden_activation" } else { "hidden_act" };
                check(act, j!(&c.hidden_act).unwrap());
                check("max_position_embeddings", j!(c.max_position_embeddings).unwrap());
                check("initializer_range", j!(c.initializer_range).unwrap());
                check("rms_norm_eps", j!(c.rms_norm_eps).unwrap());
                check("pad_token_id", j!(c.pad_token_id).unwrap());
                check("tie_word_embeddings", j!(c.tie_word_embeddings).unwrap());
                check("attention_dropout", j!(c.attention_dropout).unwrap());
                // Biases: the field where the type has one; Mistral none, Qwen2 q/k/v only.
                match c.variant {
                    Variant::Llama
                    | Variant::Qwen3
                    | Variant::SmolLM3
                    | Variant::Gemma
                    | Variant::Gemma2
                    | Variant::Gemma3 => {
                        check("attention_bias", j!(c.qkv_bias).unwrap());
                        check("attention_bias", j!(c.o_bias).unwrap());
                    }
                    Variant::Mistral | Variant::Phi3 => {
                        assert!(!c.qkv_bias && !c.o_bias, "{label}")
                    }
                    Variant::Qwen2 => assert!(c.qkv_bias && !c.o_bias, "{label}"),
                }
                if matches!(c.variant, Variant::Llama | Variant::SmolLM3) {
                    check("mlp_bias", j!(c.mlp_bias).unwrap());
                } else {
                    assert!(!c.mlp_bias, "{label}");
                }
                let qk_norm = matches!(c.variant, Variant::Qwen3 | Variant::Gemma3);
                assert_eq!(c.qk_norm, qk_norm, "{label}");
                // Gemma 2/3's score scale, soft-caps and sandwich norms.
                assert_eq!(c.sandwich_norms, gemma23, "{label}");
                if gemma23 {
                    check("query_pre_attn_scalar", j!(c.query_pre_attn_scalar).unwrap());
                    check("attn_logit_softcapping", j!(c.attn_logit_softcapping).unwrap());
                    check("final_logit_softcapping", j!(c.final_logit_softcapping).unwrap());
                } else {
                    assert!(c.query_pre_attn_scalar.is_none(), "{label}");
                    assert!(c.attn_logit_softcapping.is_none(), "{label}");
                    assert!(c.final_logit_softcapping.is_none(), "{label}");
                }
                assert_eq!(c.local_rope.is_some(), c.variant == Variant::Gemma3, "{label}");
                // Phi-3's fused projections and residual dropout.
                assert_eq!(c.fused_projections, c.variant == Variant::Phi3, "{label}");
                match c.resid_dropout {
                    Some(p) => check("resid_pdrop", j!(p).unwrap()),
                    None => assert!(c.variant != Variant::Phi3, "{label}"),
                }
                // SmolLM3's NoPE layers (HF's no_rope_layers, 1 = rotary).
                let rope: Vec<i64> = c.rope_layers.iter().map(|&r| i64::from(r)).collect();
                if c.variant == Variant::SmolLM3 {
                    check("no_rope_layers", j!(&rope).unwrap());
                } else {
                    assert!(c.rope_layers.iter().all(|&r| r), "{label}");
                }
                // The rope parameters as standardised; Gemma 3's per layer type.
                let rope = &hf["rope_parameters"];
                match &c.local_rope {
                    Some(local) => {
                        check_rope(&label, &rope["full_attention"], &c.rope);
                        check_rope(&label, &rope["sliding_attention"], local);
                    }
                    None => check_rope(&label, rope, &c.rope),
                }
                // The window and which layers slide (Mistral: every layer when it has one).
                // SmolLM3 keeps sliding_window in its config whether or not use_sliding_window
                // turns it on; its attention reads it only then (the others null it).
                if c.variant == Variant::SmolLM3 && hf["use_sliding_window"] != true {
                    assert_eq!(c.sliding_window, None, "{label}");
                } else {
                    check("sliding_window", j!(c.sliding_window).unwrap());
                }
                let types: Vec<&str> = c
                    .layer_types
                    .iter()
                    .map(|t| match t {
                        LayerType::Full => "full_attention",
                        LayerType::Sliding => "sliding_attention",
                    })
                    .collect();
                match hf["layer_types"].as_array() {
                    Some(_) => check("layer_types", j!(&types).unwrap()),
                    None => {
                        let want = if c.sliding_window.is_some() {
                            "sliding_attention"
                        } else {
                            "full_attention"
                        };
                        assert!(types.iter().all(|t| *t == want), "{label}: {types:?}");
                    }
                }
            }
        }
        println!("{label}: {n} fields equal HF's");
        seen.insert(mt.to_string());
    }
    let want: std::collections::BTreeSet<String> = [
        "bert",
        "roberta",
        "distilbert",
        "gpt2",
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "smollm3",
        "phi3",
        "gemma",
        "gemma2",
        "gemma3_text",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(seen, want);
}

/// A rope as HF standardised it (`hf`: one `rope_parameters` dict) against ours.
fn check_rope(label: &str, hf: &Value, rope: &Rope) {
    same(label, "rope_theta", hf, j!(rope.theta).unwrap());
    match rope.scaling {
        RopeScaling::Default => {
            assert_eq!(hf["rope_type"], "default", "{label}")
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            assert_eq!(hf["rope_type"], "llama3", "{label}");
            same(label, "factor", hf, j!(factor).unwrap());
            same(label, "low_freq_factor", hf, j!(low_freq_factor).unwrap());
            same(label, "high_freq_factor", hf, j!(high_freq_factor).unwrap());
            same(
                label,
                "original_max_position_embeddings",
                hf,
                j!(original_max_position_embeddings).unwrap(),
            );
        }
        RopeScaling::Linear { factor } | RopeScaling::Dynamic { factor, .. } => {
            let t = if matches!(rope.scaling, RopeScaling::Linear { .. }) {
                "linear"
            } else {
                "dynamic"
            };
            assert_eq!(hf["rope_type"], t, "{label}");
            same(label, "factor", hf, j!(factor).unwrap());
        }
        RopeScaling::LongRope { ref short_factor, original_max_position_embeddings, .. } => {
            assert_eq!(hf["rope_type"], "longrope", "{label}");
            same(label, "short_factor", hf, j!(short_factor).unwrap());
            same(
                label,
                "original_max_position_embeddings",
                hf,
                j!(original_max_position_embeddings).unwrap(),
            );
        }
        RopeScaling::Yarn { factor, original_max_position_embeddings, .. } => {
            assert_eq!(hf["rope_type"], "yarn", "{label}");
            same(label, "factor", hf, j!(factor).unwrap());
            same(
                label,
                "original_max_position_embeddings",
                hf,
                j!(original_max_position_embeddings).unwrap(),
            );
        }
    }
}
