//! The run's files. Each is rewritten after every finished run through a temporary file and a
//! rename, so an interrupted `run` leaves valid files holding every run that finished.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

/// A row of steps.csv.
#[derive(Clone, Debug, Serialize)]
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
#[derive(Clone, Debug, Serialize)]
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
    /// ok | error | oom
    pub status: String,
    pub samples_per_s: Option<f64>,
    pub tokens_per_s: Option<f64>,
    pub step_ms_median: Option<f64>,
    pub step_ms_p90: Option<f64>,
    pub peak_mem_bytes: Option<u64>,
    pub param_count: Option<usize>,
    /// Optimizer-state bytes one rank holds (fp32 Adam moments, plus the fp32 master shard
    /// under ZeRO-1).
    pub optimizer_bytes_per_rank: Option<usize>,
    pub final_loss: Option<f64>,
    pub error: String,
}

/// Writes `rows` as CSV to `path` atomically.
pub fn write_csv<T: Serialize>(path: &Path, rows: &[T], header_if_empty: &[&str]) -> Result<()> {
    let tmp = tmp_path(path);
    {
        let mut w = csv::Writer::from_path(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
        if rows.is_empty() {
            w.write_record(header_if_empty)?;
        }
        for r in rows {
            w.serialize(r)?;
        }
        w.flush()?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes `text` to `path` atomically.
pub fn write_text(path: &Path, text: &str) -> Result<()> {
    let tmp = tmp_path(path);
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

fn tmp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

pub const STEP_COLUMNS: &[&str] =
    &["model", "config", "precision", "rank", "step", "loss", "step_ms", "grad_norm", "loss_scale", "skipped"];
pub const RESULT_COLUMNS: &[&str] = &[
    "model", "config", "precision", "device", "batch_size", "seq_len", "ranks", "steps", "warmup", "status",
    "samples_per_s", "tokens_per_s", "step_ms_median", "step_ms_p90", "peak_mem_bytes", "param_count",
    "optimizer_bytes_per_rank", "final_loss", "error",
];
