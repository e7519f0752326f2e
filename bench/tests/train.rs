//! `ortbench train` and `ortbench export` end to end, on the fixtures' toy sentiment dataset
//! and tiny models with real tokenizers (tests/fixtures, scripts/make-fixtures.py):
//! - a classifier fine-tunes from a CSV file and its eval accuracy rises well above chance;
//! - the saved directory loads in HF Transformers (scripts/hf-logits.py) with no missing or
//!   unexpected weight and gives the engine's logits within 1e-4 — for the classifier, and for
//!   an MLM and a causal LM (tied decoders saved as HF saves them);
//! - `--resume` from a checkpoint continues the loss curve bit for bit;
//! - `ortbench export --onnx` of the trained model runs under onnxruntime with its logits.
//!
//! Python: `ORTBENCH_PYTHON` (scripts/test sets the venv's), else the checkout's .venv.

use std::path::{Path, PathBuf};
use std::process::Command;

use ortbench_models::graph::{GraphOptions, InferenceModel};
use ortbench_models::text::{read_text_rows, tokenize, Columns};
use ortbench_models::{resolve, Batch, HubOptions, ModelConfig, Weights};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixture(p: &str) -> PathBuf {
    root().join("tests/fixtures").join(p)
}

fn ortbench(args: &[&str], cache: &Path) -> (bool, String, String) {
    ortbench_env(args, cache, &[])
}

/// [`ortbench`] with extra environment variables.
fn ortbench_env(args: &[&str], cache: &Path, env: &[(&str, &str)]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ortbench"))
        .args(args)
        .env("ORTBENCH_CACHE_DIR", cache)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn python() -> String {
    std::env::var("ORTBENCH_PYTHON")
        .unwrap_or_else(|_| root().join(".venv/bin/python").to_string_lossy().into_owned())
}

fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut r = csv::Reader::from_path(path).unwrap();
    let h = r.headers().unwrap().iter().map(String::from).collect();
    (h, r.records().map(|x| x.unwrap().iter().map(String::from).collect()).collect())
}

/// Eight eval texts as the saved model's tokenizer makes them (padded rows) and its config.
fn inputs(model_dir: &Path, task_rows: &str) -> (ModelConfig, Batch) {
    let model = resolve(model_dir.to_str().unwrap(), &HubOptions::from_env()).unwrap();
    let mut cfg = model.config.clone();
    cfg.set_dropout(0.0);
    let tok =
        tokenizers::Tokenizer::from_file(model.tokenizer_file(&HubOptions::from_env()).unwrap())
            .unwrap();
    let rows = read_text_rows(&fixture(task_rows), &Columns::default()).unwrap();
    // Tokenised as a classifier's rows (one text each, padded), whatever the head; the labels
    // are not used.
    let rows = ortbench_models::text::TextRows {
        texts: rows.texts[..8].to_vec(),
        labels: Some(vec![ortbench_models::text::LabelValue::Int(0); 8]),
    };
    let as_cls =
        ortbench_models::with_task(cfg.clone(), Some("sequence-classification"), "x").unwrap();
    let t = tokenize(&as_cls, &tok, &rows, 32, &mut |_, _| {}).unwrap();
    let batch = Batch {
        batch_size: 8,
        seq_len: t.seq_len,
        input_ids: t.input_ids,
        labels: Vec::new(),
        targets: None,
        attention_mask: t.attention_mask,
    };
    (cfg, batch)
}

fn write_inputs(path: &Path, b: &Batch) {
    use safetensors::tensor::{Dtype, TensorView};
    let le = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (ids, mask) = (le(&b.input_ids), le(b.attention_mask.as_ref().unwrap()));
    let shape = vec![b.batch_size, b.seq_len];
    let views = vec![
        ("input_ids".to_string(), TensorView::new(Dtype::I64, shape.clone(), &ids).unwrap()),
        ("attention_mask".to_string(), TensorView::new(Dtype::I64, shape, &mask).unwrap()),
    ];
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn read_logits(path: &Path) -> (Vec<f32>, Option<std::collections::HashMap<String, String>>) {
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    (
        t.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        meta.metadata().clone(),
    )
}

/// The engine's logits of the saved model for `batch`.
fn engine_logits(dir: &Path, cfg: &ModelConfig, batch: &Batch) -> Vec<f32> {
    let (w, report) = Weights::load(cfg, &dir.join("model.safetensors"), 0).unwrap();
    assert!(report.missing.is_empty() && report.unexpected.is_empty(), "{report:?}");
    let inf = InferenceModel::new(
        cfg,
        &GraphOptions::new(batch.batch_size, batch.seq_len).with_attention_mask(true),
    )
    .unwrap();
    inf.logits(&w.flat(cfg).unwrap(), batch).unwrap()
}

/// Max |a − b| over max |b|.
fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let big = b.iter().fold(0f64, |m, &v| m.max(v.abs() as f64)).max(1e-30);
    a.iter().zip(b).fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs())) / big
}

