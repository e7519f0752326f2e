//! The ONNX export computes the engine's logits: for the five architectures (tiny-bert MLM,
//! tiny-gpt2 LM, a tiny BERT classifier and a tiny GPT-2 classifier, both with pad_token_id 0,
//! and a tiny BERT token classifier), RoBERTa's three heads, DistilBERT's MLM and classifier,
//! and the Llama family's (tiny Llama, Qwen2 and Qwen3 LMs,
//! Llama with Llama 3's rope scaling, a tiny Llama classifier)
//! with random weights, one export runs on onnxruntime (CPU execution provider, through
//! `scripts/onnx-check.py`) at three batch shapes — 2×9 and 3×16 with right-padded,
//! left-padded and unpadded rows, and 1×64 — and its logits match `InferenceModel::logits` at the same size within
//! 1e-4 of the largest |logit|, at every position (padded ones included: the export computes
//! them as the engine does, fully masked attention rows giving zeros).
//!
//! Needs a python with onnxruntime, numpy and safetensors: `ORTBENCH_PYTHON` (default
//! `python3`); with `onnx` installed too, each export also goes through onnx's checker (full
//! shape inference). So the test is `#[ignore]`d: a plain `cargo test` lists it as ignored with
//! the reason instead of passing without running. scripts/test runs it with `--ignored` under
//! the venv's python (setup installs onnxruntime), and then a missing module is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use ortbench_models::graph::{build_training_graph, GraphOptions, InferenceModel};
use ortbench_models::onnx::export_onnx;
use ortbench_models::rng::Rng;
use ortbench_models::spec::builtin_config;
use ortbench_models::{Batch, DataSource, ModelConfig, Weights};
use safetensors::{tensor::TensorView, Dtype, SafeTensors};

/// Relative to the largest |logit| of the engine's output.
const TOL: f32 = 1e-4;

