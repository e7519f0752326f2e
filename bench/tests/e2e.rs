//! The whole flow through the real binary: tiny-bert and tiny-gpt2 under all three configs,
//! on one and on two ranks; every output file's content; `load_run`, `report`, `compare`,
//! `env`.

mod common;

use std::path::Path;

use common::*;
use ortbench::output::{RESULT_COLUMNS, STEP_COLUMNS};

const CONFIGS: [&str; 3] = ["pytorch", "ort", "ort-zero1"];

/// The repeats and the parity probe the end-to-end runs ask for (QUICK_SHAPE has neither).
const REPEAT: usize = 2;
const PARITY_STEPS: usize = 3;
const PROBE: &[&str] = &["--repeat", "2", "--parity-steps", "3"];

/// Checks a finished run directory of `models` × CONFIGS on `ranks` ranks with `steps` steps,
/// run with PROBE.
fn check_run_dir(out: &Path, models: &[&str], ranks: usize, steps: usize, peak_measured: bool) {
    let runs = models.len() * CONFIGS.len();
    // results.csv: every column, one row per (model, config), positive throughput.
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(h, RESULT_COLUMNS, "results.csv columns");
    assert_eq!(rows.len(), runs, "one row per (model, config)");
    for model in models {
        let mine: Vec<Vec<String>> =
            rows.iter().filter(|r| r[col(&h, "model")] == *model).cloned().collect();
        assert_eq!(mine.len(), CONFIGS.len());
        for config in CONFIGS {
            let v = |c: &str| cell(&h, &mine, config, c).to_string();
            let num = |c: &str| {
                v(c).parse::<f64>().unwrap_or_else(|_| panic!("{model} {config} {c} = {:?}", v(c)))
            };
            assert_eq!(v("status"), "ok", "{model} {config}: {}", v("error"));
            assert_eq!(v("ranks"), ranks.to_string());
            assert_eq!(v("repeats"), REPEAT.to_string());
            assert!(num("samples_per_s") > 0.0);
            assert!(
                (num("tokens_per_s") - 16.0 * num("samples_per_s")).abs()
                    <= 1e-6 * num("tokens_per_s")
            );
            // samples/s at the median step time.
            assert!(
                (num("samples_per_s") - (2 * ranks) as f64 / (num("step_ms_median") / 1e3)).abs()
                    < 1e-6 * num("samples_per_s")
            );
            for c in [
                "step_ms_median",
                "step_ms_p90",
                "step_ms_min",
                "step_ms_max",
                "train_flops_per_sample",
                "hw_flops_per_sample",
                "tflops",
                "mfu",
                "hfu",
                "peak_tflops",
                "gemm_peak_tflops",
            ] {
                assert!(num(c) > 0.0, "{model} {config} {c}");
            }
            // Against the theoretical peak nothing reaches 100 %; the engine executes at most
            // the model's FLOPs (it skips ignored rows and causal blocks, adds nothing).
            assert!(
                num("mfu") <= 1.0 && num("hfu") <= 1.0,
                "{model} {config}: MFU {} HFU {}",
                num("mfu"),
                num("hfu")
            );
            assert!(
                num("hfu") <= num("mfu") * (1.0 + 1e-9),
                "{model} {config}: HFU {} above MFU {}",
                num("hfu"),
                num("mfu")
            );
            assert!(
                num("step_ms_min") <= num("step_ms_median")
                    && num("step_ms_median") <= num("step_ms_p90")
            );
            assert!(num("step_ms_p90") <= num("step_ms_max") && num("step_ms_std") >= 0.0);
            assert!(
                (num("tflops") - num("train_flops_per_sample") * num("samples_per_s") / 1e12).abs()
                    < 1e-9 * num("tflops").max(1e-12) + 1e-15
            );
            assert!(num("peak_mem_bytes") > (1 << 20) as f64);
            assert!(num("wall_s") > 0.0);
            // The parity probe: both curves within the fp32 tolerance.
            let (rel, gn, tol) =
                (num("max_loss_rel_diff"), num("grad_norm_rel_diff_step0"), num("parity_tol"));
            assert_eq!(tol, 1e-3);
            assert!(rel < tol && gn < tol, "{model} {config}: parity loss {rel} grad norm {gn}");
            let speedup = num("speedup");
            // REPEAT = 2 runs a config: too few for an interval (metrics::MIN_INTERVAL_RUNS),
            // so none is written — the ratio alone.
            for c in ["speedup_lo", "speedup_hi", "speedup_significant"] {
                assert_eq!(v(c), "", "{model} {config}: {c} from {REPEAT} runs");
            }
            if config == "pytorch" {
                assert_eq!(speedup, 1.0);
                assert_eq!((rel, gn), (0.0, 0.0));
            } else {
                let want = cell(&h, &mine, "pytorch", "step_ms_median").parse::<f64>().unwrap()
                    / num("step_ms_median");
                assert!(
                    (speedup - want).abs() < 1e-9 * want,
                    "speedup = ratio of median step times"
                );
            }
        }
    }
    // steps.csv: per (model, config), REPEAT timed runs of `steps` steps and a probe of
    // PARITY_STEPS, on every rank.
    let (h, srows) = read_csv(&out.join("steps.csv"));
    assert_eq!(h, STEP_COLUMNS, "steps.csv columns");
    let per_run = (REPEAT * steps + PARITY_STEPS) * ranks;
    assert_eq!(srows.len(), runs * per_run, "models × configs × (repeats × steps + probe) × ranks");
    assert_eq!(
        srows.iter().filter(|r| r[col(&h, "phase")] == "parity").count(),
        runs * PARITY_STEPS * ranks
    );
    assert_eq!(srows.iter().filter(|r| r[col(&h, "repeat")] == "1").count(), runs * steps * ranks);
    for r in &srows {
        assert!(r[col(&h, "loss")].parse::<f64>().unwrap() > 0.0);
        assert!(r[col(&h, "step_ms")].parse::<f64>().unwrap() > 0.0);
    }
    // Parquet and run.json through load_run.
    let run = ortbench::results::load_run(out).expect("load_run");
    assert_eq!(run.results.height(), runs);
    assert_eq!(run.steps.height(), runs * per_run);
    let names: Vec<String> = run.results.get_column_names().iter().map(|s| s.to_string()).collect();
    assert_eq!(names, RESULT_COLUMNS);
    let rows = run.result_rows().unwrap();
    assert!(rows.iter().all(|r| r.status == "ok" && r.samples_per_s.unwrap() > 0.0));
    let env = &run.env;
    assert_eq!(env["seed"], 42);
    assert!(env["command"].as_array().unwrap().iter().any(|a| a == "--models"));
    assert!(env["command_line"].as_str().unwrap().contains("--models"));
    assert_eq!(env["runs"].as_array().unwrap().len(), runs);
    assert_eq!(env["runs_recorded"], runs);
    assert_eq!(env["interrupted"], false);
    assert!(env["finished_at"].is_string());
    for key in [
        "cpu",
        "cpu_count",
        "cpu_ram_mb",
        "system",
        "machine",
        "os",
        "kernel",
        "ortbench_version",
        "torch_version",
        "libtorch_path",
        "rustc_version",
        "cpu_gemm_provider",
        "cpu_bf16_gemm",
    ] {
        assert!(
            !env["environment"][key].is_null(),
            "run.json environment.{key} is null: {:#}",
            env["environment"]
        );
    }
    assert!(env["environment"]["gpu"].is_array());
    assert!(env["peak"]["fp32"].as_f64().unwrap() > 0.0);
    let source = env["peak"]["source"].as_str().unwrap();
    assert!(source.starts_with("theoretical") && source.contains("GHz"), "{source}");
    assert!(
        env["peak"]["inputs"]["fma_lanes_per_cycle"].as_u64().unwrap() >= 8,
        "{:#}",
        env["peak"]
    );
    let gemm = env["peak"]["gemm_source"].as_str().unwrap();
    assert!(gemm.starts_with(if peak_measured { "measured" } else { "given" }), "{gemm}");
    // The report.
    let html = std::fs::read_to_string(out.join("index.html")).expect("index.html");
    let charts = 3 + 2 * models.len();
    assert_eq!(html.matches("<svg").count(), charts, "inline charts");
    assert_eq!(std::fs::read_dir(out.join("charts")).unwrap().count(), charts);
    for model in models {
        assert!(html.contains(model));
    }
}