/// HF loads `dir` with nothing missing or unexpected and computes the engine's logits within
/// 1e-4 of the largest, on the eval texts.
fn hf_agrees(dir: &Path, label: &str) {
    let (cfg, batch) = inputs(dir, "text/eval.csv");
    hf_agrees_on(dir, &cfg, &batch, label);
}

/// [`hf_agrees`] on `batch`.
fn hf_agrees_on(dir: &Path, cfg: &ModelConfig, batch: &Batch, label: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (inp, out) = (tmp.path().join("in.safetensors"), tmp.path().join("out.safetensors"));
    write_inputs(&inp, batch);
    let o = Command::new(python())
        .arg(root().join("scripts/hf-logits.py"))
        .args([dir, &inp, &out])
        .output()
        .unwrap();
    assert!(o.status.success(), "{label}: hf-logits.py: {}", String::from_utf8_lossy(&o.stderr));
    let (hf, meta) = read_logits(&out);
    let meta = meta.unwrap();
    assert_eq!(
        (meta["missing_keys"].as_str(), meta["unexpected_keys"].as_str()),
        ("[]", "[]"),
        "{label}: HF's loading report"
    );
    let ours = engine_logits(dir, cfg, batch);
    let d = rel_diff(&ours, &hf);
    println!("{label}: HF Transformers loads the saved directory; logits max |engine − HF| / max|HF| = {d:.2e} ({} values)", hf.len());
    assert!(d < 1e-4, "{label}: {d}");
}

/// `ortbench export --onnx` of the saved directory `out`, run under onnxruntime on the eval
/// texts: its logits are the engine's within 1e-4 of the largest.
fn onnx_computes_the_engine_logits(out: &Path, tmp: &Path, label: &str) {
    let onnx = tmp.join(format!("{label}.onnx"));
    let (ok, stdout, stderr) = ortbench(
        &["export", "--model", out.to_str().unwrap(), "--onnx", onnx.to_str().unwrap()],
        tmp,
    );
    assert!(ok, "{stderr}");
    println!("{stdout}");
    let (cfg, batch) = inputs(out, "text/eval.csv");
    let (inp, res) = (tmp.join("in.safetensors"), tmp.join("ort.safetensors"));
    write_inputs(&inp, &batch);
    let o = Command::new(python())
        .arg(root().join("scripts/onnx-check.py"))
        .args([&onnx, &inp, &res])
        .output()
        .unwrap();
    assert!(o.status.success(), "onnx-check.py: {}", String::from_utf8_lossy(&o.stderr));
    let d = rel_diff(&engine_logits(out, &cfg, &batch), &read_logits(&res).0);
    println!(
        "{label}: exported ONNX under onnxruntime: logits max |engine − ort| / max|ort| = {d:.2e}"
    );
    assert!(d < 1e-4, "{label}: {d}");
}

