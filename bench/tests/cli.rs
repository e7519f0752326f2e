//! `ortbench run` end to end through the real binary: outputs, and bad input.

mod common;

use std::path::Path;
use std::process::Output;

use common::{col, read_csv};

/// ortbench with `args`, the CPU peak given, not measured, to keep these tests quick (e2e.rs
/// measures it).
fn ortbench(args: &[&str]) -> Output {
    common::ortbench(args, &[], false)
}

#[test]
fn run_writes_steps_and_results() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = ortbench(&[
        "run",
        "--models",
        "tiny-bert,tiny-gpt2",
        "--configs",
        "pytorch",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--repeat",
        "1",
        "--parity-steps",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (h, rows) = read_csv(&out.join("steps.csv"));
    for c in ["model", "config", "rank", "step", "loss", "step_ms"] {
        col(&h, c);
    }
    assert_eq!(rows.len(), 2 * 4);
    let steps: Vec<&str> = rows.iter().take(4).map(|r| r[col(&h, "step")].as_str()).collect();
    assert_eq!(steps, ["0", "1", "2", "3"]);
    let (h, rows) = read_csv(&out.join("results.csv"));
    for c in [
        "model",
        "config",
        "precision",
        "device",
        "batch_size",
        "seq_len",
        "status",
        "samples_per_s",
        "tokens_per_s",
        "step_ms_median",
        "peak_mem_bytes",
        "param_count",
        "final_loss",
    ] {
        col(&h, c);
    }
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(r[col(&h, "status")], "ok");
        let sps: f64 = r[col(&h, "samples_per_s")].parse().unwrap();
        let tps: f64 = r[col(&h, "tokens_per_s")].parse().unwrap();
        assert!(sps > 0.0 && (tps - 16.0 * sps).abs() < 1e-6 * tps);
        assert!(r[col(&h, "peak_mem_bytes")].parse::<u64>().unwrap() > 1 << 20);
        let loss: f64 = r[col(&h, "final_loss")].parse().unwrap();
        assert!(loss.is_finite() && loss > 0.0);
    }
    assert_eq!(rows[0][col(&h, "param_count")], "173608"); // tiny-bert, as HF counts it
    assert!(out.join("run.json").is_file());
}

#[test]
fn a_failing_run_is_recorded_and_the_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // fp16 needs CUDA for the pytorch config: that run fails in its worker, fp32 completes.
    let o = ortbench(&[
        "run",
        "--models",
        "tiny-gpt2",
        "--configs",
        "pytorch",
        "--precision",
        "fp16,fp32",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--batch-size",
        "1",
        "--seq-len",
        "8",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0][col(&h, "status")], "error");
    assert!(rows[0][col(&h, "error")].contains("needs --device cuda"));
    assert_eq!(rows[1][col(&h, "status")], "ok");
}

/// Bad input: non-zero exit, one clear line on stderr, and no output directory.
fn rejects(args: &[&str], expect: &str) {
    rejects_with_env(args, &[], expect)
}

/// [`rejects`] with environment variables set.
fn rejects_with_env(args: &[&str], envs: &[(&str, &str)], expect: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut full: Vec<&str> = args.to_vec();
    let out_s = out.to_str().unwrap().to_string();
    full.extend(["--out", &out_s]);
    let o = common::ortbench(&full, envs, false);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert!(err.contains(expect), "{args:?}: stderr {err:?} lacks {expect:?}");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(!out.exists(), "{args:?}: wrote {out:?}");
}

