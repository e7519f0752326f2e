//! The memory split through the real binary: every config of a run records its parts (or
//! leaves unknown the ones it cannot say), within the measured peak, and the report draws them;
//! the engine's logits part is what the fused linear cross-entropy takes away.

mod common;

use std::path::Path;

use common::*;

/// tiny-gpt2's vocabulary (models/configs/tiny-gpt2.json) and SMALL's batch × sequence.
const V: u64 = 1000;
const SMALL: [&str; 4] = ["--batch-size", "2", "--seq-len", "16"];
const ROWS: u64 = 2 * 16;
/// A short plan without its shape: one timed run per config, no parity probe.
const PLAN: &[&str] =
    &["--steps", "3", "--warmup", "1", "--dropout", "0", "--repeat", "1", "--parity-steps", "0"];
const PARTS: [&str; 5] = [
    "mem_params_bytes",
    "mem_grads_bytes",
    "mem_optimizer_bytes",
    "mem_activations_bytes",
    "mem_logits_bytes",
];

/// Runs tiny-gpt2 under `configs` with PLAN at `shape` into `out`; returns results.csv.
fn run(
    out: &Path,
    configs: &str,
    shape: &[&str],
    envs: &[(&str, &str)],
) -> (Vec<String>, Vec<Vec<String>>) {
    let mut args = vec!["run", "--models", "tiny-gpt2", "--configs", configs];
    args.extend_from_slice(PLAN);
    args.extend_from_slice(shape);
    args.extend_from_slice(&["--out", out.to_str().unwrap()]);
    let o = ortbench(&args, envs, false);
    assert!(o.status.success(), "{}", stderr(&o));
    read_csv(&out.join("results.csv"))
}

fn bytes(h: &[String], rows: &[Vec<String>], config: &str, column: &str) -> u64 {
    let v = cell(h, rows, config, column);
    v.parse().unwrap_or_else(|_| panic!("{config} {column} = '{v}'"))
}

#[test]
fn every_config_records_its_split_within_its_peak() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let (h, rows) = run(&out, "pytorch,ort,ort-zero1", &SMALL, &[]);
    assert_eq!(rows.len(), 3);
    for config in ["pytorch", "ort", "ort-zero1"] {
        let sum: u64 = PARTS.iter().map(|p| bytes(&h, &rows, config, p)).sum();
        let peak = bytes(&h, &rows, config, "peak_mem_bytes");
        assert!(sum <= peak, "{config}: parts {sum} above the measured peak {peak}");
        let source = if config == "pytorch" { "analytic" } else { "plan" };
        assert_eq!(cell(&h, &rows, config, "mem_split_source"), source);
        // Optimizer state is the column it always was; gradients are as large as parameters
        // (fp32 flat buffers, the pads included, on the engine).
        let opt = bytes(&h, &rows, config, "optimizer_bytes_per_rank");
        assert_eq!(bytes(&h, &rows, config, "mem_optimizer_bytes"), opt, "{config}");
        let params = bytes(&h, &rows, config, "mem_params_bytes");
        assert_eq!(bytes(&h, &rows, config, "mem_grads_bytes"), params, "{config}");
        let psi: u64 = cell(&h, &rows, config, "param_count").parse().unwrap();
        assert!(params >= 4 * psi && params < 4 * psi + 4096, "{config}: {params} for Ψ {psi}");
    }
    // pytorch: the three B·T·V fp32 tensors of libtorch's cross-entropy; its activations are
    // what the peak leaves, so its parts are the whole peak.
    assert_eq!(bytes(&h, &rows, "pytorch", "mem_logits_bytes"), 3 * ROWS * V * 4);
    let sum: u64 = PARTS.iter().map(|p| bytes(&h, &rows, "pytorch", p)).sum();
    assert_eq!(sum, bytes(&h, &rows, "pytorch", "peak_mem_bytes"));
    // The report's memory chart names every config under its bar.
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    let svg = std::fs::read_to_string(out.join("charts/memory.svg")).unwrap();
    assert!(html.contains("chart-memory"));
    for config in ["pytorch", "ort", "ort-zero1", "parameters", "logits"] {
        assert!(svg.contains(&format!("\n{config}\n")), "memory.svg lacks {config}");
    }
}

#[test]
fn the_fused_head_takes_the_logits_out_of_the_engines_arena() {
    // More rows than the fused kernel's chunk (at most 1024 rows: `chunk_rows`), so that its
    // chunk of logits is smaller than all of them: 32 × 64 = 2048 rows.
    let (shape, rows) = (["--batch-size", "32", "--seq-len", "64"], 32 * 64);
    let dir = tempfile::tempdir().unwrap();
    let (h, fused) = run(&dir.path().join("fused"), "ort", &shape, &[]);
    let (_, unfused) = run(
        &dir.path().join("unfused"),
        "ort",
        &shape,
        &[("ORTBENCH_PASSES", "-fuse_linear_cross_entropy")],
    );
    let logits = |rows| bytes(&h, rows, "ort", "mem_logits_bytes");
    // Unfused, the arena holds the (B·T, V) fp32 logits (their gradient written over them).
    assert!(logits(&unfused) >= rows * V * 4, "{}", logits(&unfused));
    assert!(logits(&fused) < logits(&unfused), "{} vs {}", logits(&fused), logits(&unfused));
    // The other parts do not depend on the head.
    for p in ["mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"] {
        assert_eq!(bytes(&h, &fused, "ort", p), bytes(&h, &unfused, "ort", p), "{p}");
    }
    // run.json's settings say which passes a run narrowed, and only then.
    let run_json = |d: &str| std::fs::read_to_string(dir.path().join(d).join("run.json")).unwrap();
    let note = "engine passes ORTBENCH_PASSES=-fuse_linear_cross_entropy";
    assert!(run_json("unfused").contains(note));
    assert!(!run_json("fused").contains("engine passes"));
}