fn config(base: &str, arch: Option<&str>) -> ModelConfig {
    let mut raw = match base {
        // tiny-llama with Llama 3's rope scaling, biting at these positions (as the HF
        // fixture tiny-llama-rope-llama3: factor 8 over an original 32 positions).
        "tiny-llama-rope-llama3" => {
            let mut raw = builtin_config("tiny-llama").unwrap().raw;
            raw["rope_parameters"] = serde_json::json!({
                "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32
            });
            raw
        }
        // The other rope types, biting at these positions (linear /4; yarn ×4 over an original
        // 32 of the 128 positions — frequency 0 extrapolated, 1 ramped, 2.. interpolated — with
        // its attention factor in the tables; dynamic past 16).
        "tiny-llama-rope-linear" | "tiny-llama-rope-yarn" | "tiny-llama-rope-dynamic" => {
            let mut raw = builtin_config("tiny-llama").unwrap().raw;
            raw["rope_parameters"] = match base {
                "tiny-llama-rope-linear" => serde_json::json!({
                    "rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
                "tiny-llama-rope-yarn" => serde_json::json!({
                    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                    "original_max_position_embeddings": 32}),
                _ => {
                    serde_json::json!({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
                }
            };
            if base == "tiny-llama-rope-dynamic" {
                raw["max_position_embeddings"] = serde_json::json!(16);
            }
            raw
        }
        // Phi-3's partial rotary embedding: 8 of each head's 16 dimensions turned.
        "tiny-phi3-partial" => {
            let mut raw = builtin_config("tiny-phi3").unwrap().raw;
            raw["rope_parameters"]["partial_rotary_factor"] = serde_json::json!(0.5);
            raw
        }
        _ => builtin_config(base).unwrap().raw,
    };
    if let Some(arch) = arch {
        raw["architectures"] = serde_json::json!([arch]);
        raw["num_labels"] = serde_json::json!(3);
        raw["pad_token_id"] = serde_json::json!(0);
    }
    let mut cfg = ModelConfig::from_value(raw, &format!("{base} as {arch:?}")).unwrap();
    cfg.set_dropout(0.0);
    cfg
}

/// The python to run onnxruntime with, or why there is none.
fn python() -> Result<(String, bool), String> {
    let py = std::env::var("ORTBENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let has = |module: &str| {
        Command::new(&py)
            .args(["-c", &format!("import {module}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if !has("onnxruntime, numpy, safetensors") {
        return Err(format!(
            "'{py}' cannot import onnxruntime, numpy and safetensors: set ORTBENCH_PYTHON to a python that can (pip install onnxruntime numpy safetensors)"
        ));
    }
    Ok((py.clone(), has("onnx")))
}

/// Padded rows of a batch: (row, pad on the left, how many).
type PadRows = &'static [(usize, bool, usize)];

/// Rows padded as HF tokenizers pad: (row, pad on the left, how many), pad ids set to the
/// config's pad_token_id (0 without one).
fn padded(mut batch: Batch, pads: &[(usize, bool, usize)], pad: i64) -> Batch {
    let t = batch.seq_len;
    let mut mask = vec![1i64; batch.batch_size * t];
    for &(row, left, n) in pads {
        let r = &mut mask[row * t..(row + 1) * t];
        if left {
            r[..n].fill(0)
        } else {
            r[t - n..].fill(0)
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

fn write_inputs(batch: &Batch, path: &Path) {
    let shape = vec![batch.batch_size, batch.seq_len];
    let bytes = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (ids, mask) = (bytes(&batch.input_ids), bytes(batch.attention_mask.as_ref().unwrap()));
    let views = vec![
        ("input_ids".to_string(), TensorView::new(Dtype::I64, shape.clone(), &ids).unwrap()),
        ("attention_mask".to_string(), TensorView::new(Dtype::I64, shape, &mask).unwrap()),
    ];
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn run_onnxruntime(
    py: &str,
    check: bool,
    model: &Path,
    inputs: &Path,
    out: &Path,
) -> (Vec<usize>, Vec<f32>) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/onnx-check.py");
    let mut cmd = Command::new(py);
    cmd.arg(&script).arg(model).arg(inputs).arg(out);
    if check {
        cmd.arg("--check");
    }
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{} failed:\n{}",
        script.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let bytes = std::fs::read(out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    assert_eq!(t.dtype(), Dtype::F32);
    let data =
        t.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    (t.shape().to_vec(), data)
}

#[test]
#[ignore = "needs onnxruntime (ORTBENCH_PYTHON); scripts/test runs it with --ignored"]
fn onnxruntime_computes_the_engine_logits() {
    let (py, check) = python().unwrap_or_else(|why| panic!("this test needs onnxruntime: {why}"));
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("tiny-bert", None),
        ("tiny-gpt2", None),
        ("tiny-bert", Some("BertForSequenceClassification")),
        ("tiny-gpt2", Some("GPT2ForSequenceClassification")),
        ("tiny-bert", Some("BertForTokenClassification")),
        // RoBERTa (positions after pad, CumSum) with its three heads; DistilBERT's MLM and
        // ReLU classifier.
        ("tiny-roberta", None),
        ("tiny-roberta", Some("RobertaForSequenceClassification")),
        ("tiny-roberta", Some("RobertaForTokenClassification")),
        ("tiny-distilbert", None),
        ("tiny-distilbert", Some("DistilBertForSequenceClassification")),
        // The Llama family: GQA (4 heads, 2 K/V), tied head; Qwen2's q/k/v biases; Qwen3's
        // q/k norms and head_dim ≠ hidden/heads, untied; Llama 3's rope scaling; the
        // last-token classifier.
        ("tiny-llama", None),
        ("tiny-qwen2", None),
        ("tiny-qwen3", None),
        ("tiny-llama-rope-llama3", None),
        ("tiny-llama-rope-linear", None),
        ("tiny-llama-rope-yarn", None),
        ("tiny-smollm3", None),
        // Phi-3's fused projections (split in the graph).
        ("tiny-phi3", None),
        ("tiny-phi3-partial", None),
        ("tiny-gemma", None),
        ("tiny-llama", Some("LlamaForSequenceClassification")),
    ];
    // 2×9: one row right-padded; 3×16: right-padded, unpadded, left-padded; 1×64: one full
    // row at the models' 64 positions.
    let shapes: [(usize, usize, PadRows); 3] =
        [(2, 9, &[(1, false, 4)]), (3, 16, &[(0, false, 5), (2, true, 7)]), (1, 64, &[])];
    for (seed, (base, arch)) in cases.into_iter().enumerate() {
        let cfg = config(base, arch);
        let name = cfg.arch.hf_name();
        let mut params = build_training_graph(&cfg, &GraphOptions::new(1, 8))
            .unwrap()
            .flatten(&Weights::init(&cfg, seed as u64))
            .unwrap();
        // HF's init (std 0.02) makes attention nearly uniform, where a wrong score scale or
        // mask barely shows; N(0, 0.1) on top sharpens it and makes logits O(1).
        let mut rng = Rng::new(seed as u64);
        params.iter_mut().for_each(|p| *p += 0.1 * rng.normal() as f32);
        let model = dir.path().join(format!("{name}.onnx"));
        let report = export_onnx(&cfg, &params, &model).unwrap();
        println!("{report}");
        for &(b, t, pads) in &shapes {
            let pad = cfg.raw["pad_token_id"].as_i64().unwrap_or(0);
            let batch = padded(DataSource::synthetic(&cfg, b, t, 7).unwrap().batch(0), pads, pad);
            let engine =
                InferenceModel::new(&cfg, &GraphOptions::new(b, t).with_attention_mask(true))
                    .unwrap();
            let want = engine.logits(&params, &batch).unwrap();
            let (inputs, out) =
                (dir.path().join("inputs.safetensors"), dir.path().join("logits.safetensors"));
            write_inputs(&batch, &inputs);
            let (shape, got) = run_onnxruntime(&py, check, &model, &inputs, &out);
            assert_eq!(shape, engine.graph.shape(engine.logits), "{name} {b}×{t}");
            let big = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(big.is_finite() && big > 0.0, "{name} {b}×{t}: engine logits {big}");
            // Per position for the LM heads: the padded ones reported apart.
            let n = *shape.last().unwrap();
            let mask = batch.attention_mask.as_ref().unwrap();
            let (mut at_tokens, mut at_pads) = (0f32, 0f32);
            for (row, (g, w)) in got.chunks_exact(n).zip(want.chunks_exact(n)).enumerate() {
                let d = g.iter().zip(w).fold(0f32, |m, (x, y)| {
                    if (x - y).is_nan() {
                        f32::INFINITY
                    } else {
                        m.max((x - y).abs())
                    }
                });
                let is_pad = shape.len() == 3 && mask[row] == 0;
                if is_pad {
                    at_pads = at_pads.max(d)
                } else {
                    at_tokens = at_tokens.max(d)
                }
            }
            let pads = if shape.len() == 3 && mask.contains(&0) {
                format!(", {at_pads:.3e} at padded positions")
            } else {
                String::new()
            };
            println!(
                "  {name} {b}×{t}: max |onnxruntime − engine| = {at_tokens:.3e}{pads} (largest |logit| {big:.3e}, relative {:.3e})",
                at_tokens.max(at_pads) / big
            );
            assert!(
                at_tokens <= TOL * big,
                "{name} {b}×{t}: logits differ by {at_tokens:e} (largest {big:e})"
            );
            assert!(at_pads <= TOL * big, "{name} {b}×{t}: logits at padded positions differ by {at_pads:e} (largest {big:e})");
        }
    }
}

/// A sliding window is refused in one line, naming it: the engine builds its mask only where
/// it bites, so an export made at short probe sequences would attend beyond the window.
#[test]
fn export_refuses_a_sliding_window_in_one_line() {
    // Gemma 2 and 3 always have sliding layers: refused the same way.
    for base in ["tiny-mistral", "tiny-gemma2", "tiny-gemma3"] {
        let e = refused_export(base);
        assert!(
            e.contains("sliding-window attention (window 64)") && !e.contains('\n'),
            "{base}: {e}"
        );
    }
}

/// The error of exporting `base` (which must fail), having checked nothing was written.
fn refused_export(base: &str) -> String {
    let cfg = config(base, None);
    let params = build_training_graph(&cfg, &GraphOptions::new(1, 8))
        .unwrap()
        .flatten(&Weights::init(&cfg, 0))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    let e = export_onnx(&cfg, &params, &path).unwrap_err().to_string();
    assert!(!path.exists(), "{base}: nothing half-written");
    e
}

/// Dynamic rope scaling is refused in one line: its frequencies depend on the sequence length,
/// and the export slices its tables from the longest.
#[test]
fn export_refuses_dynamic_rope_scaling_in_one_line() {
    let e = refused_export("tiny-llama-rope-dynamic");
    assert!(
        e.contains("dynamic and longrope rope scaling have no ONNX export") && !e.contains('\n'),
        "{e}"
    );
}
