//! Helpers shared by bench's integration tests.
#![allow(dead_code, reason = "each test binary includes this module and uses a part of it")]

use std::path::Path;
use std::process::{Command, Output};

pub fn ortbench_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ortbench"));
    c.env_remove("ORTBENCH_FAULT");
    c
}

/// Runs ortbench with `args`; the CPU peak is given rather than measured (saves ~2 s a run)
/// unless `measure_peak`.
pub fn ortbench(args: &[&str], envs: &[(&str, &str)], measure_peak: bool) -> Output {
    let mut c = ortbench_cmd();
    c.args(args);
    if !measure_peak {
        c.env("ORTBENCH_CPU_PEAK_GFLOPS", "100");
    } else {
        c.env_remove("ORTBENCH_CPU_PEAK_GFLOPS");
    }
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().expect("run ortbench")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header = r.headers().unwrap().iter().map(String::from).collect();
    let rows = r.records().map(|rec| rec.unwrap().iter().map(String::from).collect()).collect();
    (header, rows)
}

pub fn col(header: &[String], name: &str) -> usize {
    header
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("no column {name} in {header:?}"))
}

/// The value of `column` in the row where `config` is the config.
pub fn cell<'a>(header: &[String], rows: &'a [Vec<String>], config: &str, column: &str) -> &'a str {
    let row = rows
        .iter()
        .find(|r| r[col(header, "config")] == config)
        .unwrap_or_else(|| panic!("no {config} row"));
    &row[col(header, column)]
}

/// The tiny models' quick settings, without a word on repeats and the parity probe.
pub const QUICK_SHAPE: &[&str] =
    &["--steps", "3", "--warmup", "1", "--batch-size", "2", "--seq-len", "16", "--dropout", "0"];

/// A short plan: QUICK_SHAPE with one timed run per config and no parity probe.
pub const QUICK: &[&str] = &[
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
];

/// A run's per-step losses of `config` on rank 0 (timed steps, in step order).
pub fn losses(out: &Path, config: &str) -> Vec<f64> {
    let (h, rows) = read_csv(&out.join("steps.csv"));
    let mut v: Vec<(usize, f64)> = rows
        .iter()
        .filter(|r| {
            r[col(&h, "config")] == config
                && r[col(&h, "rank")] == "0"
                && r[col(&h, "phase")] == "timed"
        })
        .map(|r| (r[col(&h, "step")].parse().unwrap(), r[col(&h, "loss")].parse().unwrap()))
        .collect();
    v.sort_by_key(|x| x.0);
    v.into_iter().map(|x| x.1).collect()
}

/// The spec a finished run gave its first worker, as JSON.
pub fn spec_of(out: &Path) -> serde_json::Value {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    meta["runs"][0].clone()
}

/// What ranks started by a launcher must reproduce: the per-step losses of a one-rank
/// tiny-gpt2 `ort` run of 4 rows (3 steps, dropout 0) in `dir`/one, and the spec of the same run
/// as 2 ranks of 2 rows (what a launcher hands each worker).
pub fn one_rank_reference(dir: &Path) -> (Vec<f64>, serde_json::Value) {
    let out = dir.join("one");
    let mut args = vec!["run", "--models", "tiny-gpt2", "--configs", "ort", "--out"];
    args.push(out.to_str().unwrap());
    args.extend(["--steps", "3", "--warmup", "1", "--batch-size", "4", "--seq-len", "16"]);
    args.extend(["--dropout", "0", "--repeat", "1", "--parity-steps", "0"]);
    let o = ortbench(&args, &[], false);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut spec = spec_of(&out);
    spec["ranks"] = 2.into();
    spec["batch_size"] = 2.into();
    (losses(&out, "ort"), spec)
}

/// Worker processes whose command line carries `marker` (the run's unique seed), stopped ones
/// included.
pub fn workers_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(" worker ") && c.contains(marker))
        .count()
}
