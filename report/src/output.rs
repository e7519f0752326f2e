//! The rows of a run's two tables, and atomic file writes. The tables become Polars
//! DataFrames in `results.rs`; each file is rewritten after every finished run through a
//! temporary file and a rename, so an interrupted `run` leaves valid files holding every run
//! that finished.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

/// A row of steps.csv: one per (run, rank, step).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StepRow {
    pub model: String,
    pub config: String,
    pub precision: String,
    pub rank: usize,
    pub step: usize,
    pub loss: f64,
    pub step_ms: f64,
    pub grad_norm: f64,
    pub loss_scale: f64,
    pub skipped: bool,
}

/// A row of results.csv: one per run.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ResultRow {
    pub model: String,
    pub config: String,
    pub precision: String,
    pub device: String,
    pub batch_size: usize,
    pub seq_len: usize,
    pub ranks: usize,
    pub steps: usize,
    pub warmup: usize,
    /// ok | diverged | error | oom | timeout | interrupted
    pub status: String,
    /// Global samples (batch_size × ranks) per second over the steps after warm-up.
    pub samples_per_s: Option<f64>,
    pub tokens_per_s: Option<f64>,
    /// samples_per_s over the `pytorch` row of the same model, precision and ranks.
    pub speedup: Option<f64>,
    pub step_ms_median: Option<f64>,
    pub step_ms_p90: Option<f64>,
    pub step_ms_min: Option<f64>,
    pub step_ms_max: Option<f64>,
    /// Population standard deviation of the measured step times.
    pub step_ms_std: Option<f64>,
    /// Analytic training FLOPs of one sample (see metrics::flops).
    pub train_flops_per_sample: Option<f64>,
    /// Achieved TFLOP/s: train_flops_per_sample × samples_per_s.
    pub tflops: Option<f64>,
    /// tflops over peak_tflops.
    pub mfu: Option<f64>,
    /// The device's peak for this precision (run.json says where it comes from).
    pub peak_tflops: Option<f64>,
    pub peak_mem_bytes: Option<u64>,
    pub param_count: Option<usize>,
    /// Optimizer-state bytes one rank holds (fp32 Adam moments, plus the fp32 master shard
    /// under ZeRO-1).
    pub optimizer_bytes_per_rank: Option<usize>,
    pub final_loss: Option<f64>,
    /// Largest relative difference of this run's losses from the pytorch run's over their
    /// common (rank, step) pairs; 0 for the pytorch row.
    pub max_loss_rel_diff: Option<f64>,
    /// Wall-clock seconds of the worker process (start-up and model build included).
    pub wall_s: Option<f64>,
    pub error: String,
}

/// Writes `bytes` to `path` atomically.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = tmp_path(path);
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes `text` to `path` atomically.
pub fn write_text(path: &Path, text: &str) -> Result<()> {
    write_bytes(path, text.as_bytes())
}

/// Where `path` is staged before the rename: a hidden file in the same directory (a rename
/// is only atomic within one filesystem).
pub fn tmp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

pub const STEP_COLUMNS: &[&str] =
    &["model", "config", "precision", "rank", "step", "loss", "step_ms", "grad_norm", "loss_scale", "skipped"];
pub const RESULT_COLUMNS: &[&str] = &[
    "model", "config", "precision", "device", "batch_size", "seq_len", "ranks", "steps", "warmup", "status",
    "samples_per_s", "tokens_per_s", "speedup", "step_ms_median", "step_ms_p90", "step_ms_min", "step_ms_max",
    "step_ms_std", "train_flops_per_sample", "tflops", "mfu", "peak_tflops", "peak_mem_bytes", "param_count",
    "optimizer_bytes_per_rank", "final_loss", "max_loss_rel_diff", "wall_s", "error",
];