#[test]
fn all_configs_on_one_rank_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = ortbench(
        &[
            &["run", "--models", "tiny-bert,tiny-gpt2", "--out", out.to_str().unwrap()],
            QUICK_SHAPE,
            PROBE,
        ]
        .concat(),
        &[],
        true,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // The summary table on stdout names every run.
    let stdout = String::from_utf8_lossy(&o.stdout);
    for w in ["samples/s", "speedup", "tiny-bert", "tiny-gpt2", "ort-zero1", "1.00×"] {
        assert!(stdout.contains(w), "summary lacks {w}:\n{stdout}");
    }
    // The default configs' table fits 160 characters: no column that no row fills.
    let widest = stdout.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(widest <= 160, "the summary is {widest} characters wide:\n{stdout}");
    assert!(!stdout.contains("compile s") && !stdout.contains("max batch"), "{stdout}");
    check_run_dir(&out, &["tiny-bert", "tiny-gpt2"], 1, 3, true);

    // `report` regenerates index.html from the files alone.
    std::fs::remove_file(out.join("index.html")).unwrap();
    let o = ortbench(&["report", out.to_str().unwrap()], &[], false);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.join("index.html").is_file());

    // `compare` of a run with itself: no regression. Against a doctored copy whose ort is
    // 30 % slower: a regression, and exit 1 with --fail-on-regression.
    let o = ortbench(&["compare", out.to_str().unwrap(), out.to_str().unwrap()], &[], false);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("no regressions"));
    let slow = dir.path().join("slow");
    std::fs::create_dir(&slow).unwrap();
    let run = ortbench::results::load_run(&out).unwrap();
    let mut rows = run.result_rows().unwrap();
    for r in rows.iter_mut().filter(|r| r.config == "ort") {
        r.samples_per_s = r.samples_per_s.map(|s| s * 0.7);
    }
    ortbench::results::write_tables(&slow, &rows, &run.step_rows().unwrap()).unwrap();
    std::fs::copy(out.join("run.json"), slow.join("run.json")).unwrap();
    let o = ortbench(
        &["compare", "--fail-on-regression", out.to_str().unwrap(), slow.to_str().unwrap()],
        &[],
        false,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.matches("REGRESSION").count(), 2, "{text}");
    assert!(text.contains("2 regression(s)"));
    let o = ortbench(&["compare", out.to_str().unwrap(), slow.to_str().unwrap()], &[], false);
    assert_eq!(o.status.code(), Some(0), "regressions only fail with --fail-on-regression");
}