#[test]
fn bad_input_is_a_one_line_error_with_nothing_written() {
    let tiny = ["run", "--models", "tiny-gpt2", "--steps", "2", "--warmup", "1"];
    rejects(&["run", "--models", "bret"], "unknown model 'bret'");
    rejects(
        &["run", "--models", "tiny-bert", "--configs", "tensorflow"],
        "unknown config 'tensorflow'",
    );
    rejects(&["run", "--models", "tiny-bert", "--precision", "fp8"], "unknown precision 'fp8'");
    rejects(&[&tiny[..], &["--seq-len", "65"]].concat(), "beyond the model's 64 positions");
    rejects(
        &[&tiny[..], &["--batch-size", "0"]].concat(),
        "--batch-size must be a positive integer",
    );
    rejects(&[&tiny[..], &["--batch-size=-3"]].concat(), "--batch-size must be a positive integer");
    rejects(
        &["run", "--models", "tiny-gpt2", "--steps", "0"],
        "--steps must be a positive integer",
    );
    rejects(&[&tiny[..], &["--ranks", "0"]].concat(), "--ranks must be a positive integer");
    rejects(
        &["run", "--models", "tiny-gpt2", "--steps", "3", "--warmup", "3"],
        "must be less than --steps",
    );
    rejects(&[&tiny[..], &["--seq-len=-1"]].concat(), "--seq-len must be a positive integer");
    rejects(&[&tiny[..], &["--device", "tpu"]].concat(), "unknown device 'tpu'");
    rejects(&[&tiny[..], &["--device", "rocm:x"]].concat(), "unknown device 'rocm:x'");
    // No AMD GPU anywhere this runs: whether the HIP runtime is installed or not, a clear refusal.
    rejects(&[&tiny[..], &["--device", "rocm"]].concat(), "--device rocm: ");
    let err =
        String::from_utf8_lossy(&ortbench(&[&tiny[..], &["--device", "rocm:1"]].concat()).stderr)
            .into_owned();
    assert!(err.contains("AMD GPU(s)") || err.contains("libamdhip64 not found"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    // An unsupported architecture.
    let falcon = dir.path().join("falcon");
    std::fs::create_dir(&falcon).unwrap();
    std::fs::write(
        falcon.join("config.json"),
        r#"{"architectures": ["FalconForCausalLM"], "model_type": "falcon"}"#,
    )
    .unwrap();
    rejects(
        &["run", "--models", falcon.to_str().unwrap()],
        "unsupported architecture 'FalconForCausalLM'",
    );
    // An unreadable weights file.
    let bad = dir.path().join("bad.safetensors");
    std::fs::write(&bad, b"garbage").unwrap();
    rejects(
        &[&tiny[..], &["--weights", bad.to_str().unwrap()]].concat(),
        "not a valid safetensors file",
    );
    // --data with the wrong dtype, and the wrong shape.
    let f32_data = dir.path().join("f32.safetensors");
    let bytes = vec![0u8; 4 * 2 * 8];
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 8], &bytes).unwrap();
    safetensors::serialize_to_file(vec![("input_ids".to_string(), view)], None, &f32_data).unwrap();
    rejects(
        &[&tiny[..], &["--data", f32_data.to_str().unwrap()]].concat(),
        "'input_ids' must be int64",
    );
    let flat = dir.path().join("flat.safetensors");
    let bytes = vec![0u8; 8 * 16];
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![16], &bytes).unwrap();
    safetensors::serialize_to_file(vec![("input_ids".to_string(), view)], None, &flat).unwrap();
    rejects(&[&tiny[..], &["--data", flat.to_str().unwrap()]].concat(), "must have shape [N, T]");
    rejects(&[&tiny[..], &["--data", "/nonexistent.safetensors"]].concat(), "no such file");
    // A tensor the run would not use (segment ids) is refused, not ignored.
    let extra = dir.path().join("extra.safetensors");
    let ids = vec![0u8; 8 * 2 * 8];
    let v_ids =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![2, 8], &ids).unwrap();
    let v_types =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![2, 8], &ids).unwrap();
    safetensors::serialize_to_file(
        vec![("input_ids".to_string(), v_ids), ("token_type_ids".to_string(), v_types)],
        None,
        &extra,
    )
    .unwrap();
    rejects(
        &[&tiny[..], &["--data", extra.to_str().unwrap(), "--seq-len", "8"]].concat(),
        "tensor 'token_type_ids' would be ignored",
    );
}