#[test]
fn train_fine_tunes_a_classifier_that_hf_loads_and_onnx_exports() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sentiment");
    let (ok, stdout, stderr) = ortbench(
        &[
            "train",
            "--model",
            fixture("tiny-bert-sentiment").to_str().unwrap(),
            "--dataset",
            fixture("text/train.csv").to_str().unwrap(),
            "--eval-dataset",
            fixture("text/eval.csv").to_str().unwrap(),
            "--epochs",
            "3",
            "--batch-size",
            "16",
            "--lr",
            "1e-3",
            "--eval-steps",
            "8",
            "--output-dir",
            out.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert!(ok, "{stderr}");
    println!("{stdout}");
    let (h, rows) = read_csv(&out.join("eval.csv"));
    let acc = h.iter().position(|c| c == "eval_accuracy").unwrap();
    let accs: Vec<f64> = rows.iter().map(|r| r[acc].parse().unwrap()).collect();
    println!("eval accuracy every 8 steps: {accs:?}");
    assert_eq!(accs.len(), 12);
    // Two balanced classes: chance is 0.5.
    assert!(*accs.last().unwrap() >= 0.9, "final eval accuracy {:?}", accs.last());
    let (_, steps) = read_csv(&out.join("steps.csv"));
    assert_eq!(steps.len(), 96);
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "steps.parquet",
        "eval.parquet",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
    hf_agrees(&out, "BertForSequenceClassification (trained)");

    // Export the trained model and run it under onnxruntime.
    onnx_computes_the_engine_logits(&out, tmp.path(), "sentiment");
}

/// `ortbench train` of `model` for `steps` steps at batch 4 × seq 32, lr 1e-3, on the fixture
/// `data`, saved to `out` (`--task task` when given): whether it succeeded, and its stderr.
fn train_briefly(
    model: &Path,
    task: Option<&str>,
    data: &str,
    steps: &str,
    out: &Path,
    cwd: &Path,
) -> (bool, String) {
    let (model, data) = (model.to_str().unwrap(), fixture(data));
    let mut args = vec!["train", "--model", model, "--dataset", data.to_str().unwrap()];
    if let Some(task) = task {
        args.extend(["--task", task]);
    }
    args.extend(["--max-steps", steps, "--batch-size", "4", "--seq-len", "32", "--lr", "1e-3"]);
    args.extend(["--output-dir", out.to_str().unwrap()]);
    let (ok, _, stderr) = ortbench(&args, cwd);
    (ok, stderr)
}

/// A masked LM (the sentiment checkpoint with --task masked-lm: a new head) and a causal LM
/// with a tied decoder, a few steps each: HF loads what train saved.
#[test]
fn saved_language_models_load_in_hf() {
    let tmp = tempfile::tempdir().unwrap();
    for (model, task, label) in [
        ("tiny-bert-sentiment", "masked-lm", "BertForMaskedLM"),
        ("tiny-gpt2-text", "causal-lm", "GPT2LMHeadModel"),
    ] {
        let out = tmp.path().join(task);
        let (ok, stderr) =
            train_briefly(&fixture(model), Some(task), "text/corpus.txt", "3", &out, tmp.path());
        assert!(ok, "{label}: {stderr}");
        hf_agrees(&out, label);
    }
}

/// The Llama family through every user path: `train` on a text file with a byte-level BPE
/// tokenizer (Llama 3's split), the saved directory loads in Transformers with the engine's
/// logits, and its ONNX export computes them under onnxruntime.
#[test]
fn train_saves_a_llama_that_hf_loads_and_onnx_exports() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("llama");
    let model = fixture("tiny-llama-text");
    let (ok, stderr) = train_briefly(&model, None, "text/corpus.txt", "4", &out, tmp.path());
    assert!(ok, "{stderr}");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    hf_agrees(&out, "LlamaForCausalLM (trained)");

    onnx_computes_the_engine_logits(&out, tmp.path(), "llama");
}

