//! `scripts/torch-compile.py`, the torch.compile baseline the GPU tuning issue compares the
//! engine with, checked on the CPU: run eagerly (`--no-compile`) it reproduces HF's losses for
//! the fixtures (`expected.json`, made by HF's own training loop in scripts/make-fixtures.py),
//! so its loop, data order (step s takes rows (s·B + i) mod N, as ortbench) and optimizer are
//! HF Trainer's; compiled (inductor) it trains the same losses within 1e-4; a data file with
//! a tensor it would not use is refused. Its worker mode (`--worker`: the `torch-compile` config
//! of `ortbench run`) is tested through the binary in bench/tests/torch_compile.rs.
//!
//! Needs the venv's torch + transformers (`ORTBENCH_PYTHON`, which scripts/test sets; else the
//! checkout's .venv). The compiled run is the slow one: inductor compiles C++ (time:
//! docs/measurements.md).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn python() -> String {
    std::env::var("ORTBENCH_PYTHON")
        .unwrap_or_else(|_| root().join(".venv/bin/python").to_string_lossy().into_owned())
}

/// Runs the script on a fixture with its expected.json's settings; returns the per-step losses.
fn losses(fixture: &str, compile: bool, out: &Path) -> Vec<f64> {
    let dir = root().join("tests/fixtures").join(fixture);
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let num = |k: &str| exp[k].as_f64().unwrap().to_string();
    let (data, model) = (dir.join("batches.safetensors"), dir.to_string_lossy().into_owned());
    let mut args = vec![
        root().join("scripts/torch-compile.py").to_string_lossy().into_owned(),
        "--model".into(),
        model,
        "--data".into(),
        data.to_string_lossy().into_owned(),
        "--out".into(),
        out.to_string_lossy().into_owned(),
        "--batch-size".into(),
        num("batch_size"),
        "--steps".into(),
        num("steps"),
        "--warmup".into(),
        "1".into(),
        "--lr".into(),
        num("lr"),
        "--weight-decay".into(),
        num("weight_decay"),
        "--max-grad-norm".into(),
        num("max_grad_norm"),
        "--precision".into(),
        "fp32".into(),
        "--device".into(),
        "cpu".into(),
        "--dropout".into(),
        "0".into(),
    ];
    if !compile {
        args.push("--no-compile".into());
    }
    let o = Command::new(python()).args(&args).output().unwrap();
    assert!(o.status.success(), "{fixture}: {}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().last().unwrap()).unwrap();
    println!(
        "{fixture} ({}): {:.1} ms median step, compile/first step {:.1} s",
        summary["config"],
        summary["step_ms_median"].as_f64().unwrap(),
        summary["compile_s"].as_f64().unwrap()
    );
    // Plain CSV (no quoted fields: the model column is a path without commas).
    let text = std::fs::read_to_string(out.join("steps.csv")).unwrap();
    let mut lines = text.lines();
    let i = lines.next().unwrap().split(',').position(|c| c == "loss").unwrap();
    lines.map(|l| l.split(',').nth(i).unwrap().parse().unwrap()).collect()
}

fn expected(fixture: &str) -> Vec<f64> {
    let exp: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures").join(fixture).join("expected.json"))
            .unwrap(),
    )
    .unwrap();
    exp["losses"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
}

fn worst(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| ((x - y) / y).abs()).fold(0.0, f64::max)
}

#[test]
fn eager_is_hf_and_compiled_trains_the_same_losses() {
    let dir = tempfile::tempdir().unwrap();
    for fixture in ["tiny-gpt2-padded", "tiny-bert-padded"] {
        let got = losses(fixture, false, &dir.path().join(format!("{fixture}-eager")));
        let rel = worst(&got, &expected(fixture));
        println!("{fixture}: eager vs HF's losses, worst rel {rel:.1e}");
        assert!(rel <= 1e-5, "{fixture}: {got:?} vs {:?}", expected(fixture));
    }
    // Unpadded: HF's sdpa mask is then the same every step (no recompiles).
    let compiled = losses("tiny-gpt2", true, &dir.path().join("compiled"));
    let rel = worst(&compiled, &expected("tiny-gpt2"));
    println!("tiny-gpt2: torch.compile vs HF's eager losses, worst rel {rel:.1e}");
    assert!(rel <= 1e-4, "{compiled:?} vs {:?}", expected("tiny-gpt2"));
}

#[test]
fn a_data_file_with_an_unused_tensor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.safetensors");
    let code = format!(
        "import torch; from safetensors.torch import save_file; save_file({{'input_ids': torch.zeros(2, 8, dtype=torch.int64), 'token_type_ids': torch.zeros(2, 8, dtype=torch.int64)}}, '{}')",
        data.display()
    );
    assert!(Command::new(python()).args(["-c", &code]).status().unwrap().success());
    let o = Command::new(python())
        .args([
            root().join("scripts/torch-compile.py").to_str().unwrap(),
            "--model",
            root().join("tests/fixtures/tiny-gpt2").to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--out",
            dir.path().join("o").to_str().unwrap(),
            "--device",
            "cpu",
            "--precision",
            "fp32",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("unused tensors ['token_type_ids']") && err.lines().count() == 1, "{err}");
    assert!(!dir.path().join("o").exists(), "nothing written");
}