#[test]
fn a_non_empty_out_dir_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keep.txt"), "x").unwrap();
    let o = ortbench(&[
        "run",
        "--models",
        "tiny-gpt2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not empty (use --force"));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn all_three_configs_on_two_ranks_agree_and_report_per_rank_memory() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = ortbench(&[
        "run",
        "--models",
        "tiny-bert,tiny-gpt2",
        "--ranks",
        "2",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--dropout",
        "0",
        "--repeat",
        "1",
        "--parity-steps",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (h, rows) = read_csv(&out.join("steps.csv"));
    assert_eq!(rows.len(), 2 * 3 * 3 * 2, "models × configs × steps × ranks");
    let loss = |model: &str, config: &str, step: &str| -> f64 {
        rows.iter()
            .find(|r| {
                r[col(&h, "model")] == model
                    && r[col(&h, "config")] == config
                    && r[col(&h, "step")] == step
                    && r[col(&h, "rank")] == "1"
            })
            .unwrap()[col(&h, "loss")]
        .parse()
        .unwrap()
    };
    for model in ["tiny-bert", "tiny-gpt2"] {
        for step in ["0", "2"] {
            let base = loss(model, "pytorch", step);
            for config in ["ort", "ort-zero1"] {
                let rel = (loss(model, config, step) - base).abs() / base;
                assert!(rel < 1e-4, "{model} {config} step {step}: rel {rel:e}");
            }
        }
    }
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(rows.len(), 6);
    for r in &rows {
        assert_eq!(r[col(&h, "ranks")], "2");
        assert_eq!(r[col(&h, "status")], "ok");
        let params: f64 = r[col(&h, "param_count")].parse().unwrap();
        let opt: f64 = r[col(&h, "optimizer_bytes_per_rank")].parse().unwrap();
        // Adam moments (8 bytes per parameter); ZeRO-1 holds its shard's only (the parameter shard is the fp32 master).
        let want =
            if r[col(&h, "config")] == "ort-zero1" { 8.0 * params / 2.0 } else { 8.0 * params };
        assert!(opt >= want && opt < want + 1024.0, "{:?}: {opt} vs {want}", r);
    }
}

/// A padded `--data` file (HF's attention_mask; tests/fixtures/tiny-gpt2-padded, left and right
/// padding) through the harness: all three configs on 2 rank processes agree step by step.
#[test]
fn a_padded_data_file_trains_every_config_alike() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-gpt2-padded");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let data = fixture.join("batches.safetensors");
    let o = ortbench(&[
        "run",
        "--models",
        fixture.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--ranks",
        "2",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--batch-size",
        "2",
        "--dropout",
        "0",
        "--repeat",
        "1",
        "--parity-steps",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (h, rows) = read_csv(&out.join("steps.csv"));
    let loss = |config: &str, step: &str| -> f64 {
        rows.iter()
            .find(|r| {
                r[col(&h, "config")] == config
                    && r[col(&h, "step")] == step
                    && r[col(&h, "rank")] == "0"
            })
            .unwrap()[col(&h, "loss")]
        .parse()
        .unwrap()
    };
    for step in ["0", "2"] {
        let base = loss("pytorch", step);
        for config in ["ort", "ort-zero1"] {
            let rel = (loss(config, step) - base).abs() / base;
            assert!(rel < 1e-5, "{config} step {step}: rel {rel:e}");
        }
    }
}

/// `--task` puts another head on a checkpoint (HF's AutoModelFor…): the MLM fixture trains as a
/// classifier, the loader says which weights are new and which of the file go unused, and
/// results record the task; a task the family has no head for is a one-line error.
#[test]
fn task_switches_the_head_and_is_recorded() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-bert");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = ortbench(&[
        "run",
        "--models",
        fixture.to_str().unwrap(),
        "--task",
        "sequence-classification",
        "--configs",
        "pytorch,ort",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--repeat",
        "1",
        "--parity-steps",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("4 weights are not in") && stderr.contains("bert.pooler.dense.weight"),
        "{stderr}"
    );
    assert!(
        stderr.contains("not used by BertForSequenceClassification")
            && stderr.contains("cls.predictions"),
        "{stderr}"
    );
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(r[col(&h, "task")], "sequence-classification");
        assert_eq!(r[col(&h, "status")], "ok", "{r:?}");
    }
    rejects(
        &["run", "--models", "tiny-bert", "--task", "causal-lm"],
        "--task causal-lm: a BERT model (tiny-bert) trains masked-lm, sequence-classification",
    );
    rejects(
        &["run", "--models", "tiny-bert", "--task", "translation"],
        "unknown --task 'translation'",
    );
}