/// The Llama family's other types — SmolLM3 (NoPE layers), Phi-3 (fused projections, a
/// window), Gemma, Gemma 2 (soft-capping, eager attention in HF) and Gemma 3 (local rope, q/k
/// norms): `train` on the fixtures' tokenised padded rows (`--data`), the saved directory loads
/// in Transformers with the engine's logits on those rows (left-padded ones included); Gemma 3
/// also from a text file with a Gemma-layout tokenizer. (ONNX: models/tests/onnx.rs exports
/// SmolLM3, Phi-3 and Gemma and refuses the sliding layers of Phi-3's window and Gemma 2/3.)
#[test]
fn train_saves_smollm3_phi3_and_gemma_1_2_3_that_hf_loads() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, label) in [
        ("tiny-smollm3-padded", "SmolLM3ForCausalLM"),
        ("tiny-phi3-padded", "Phi3ForCausalLM"),
        ("tiny-gemma-padded", "GemmaForCausalLM"),
        ("tiny-gemma2-padded", "Gemma2ForCausalLM"),
        ("tiny-gemma3-padded", "Gemma3ForCausalLM"),
    ] {
        let (model, data) = (fixture(name), fixture(&format!("{name}/batches.safetensors")));
        let out = tmp.path().join(name);
        let mut args = vec!["train", "--model", model.to_str().unwrap()];
        args.extend(["--data", data.to_str().unwrap(), "--max-steps", "3", "--batch-size", "4"]);
        args.extend(["--lr", "1e-3", "--output-dir", out.to_str().unwrap()]);
        let (ok, _, stderr) = ortbench(&args, tmp.path());
        assert!(ok, "{label}: {stderr}");
        let mut cfg = resolve(out.to_str().unwrap(), &HubOptions::from_env()).unwrap().config;
        cfg.set_dropout(0.0);
        let batch =
            ortbench_models::DataSource::from_file(&cfg, &data, 8, None, 0).unwrap().batch(0);
        assert!(batch.attention_mask.as_ref().is_some_and(|m| m.contains(&0)), "{label}: padded");
        hf_agrees_on(&out, &cfg, &batch, &format!("{label} (trained)"));
    }
    // Gemma 3 from text, through its own tokenizer's layout (SentencePiece-style pieces, byte
    // fallback, <bos>): the saved directory (tokenizer included) loads in HF.
    let out = tmp.path().join("gemma3-text");
    let model = fixture("tiny-gemma3-text");
    let (ok, stderr) = train_briefly(&model, None, "text/corpus.txt", "3", &out, tmp.path());
    assert!(ok, "{stderr}");
    assert!(out.join("tokenizer.json").is_file());
    hf_agrees(&out, "Gemma3ForCausalLM (trained from text)");
}

/// RoBERTa (byte-level BPE, `<s> … </s>`, `<mask>`) and DistilBERT (WordPiece) through every
/// user path: `train` as masked LMs on a text file and RoBERTa as a classifier (a new head via
/// --task), each saved directory loads in Transformers with the engine's logits, and its ONNX
/// export computes them under onnxruntime.
#[test]
fn train_saves_roberta_and_distilbert_that_hf_loads_and_onnx_exports() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("tiny-roberta-text", "masked-lm", "text/corpus.txt", "RobertaForMaskedLM"),
        (
            "tiny-roberta-text",
            "sequence-classification",
            "text/train.csv",
            "RobertaForSequenceClassification",
        ),
        ("tiny-distilbert-text", "masked-lm", "text/corpus.txt", "DistilBertForMaskedLM"),
    ];
    // The classifier's labels, as a user states them in config.json (train.csv's are strings).
    let labelled = tmp.path().join("tiny-roberta-labelled");
    std::fs::create_dir(&labelled).unwrap();
    for f in std::fs::read_dir(fixture("tiny-roberta-text")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, labelled.join(f.file_name().unwrap())).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(labelled.join("config.json")).unwrap())
            .unwrap();
    cfg["id2label"] = serde_json::json!({"0": "negative", "1": "positive"});
    cfg["label2id"] = serde_json::json!({"negative": 0, "positive": 1});
    std::fs::write(labelled.join("config.json"), cfg.to_string()).unwrap();
    for (model, task, data, label) in cases {
        let out = tmp.path().join(label);
        let model =
            if task == "sequence-classification" { labelled.clone() } else { fixture(model) };
        let (ok, stderr) = train_briefly(&model, Some(task), data, "4", &out, tmp.path());
        assert!(ok, "{label}: {stderr}");
        let saved: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(saved["architectures"][0], label);
        hf_agrees(&out, label);
        onnx_computes_the_engine_logits(&out, tmp.path(), label);
    }
}

