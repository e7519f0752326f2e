//! The `torch-compile` config (HF Transformers + torch.compile, run by scripts/torch-compile.py
//! --worker under the venv's python) through `ortbench run`:
//!
//! - run eagerly (`ORTBENCH_TORCH_COMPILE=eager`), the worker reproduces HF's own losses for
//!   the fixtures (expected.json, made by HF's training loop in scripts/make-fixtures.py): the
//!   weights and batches the harness hands it are the run's, and its loop is HF Trainer's;
//!   compiled (inductor), within 1e-4 of them;
//! - a tiny-gpt2 run of pytorch, torch-compile and ort has the torch-compile row, its compile
//!   time, the engine's second speedup (over torch-compile) and parity ok for all three;
//! - bad input is refused in one line: a data tensor no config uses, no C++ compiler for
//!   inductor, ranks > 1; an unknown config names torch-compile among the known ones;
//! - the worker's own error record (fp16 on the CPU) is the row's error, and the run's scratch
//!   directory is gone after it.
//!
//! Needs the venv's torch + transformers (`ORTBENCH_PYTHON`, which scripts/test sets; else the
//! active venv or the checkout's .venv) and g++. The compiled runs are the slow part: inductor
//! compiles C++ for every run (tens of seconds each for tiny-gpt2 on 2 cores).

mod common;

use std::path::{Path, PathBuf};

use common::{cell, col, ortbench, read_csv, stderr};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures").join(name)
}

fn expected(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("expected.json")).unwrap())
        .unwrap()
}

/// `ortbench run --configs torch-compile` on a fixture with its expected.json's settings;
/// returns the per-step losses of steps.csv.
fn fixture_losses(name: &str, eager: bool, out: &Path) -> Vec<f64> {
    fixture_losses_of(name, &fixture(name), eager, out)
}

/// [`fixture_losses`] with the model read from `model_dir` (a changed copy of the fixture's).
fn fixture_losses_of(name: &str, model_dir: &Path, eager: bool, out: &Path) -> Vec<f64> {
    let exp = expected(name);
    let num = |k: &str| exp[k].as_f64().unwrap().to_string();
    let (model, data) =
        (model_dir.to_string_lossy().into_owned(), fixture(name).join("batches.safetensors"));
    let args = [
        "run",
        "--models",
        &model,
        "--data",
        data.to_str().unwrap(),
        "--configs",
        "torch-compile",
        "--batch-size",
        &num("batch_size"),
        "--steps",
        &num("steps"),
        "--warmup",
        "1",
        "--lr",
        &num("lr"),
        "--weight-decay",
        &num("weight_decay"),
        "--max-grad-norm",
        &num("max_grad_norm"),
        "--dropout",
        "0",
        "--repeat",
        "1",
        "--parity-steps",
        "0",
        "--out",
        out.to_str().unwrap(),
    ];
    let mode = if eager { "eager" } else { "compile" };
    let t = std::time::Instant::now();
    let o = ortbench(&args, &[("ORTBENCH_TORCH_COMPILE", mode)], false);
    assert!(o.status.success(), "{name}: {}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    println!(
        "{name} ({mode}): {:.1} s in all, compile_s {} (first step), median step {} ms",
        t.elapsed().as_secs_f64(),
        cell(&h, &rows, "torch-compile", "compile_s"),
        cell(&h, &rows, "torch-compile", "step_ms_median")
    );
    let (h, rows) = read_csv(&out.join("steps.csv"));
    let (c, l) = (col(&h, "config"), col(&h, "loss"));
    rows.iter().filter(|r| r[c] == "torch-compile").map(|r| r[l].parse().unwrap()).collect()
}

fn hf_losses(name: &str) -> Vec<f64> {
    expected(name)["losses"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
}

fn worst_rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    a.iter().zip(b).map(|(x, y)| ((x - y) / y).abs()).fold(0.0, f64::max)
}

#[test]
fn the_eager_worker_trains_hf_fixture_losses() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["tiny-gpt2-padded", "tiny-bert-padded"] {
        let got = fixture_losses(name, true, &dir.path().join(name));
        let rel = worst_rel(&got, &hf_losses(name));
        println!("{name}: torch-compile worker (eager) vs HF's losses, worst rel {rel:.1e}");
        assert!(rel <= 1e-5, "{name}: {got:?} vs HF {:?}", hf_losses(name));
    }
}