/// `run --dataset` with a parquet file (read with Polars): the text is tokenised with the
/// model's tokenizer.json, labels go through label2id, and both configs train alike on it.
#[test]
fn a_parquet_text_dataset_runs_through_the_harness() {
    use ortbench::polars::prelude::{Column, DataFrame, ParquetWriter};
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut r = csv::Reader::from_path(src.join("text/train.csv")).unwrap();
    let rows: Vec<(String, String)> = r
        .records()
        .take(64)
        .map(|x| x.unwrap())
        .map(|x| (x[0].to_string(), x[1].to_string()))
        .collect();
    let mut df = DataFrame::new(
        rows.len(),
        vec![
            Column::new("sentence".into(), rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>()),
            Column::new("label".into(), rows.iter().map(|r| r.1.clone()).collect::<Vec<_>>()),
        ],
    )
    .unwrap();
    let pq = dir.path().join("train.parquet");
    ParquetWriter::new(std::fs::File::create(&pq).unwrap()).finish(&mut df).unwrap();
    let out = dir.path().join("run");
    let cache = dir.path().to_str().unwrap();
    let o = common::ortbench(
        &[
            "run",
            "--models",
            src.join("tiny-bert-sentiment").to_str().unwrap(),
            "--dataset",
            pq.to_str().unwrap(),
            "--text-column",
            "sentence",
            "--configs",
            "pytorch,ort",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--batch-size",
            "4",
            "--dropout",
            "0",
            "--repeat",
            "1",
            "--parity-steps",
            "0",
            "--out",
            out.to_str().unwrap(),
        ],
        &[("ORTBENCH_CACHE_DIR", cache)],
        false,
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("tokenised into"), "{stderr}");
    let (h, rows) = read_csv(&out.join("steps.csv"));
    let loss = |config: &str, step: &str| -> f64 {
        rows.iter().find(|r| r[col(&h, "config")] == config && r[col(&h, "step")] == step).unwrap()
            [col(&h, "loss")]
        .parse()
        .unwrap()
    };
    for step in ["0", "2"] {
        let rel = (loss("ort", step) - loss("pytorch", step)).abs() / loss("pytorch", step);
        assert!(rel < 1e-5, "step {step}: {rel:e}");
    }
    let (h, res) = read_csv(&out.join("results.csv"));
    assert!(res
        .iter()
        .all(|r| r[col(&h, "task")] == "sequence-classification" && r[col(&h, "status")] == "ok"));
}

#[test]
fn bad_harness_options_are_rejected_before_anything_is_written() {
    let tiny = ["run", "--models", "tiny-gpt2", "--steps", "2", "--warmup", "1"];
    rejects(&[&tiny[..], &["--timeout-s", "0"]].concat(), "--timeout-s must be a positive number");
    rejects(
        &[&tiny[..], &["--diverge-tol=-1"]].concat(),
        "--diverge-tol must be a finite non-negative number",
    );
    rejects(
        &["run", "--models", "tiny-gpt2", "--steps", "2", "--warmup", "5"],
        "must be less than --steps",
    );
    // Finite but beyond what a Duration holds: an error, not a panic.
    for flag in
        ["--timeout-s", "--hang-deadline-s", "--first-step-deadline-s", "--collective-timeout-s"]
    {
        rejects(&[&tiny[..], &[flag, "1e300"]].concat(), &format!("{flag} 1e300 is too long"));
    }
    // The CPU's bf16 GEMM switch takes 0 or 1, nothing else.
    rejects_with_env(
        &tiny,
        &[("ORTBENCH_CPU_BF16_GEMM", "fast")],
        "ORTBENCH_CPU_BF16_GEMM must be 0 or 1, got \"fast\"",
    );
    // So does the AMX switch.
    rejects_with_env(
        &tiny,
        &[("ORTBENCH_CPU_AMX", "yes")],
        "ORTBENCH_CPU_AMX must be 0 or 1, got \"yes\"",
    );
    // Thread ranks have no collective timeout: the flag is refused, not ignored.
    rejects(
        &[&tiny[..], &["--ranks", "2", "--launch", "threads", "--collective-timeout-s", "5"]]
            .concat(),
        "--collective-timeout-s with --launch threads",
    );
}