/// 20 steps straight, and the same run resumed from its checkpoint at step 10: the same
/// losses and gradient norms, bit for bit, and the same final weights.
#[test]
fn resume_continues_the_loss_curve_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let base = |dir: &Path| -> Vec<String> {
        [
            "train",
            "--model",
            fixture("tiny-bert-sentiment").to_str().unwrap(),
            "--dataset",
            fixture("text/train.csv").to_str().unwrap(),
            "--eval-split",
            "0.25",
            "--max-steps",
            "20",
            "--batch-size",
            "8",
            "--lr",
            "1e-3",
            "--save-steps",
            "10",
            "--dropout",
            "0.1",
            "--output-dir",
            dir.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let run = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, _, stderr) = ortbench(&refs, tmp.path());
        assert!(ok, "{stderr}");
        stderr
    };
    run(base(&a));
    // b: the same run, then everything it wrote after its checkpoint at step 10 removed (as if
    // it had been stopped there), then resumed.
    run(base(&b));
    for f in ["steps.csv", "steps.parquet", "model.safetensors"] {
        std::fs::remove_file(b.join(f)).unwrap();
    }
    let mut resume = base(&b);
    resume.push("--resume".into());
    let stderr = run(resume);
    assert!(stderr.contains("resuming from") && stderr.contains("at step 10 of 20"), "{stderr}");
    let (h, ra) = read_csv(&a.join("steps.csv"));
    let (_, rb) = read_csv(&b.join("steps.csv"));
    let (l, g) = (
        h.iter().position(|c| c == "loss").unwrap(),
        h.iter().position(|c| c == "grad_norm").unwrap(),
    );
    assert_eq!(ra.len(), 20);
    assert_eq!(rb.len(), 20);
    for (x, y) in ra.iter().zip(&rb) {
        assert_eq!(
            (&x[l], &x[g]),
            (&y[l], &y[g]),
            "step {}",
            x[h.iter().position(|c| c == "step").unwrap()]
        );
    }
    assert_eq!(
        std::fs::read(a.join("model.safetensors")).unwrap(),
        std::fs::read(b.join("model.safetensors")).unwrap()
    );
    // --resume without a checkpoint, or with other steps: one-line errors.
    let e = run_err(
        &tmp,
        &[
            "train",
            "--model",
            fixture("tiny-bert-sentiment").to_str().unwrap(),
            "--data",
            "x",
            "--output-dir",
            tmp.path().join("none").to_str().unwrap(),
            "--resume",
        ],
    );
    assert!(e.contains("has no checkpoint-N/"), "{e}");
}

fn run_err(tmp: &tempfile::TempDir, args: &[&str]) -> String {
    let (ok, _, stderr) = ortbench(args, tmp.path());
    assert!(!ok);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    stderr
}

/// `--overwrite` on a folder holding an earlier run's checkpoints removes them: a later
/// `--resume` then continues this run, not the earlier one's state.
#[test]
fn overwrite_removes_the_earlier_runs_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let old = out.join("checkpoint-500");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(old.join("trainer_state.json"), "{}").unwrap();
    std::fs::write(out.join("notes.txt"), "kept").unwrap();
    let (model, data) = (fixture("tiny-bert-sentiment"), fixture("text/train.csv"));
    let args = [
        "train",
        "--model",
        model.to_str().unwrap(),
        "--dataset",
        data.to_str().unwrap(),
        "--max-steps",
        "2",
        "--batch-size",
        "4",
        "--output-dir",
        out.to_str().unwrap(),
    ];
    // Without --overwrite: refused, nothing touched.
    let (ok, _, stderr) = ortbench(&args, tmp.path());
    assert!(!ok && stderr.contains("is not empty"), "{stderr}");
    assert!(old.is_dir());
    let (ok, _, stderr) = ortbench(&[&args[..], &["--overwrite"]].concat(), tmp.path());
    assert!(ok, "{stderr}");
    assert!(!old.exists(), "checkpoint-500 survived --overwrite:\n{stderr}");
    assert!(stderr.contains("removed 1 checkpoint folder"), "{stderr}");
    assert!(out.join("notes.txt").is_file());
}