/// A config.json whose `dtype` is bfloat16 (SmolLM2's, Qwen's), which transformers 5 loads
/// in by default: the worker still trains fp32 weights, HF's fp32 losses to 1e-5 (bf16 weights
/// gave 2e-4 on smollm2-135m's first step).
#[test]
fn the_worker_trains_fp32_weights_when_the_config_says_bfloat16() {
    let dir = tempfile::tempdir().unwrap();
    let name = "tiny-llama-padded";
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for f in ["model.safetensors", "config.json"] {
        std::fs::copy(fixture(name).join(f), model.join(f)).unwrap();
    }
    let path = model.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["dtype"] = serde_json::json!("bfloat16");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let got = fixture_losses_of(name, &model, true, &dir.path().join("out"));
    let rel = worst_rel(&got, &hf_losses(name));
    println!("{name} with dtype bfloat16 in config.json: worker (eager) vs HF's fp32 losses, worst rel {rel:.1e}");
    assert!(rel <= 1e-5, "{got:?} vs HF {:?}", hf_losses(name));
}

#[test]
fn the_compiled_worker_trains_hf_fixture_losses_within_1e_4() {
    let dir = tempfile::tempdir().unwrap();
    // Unpadded: HF's sdpa mask is then the same every step (no recompiles).
    let got = fixture_losses("tiny-gpt2", false, dir.path());
    let rel = worst_rel(&got, &hf_losses("tiny-gpt2"));
    println!(
        "tiny-gpt2: torch-compile worker (inductor) vs HF's eager losses, worst rel {rel:.1e}"
    );
    assert!(rel <= 1e-4, "{got:?} vs HF {:?}", hf_losses("tiny-gpt2"));
}

#[test]
fn tiny_gpt2_compares_pytorch_torch_compile_and_ort() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let t = std::time::Instant::now();
    let o = ortbench(
        &[
            "run",
            "--models",
            "tiny-gpt2",
            "--configs",
            "pytorch,torch-compile,ort",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--batch-size",
            "2",
            "--seq-len",
            "16",
            // One timed run: each run of torch-compile compiles afresh (tens of seconds here).
            "--repeat",
            "1",
            "--parity-steps",
            "3",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
        false,
    );
    println!("pytorch,torch-compile,ort on tiny-gpt2: {:.1} s", t.elapsed().as_secs_f64());
    assert!(o.status.success(), "{}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(h, ortbench::output::RESULT_COLUMNS, "results.csv columns");
    let configs: Vec<&str> = rows.iter().map(|r| r[col(&h, "config")].as_str()).collect();
    assert_eq!(configs, ["pytorch", "torch-compile", "ort"]);
    for c in ["pytorch", "torch-compile", "ort"] {
        assert_eq!(cell(&h, &rows, c, "status"), "ok", "{c}: {}", cell(&h, &rows, c, "error"));
        assert_eq!(cell(&h, &rows, c, "repeats"), "1");
        let d: f64 = cell(&h, &rows, c, "max_loss_rel_diff").parse().unwrap();
        assert!(d <= 1e-3, "{c}: parity {d}");
    }
    // The compile column: torch-compile's alone, in seconds; its first step is warm-up.
    let compile: f64 = cell(&h, &rows, "torch-compile", "compile_s").parse().unwrap();
    assert!(compile > 0.0, "{compile}");
    assert_eq!(cell(&h, &rows, "pytorch", "compile_s"), "");
    assert_eq!(cell(&h, &rows, "ort", "compile_s"), "");
    let step: f64 = cell(&h, &rows, "torch-compile", "step_ms_max").parse().unwrap();
    assert!(step < 1e3 * compile, "the compile step is not a timed step: max {step} ms");
    // Both speedups: over pytorch for every config, over torch-compile for the engine's.
    for c in ["torch-compile", "ort"] {
        assert!(cell(&h, &rows, c, "speedup").parse::<f64>().unwrap() > 0.0);
    }
    let x: f64 = cell(&h, &rows, "ort", "speedup_vs_torch_compile").parse().unwrap();
    assert!(x > 0.0, "{x}");
    // One run a side: the ratio without an interval (metrics::MIN_INTERVAL_RUNS).
    for col in ["speedup_vs_torch_compile_lo", "speedup_vs_torch_compile_hi"] {
        assert_eq!(cell(&h, &rows, "ort", col), "", "{col} from 1 run");
    }
    assert_eq!(cell(&h, &rows, "pytorch", "speedup_vs_torch_compile"), "");
    // The same steps, weights and data: the timed runs' losses are the parity probe's
    // business, but the parity rows must exist for every config.
    let (sh, steps) = read_csv(&out.join("steps.csv"));
    let (c, p) = (col(&sh, "config"), col(&sh, "phase"));
    let probe = |cfg: &str| steps.iter().filter(|r| r[c] == cfg && r[p] == "parity").count();
    assert_eq!((probe("pytorch"), probe("torch-compile"), probe("ort")), (3, 3, 3));
    // run.json says what torch-compile ran on.
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    let tc = &meta["torch_compile"];
    assert!(tc["versions"]["transformers"].as_str().is_some_and(|v| v.starts_with("5.")), "{tc}");
    assert!(tc["compile_cache"].as_str().unwrap().contains("never shared"), "{tc}");
    // The table and the report show both.
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("compile s") && table.contains("vs torch-compile"), "{table}");
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("chart-speedup-torch-compile"), "no second speedup chart");
}