#[test]
fn all_configs_on_two_ranks_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = ortbench(
        &[
            &[
                "run",
                "--models",
                "tiny-bert,tiny-gpt2",
                "--ranks",
                "2",
                "--out",
                out.to_str().unwrap(),
            ],
            QUICK_SHAPE,
            PROBE,
        ]
        .concat(),
        &[],
        false,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    check_run_dir(&out, &["tiny-bert", "tiny-gpt2"], 2, 3, false);
}

/// A broken engine — every gradient doubled — trains to a loss curve AdamW keeps almost
/// identical, so a loss-only check passes it; the parity probe's gradient norms flag it at
/// default settings.
#[test]
fn a_broken_engine_is_flagged_diverged_at_default_settings() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = [
        "run",
        "--models",
        "tiny-bert",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--repeat",
        "1",
        "--out",
        out.to_str().unwrap(),
    ];
    let o = ortbench(&args, &[("ORTBENCH_FAULT", "grad-scale:2@ort")], false);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(cell(&h, &rows, "ort", "status"), "diverged", "{}", cell(&h, &rows, "ort", "error"));
    assert!(cell(&h, &rows, "ort", "error").contains("gradient norm"));
    let gn: f64 = cell(&h, &rows, "ort", "grad_norm_rel_diff_step0").parse().unwrap();
    assert!((gn - 1.0).abs() < 1e-3, "doubled gradients: relative difference 1, got {gn}");
    // The untouched engine config passes the same check.
    assert_eq!(
        cell(&h, &rows, "ort-zero1", "status"),
        "ok",
        "{}",
        cell(&h, &rows, "ort-zero1", "error")
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("diverged"));
}

/// A bert row with no masked token made the mean loss 0/0 at batch 1 (every row has one now).
#[test]
fn bert_trains_at_batch_1_seq_16() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = [
        "run",
        "--models",
        "bert",
        "--batch-size",
        "1",
        "--seq-len",
        "16",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--repeat",
        "1",
        "--parity-steps",
        "2",
        "--out",
        out.to_str().unwrap(),
    ];
    let o = ortbench(&args, &[], false);
    assert!(o.status.success(), "{}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    for config in CONFIGS {
        assert_eq!(
            cell(&h, &rows, config, "status"),
            "ok",
            "{config}: {}",
            cell(&h, &rows, config, "error")
        );
    }
}

#[test]
fn env_prints_the_environment() {
    let o = ortbench(&["env"], &[], false);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    for k in ["cpu ", "cpu_ram_mb", "os ", "torch_version", "ortbench_commit"] {
        assert!(text.contains(k), "{k} missing:\n{text}");
    }
    let o = ortbench(&["env", "--json"], &[], false);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("env --json is JSON");
    assert!(v["cpu_count"].as_u64().unwrap() >= 1);
}