#[test]
fn an_output_directory_that_cannot_be_written_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    // Below a regular file: cannot be created (whoever runs the test, root included).
    let under = file.join("out");
    let o = ortbench(&[
        "run",
        "--models",
        "tiny-gpt2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--out",
        under.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("cannot create"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A regular file as --out.
    let o = ortbench(&[
        "run",
        "--models",
        "tiny-gpt2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("exists and is not a directory"));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    // A read-only directory (root may write anyway: then only the other cases apply).
    use std::os::unix::fs::PermissionsExt;
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        let o = ortbench(&[
            "run",
            "--models",
            "tiny-gpt2",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--out",
            ro.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("not writable"), "{err}");
        assert_eq!(err.trim().lines().count(), 1);
        assert_eq!(std::fs::read_dir(&ro).unwrap().count(), 0);
    }
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn report_and_compare_refuse_a_directory_that_is_not_a_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
    for args in [
        vec!["report", dir.path().to_str().unwrap()],
        vec!["compare", dir.path().to_str().unwrap(), dir.path().to_str().unwrap()],
    ] {
        let o = ortbench(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains("not an ortbench run directory"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        // Nothing was written into it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
    let o = ortbench(&["report", "/nonexistent/run"]);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no such directory")
    );
}

/// `--quick` fills in the first look's defaults (pytorch and ort, batch 4 × seq 64, 6 steps of
/// which 1 warm-up, 3 repeats — the fewest that give an interval —, a 3-step parity probe), and a
/// flag given beside it still wins.
#[test]
fn quick_sets_the_first_look_defaults_and_given_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = ortbench(&[
        "run",
        "--models",
        "tiny-gpt2",
        "--quick",
        "--batch-size",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--quick: a first look"));
    let (h, rows) = read_csv(&out.join("results.csv"));
    let configs: Vec<&str> = rows.iter().map(|r| r[col(&h, "config")].as_str()).collect();
    assert_eq!(configs, ["pytorch", "ort"]);
    for r in &rows {
        assert_eq!(
            (
                r[col(&h, "batch_size")].as_str(),
                r[col(&h, "seq_len")].as_str(),
                r[col(&h, "status")].as_str()
            ),
            ("2", "64", "ok")
        );
    }
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(
        (meta["quick"].as_bool(), meta["repeat"].as_i64(), meta["parity"]["steps"].as_u64()),
        (Some(true), Some(3), Some(3))
    );
    // Three runs a side: the speedup has its interval.
    let (h, rows) = read_csv(&out.join("results.csv"));
    let ort = rows.iter().find(|r| r[col(&h, "config")] == "ort").unwrap();
    assert!(ort[col(&h, "speedup_lo")].parse::<f64>().is_ok(), "{ort:?}");
    let (h, steps) = read_csv(&out.join("steps.csv"));
    let timed = steps
        .iter()
        .filter(|r| r[col(&h, "phase")] == "timed" && r[col(&h, "config")] == "ort")
        .count();
    assert_eq!(timed, 3 * 6, "3 repeats of 6 steps");
}

/// ORTBENCH_CPU_BF16_GEMM=0 keeps the f32 GEMM for bf16 matmuls, ORTBENCH_CPU_AMX=0 the AVX-512
/// BF16 kernel: run.json's settings name them and its environment says what multiplied them;
/// unset, no note appears.
#[test]
fn the_bf16_gemm_switch_is_recorded_in_run_json() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, envs: &[(&str, &str)]| {
        let out = dir.path().join(name);
        let args = [
            "run",
            "--models",
            "tiny-gpt2",
            "--configs",
            "ort",
            "--precision",
            "bf16",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--repeat",
            "1",
            "--parity-steps",
            "0",
            "--out",
        ];
        let o = common::ortbench(&[&args[..], &[out.to_str().unwrap()]].concat(), envs, false);
        assert!(o.status.success(), "{}", common::stderr(&o));
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
        json
    };
    let off = run("off", &[("ORTBENCH_CPU_BF16_GEMM", "0")]);
    assert!(off["settings"].as_str().unwrap().contains(", ORTBENCH_CPU_BF16_GEMM=0"), "{off:#}");
    let what = off["environment"]["cpu_bf16_gemm"].as_str().unwrap();
    assert!(what.starts_with("f32 GEMM on bf16 values"), "{what}");
    let default = run("default", &[]);
    let settings = default["settings"].as_str().unwrap();
    assert!(!settings.contains("BF16_GEMM") && !settings.contains("CPU_AMX"), "{default:#}");
    let what = default["environment"]["cpu_bf16_gemm"].as_str().unwrap();
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let (bf16, amx) = (flags.contains("avx512_bf16"), flags.contains("amx_bf16"));
    let want = if bf16 && amx { "AMX kernel" } else { "AVX-512 BF16 kernel" };
    assert_eq!(what.starts_with(want), bf16, "{what}");
    // ORTBENCH_CPU_AMX=0 keeps the AVX-512 BF16 kernel where the CPU has AMX too.
    let no_amx = run("no-amx", &[("ORTBENCH_CPU_AMX", "0")]);
    assert!(no_amx["settings"].as_str().unwrap().contains(", ORTBENCH_CPU_AMX=0"), "{no_amx:#}");
    let what = no_amx["environment"]["cpu_bf16_gemm"].as_str().unwrap();
    assert_eq!(what.starts_with("AVX-512 BF16 kernel"), bf16, "{what}");
}