/// The train loop on a GPU device without a GPU: `ortbench::train::run_on` with the host SIMT
/// harness as the engine's device (`--device cuda` opens the NVIDIA GPU instead; the loop, logs,
/// evaluation, checkpoints and `--resume` are the same code). A tiny BERT classifier trains 12
/// steps with dropout, checkpointing at step 6; the run is repeated, cut after its checkpoint
/// and resumed: every step's loss and gradient norm and the final weights are the same bits.
/// Its losses also follow the CPU engine's within the device's tolerance.
#[test]
fn train_on_a_gpu_device_saves_and_resumes_bit_for_bit() {
    use clap::Parser;
    use ortbench::cli::{Cli, Command};
    use ortbench_engine::backend::simt_device::{Order, SimtGpu};
    let tmp = tempfile::tempdir().unwrap();
    let args = |dir: &Path, device: &str, resume: bool| {
        let mut v: Vec<String> = [
            "ortbench",
            "train",
            "--model",
            fixture("tiny-bert-sentiment").to_str().unwrap(),
            "--dataset",
            fixture("text/train.csv").to_str().unwrap(),
            "--eval-split",
            "0.25",
            "--max-steps",
            "12",
            "--batch-size",
            "4",
            "--seq-len",
            "24",
            "--lr",
            "1e-3",
            "--save-steps",
            "6",
            "--dropout",
            "0.1",
            "--device",
            device,
            "--output-dir",
            dir.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if resume {
            v.push("--resume".into());
        }
        match Cli::try_parse_from(v).unwrap().command {
            Command::Train(a) => a,
            _ => unreachable!(),
        }
    };
    let simt = || Some(SimtGpu::new(32, Order::Forward).with_max_shared_bytes(48 * 1024));
    let (a, b, c) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("cpu"));
    assert_eq!(ortbench::train::run_on(&args(&a, "cuda", false), simt()).unwrap(), 0);
    assert_eq!(ortbench::train::run_on(&args(&b, "cuda", false), simt()).unwrap(), 0);
    assert!(b.join("checkpoint-6/trainer_state.json").is_file());
    for f in ["steps.csv", "steps.parquet", "model.safetensors"] {
        std::fs::remove_file(b.join(f)).unwrap();
    }
    assert_eq!(ortbench::train::run_on(&args(&b, "cuda", true), simt()).unwrap(), 0);
    let (h, ra) = read_csv(&a.join("steps.csv"));
    let (_, rb) = read_csv(&b.join("steps.csv"));
    let col = |n: &str| h.iter().position(|c| c == n).unwrap();
    let (l, g) = (col("loss"), col("grad_norm"));
    assert_eq!((ra.len(), rb.len()), (12, 12));
    for (x, y) in ra.iter().zip(&rb) {
        assert_eq!((&x[l], &x[g]), (&y[l], &y[g]), "step {}", x[col("step")]);
    }
    assert_eq!(
        std::fs::read(a.join("model.safetensors")).unwrap(),
        std::fs::read(b.join("model.safetensors")).unwrap()
    );
    // The same run on the CPU engine: the same data and dropout masks, so the same curve to
    // the device's rounding (the GPU kernels sum in other orders).
    assert_eq!(ortbench::train::run_on::<SimtGpu>(&args(&c, "cpu", false), None).unwrap(), 0);
    let (_, rc) = read_csv(&c.join("steps.csv"));
    for (x, y) in ra.iter().zip(&rc) {
        let (p, q): (f64, f64) = (x[l].parse().unwrap(), y[l].parse().unwrap());
        assert!(
            (p - q).abs() <= 1e-4 * q.abs(),
            "step {}: loss {p} on the device, {q} on the CPU",
            x[col("step")]
        );
    }
}

/// `--device cuda` where there is no GPU: one line naming why, exit non-zero.
#[test]
fn train_on_cuda_without_a_gpu_is_one_line() {
    if ortbench_engine::backend::cuda::gpu::CudaGpu::open(0).is_ok() {
        eprintln!("a GPU is here: nothing to refuse");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let e = run_err(
        &tmp,
        &[
            "train",
            "--model",
            fixture("tiny-bert-sentiment").to_str().unwrap(),
            "--dataset",
            fixture("text/train.csv").to_str().unwrap(),
            "--device",
            "cuda",
            "--output-dir",
            tmp.path().join("o").to_str().unwrap(),
        ],
    );
    assert!(e.contains("train --device cuda: "), "{e}");
}

/// A bad `ORTBENCH_CPU_BF16_GEMM` stops `train` too (the engine's build-time check), not only
/// `run`: an error naming it, exit non-zero.
#[test]
fn train_refuses_a_bad_bf16_gemm_switch() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, data, out) =
        (fixture("tiny-bert-sentiment"), fixture("text/train.csv"), tmp.path().join("o"));
    let args = [
        "train",
        "--model",
        model.to_str().unwrap(),
        "--dataset",
        data.to_str().unwrap(),
        "--precision",
        "bf16",
        "--output-dir",
        out.to_str().unwrap(),
    ];
    let (ok, _, stderr) = ortbench_env(&args, tmp.path(), &[("ORTBENCH_CPU_BF16_GEMM", "fast")]);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("ORTBENCH_CPU_BF16_GEMM must be 0 or 1, got \"fast\""), "{stderr}");
}
