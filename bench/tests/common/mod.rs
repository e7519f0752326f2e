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