#[test]
fn a_data_file_with_an_unused_tensor_is_refused_for_torch_compile() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.safetensors");
    let zeros = vec![0u8; 2 * 8 * 8];
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![2, 8], &zeros).unwrap();
    let views = vec![("input_ids", view.clone()), ("token_type_ids", view)];
    safetensors::serialize_to_file(views, None, &data).unwrap();
    let out = dir.path().join("o");
    let o = ortbench(
        &[
            "run",
            "--models",
            "tiny-gpt2",
            "--data",
            data.to_str().unwrap(),
            "--configs",
            "torch-compile",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
        false,
    );
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("token_type_ids") && err.trim().lines().count() == 1, "{err}");
    assert!(!out.exists(), "nothing written");
}

#[test]
fn torch_compile_is_refused_in_one_line_without_a_cxx_compiler() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let o = ortbench(
        &[
            "run",
            "--models",
            "tiny-gpt2",
            "--configs",
            "pytorch,torch-compile",
            "--out",
            out.to_str().unwrap(),
        ],
        &[("CXX", "/nonexistent/g++")],
        false,
    );
    let err = stderr(&o);
    assert!(!o.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("torch-compile")
            && err.contains("C++ compiler")
            && err.contains("/nonexistent/g++"),
        "{err}"
    );
    assert!(!out.exists());
}

#[test]
fn torch_compile_runs_one_rank() {
    let o = ortbench(
        &["run", "--models", "tiny-gpt2", "--configs", "torch-compile", "--ranks", "2"],
        &[],
        false,
    );
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("runs one rank") && err.trim().lines().count() == 1, "{err}");
}

#[test]
fn the_config_is_listed_and_named_among_the_known_ones() {
    let o = ortbench(&["list"], &[], false);
    assert!(o.status.success());
    let list = String::from_utf8_lossy(&o.stdout);
    assert!(list.lines().any(|l| l.trim_start().starts_with("torch-compile ")), "{list}");
    let o = ortbench(&["run", "--models", "tiny-gpt2", "--configs", "torch-compiled"], &[], false);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("unknown config 'torch-compiled'")
            && err.contains("pytorch, torch-compile, ort, ort-zero1"),
        "{err}"
    );
}

#[test]
fn a_worker_error_is_the_runs_error_and_its_scratch_dir_goes() {
    // fp16 autocast needs CUDA (GradScaler), as for the pytorch config: the python worker's
    // error record becomes the row's error, and the run's scratch directory (weights, batches,
    // compile caches) is removed.
    let dir = tempfile::tempdir().unwrap();
    let (out, tmp) = (dir.path().join("o"), dir.path().join("tmp"));
    std::fs::create_dir(&tmp).unwrap();
    let o = ortbench(
        &[
            &["run", "--models", "tiny-gpt2", "--configs", "torch-compile", "--precision", "fp16"],
            common::QUICK,
            &["--out", out.to_str().unwrap()],
        ]
        .concat(),
        &[("TMPDIR", tmp.to_str().unwrap())],
        false,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(cell(&h, &rows, "torch-compile", "status"), "error");
    let err = cell(&h, &rows, "torch-compile", "error");
    assert!(err.starts_with("torch-compile: fp16 autocast needs a CUDA device"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}
