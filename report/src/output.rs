//! The rows of a run's two tables, and atomic file writes. The tables become Polars
//! DataFrames in `results.rs`; each file is rewritten after every finished run through a
//! temporary file and a rename, so an interrupted `run` leaves valid files holding every run
//! that finished.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

/// A row of steps.csv: one per (run, rank, step).
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct StepRow {
    pub model: String,
    pub config: String,
    pub precision: String,
    /// Which repetition of the run (`--repeat`), 0-based.
    pub repeat: usize,
    /// `timed` (the measured runs) or `parity` (the parity probe: dropout 0, a learning rate
    /// that moves the loss; its curves decide `diverged`).
    pub phase: String,
    pub rank: usize,
    pub step: usize,
    pub loss: f64,
    pub step_ms: f64,
    /// On a GPU: the step's device time between CUDA events recorded before and after it on
    /// the stream the framework computes on (`step_ms` is the wall time to a synchronise after
    /// it); None on the CPU.
    pub device_ms: Option<f64>,
    pub grad_norm: f64,
    pub loss_scale: f64,
    pub skipped: bool,
}

/// A row of results.csv: one per (model, config, precision, ranks), over its `repeats` runs.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ResultRow {
    pub model: String,
    /// What the model trained (masked-lm, causal-lm, sequence-classification,
    /// multi-label-classification, regression); empty in runs written before it was recorded.
    pub task: String,
    pub config: String,
    pub precision: String,
    pub device: String,
    pub batch_size: usize,
    pub seq_len: usize,
    pub ranks: usize,
    pub steps: usize,
    pub warmup: usize,
    /// Timed runs pooled into this row (`--repeat`), interleaved with the other configs.
    pub repeats: usize,
    /// ok | diverged | error | oom | timeout | interrupted (the worst of its runs and probe)
    pub status: String,
    /// Global samples (batch_size × ranks) per median step time (steps after warm-up,
    /// pooled over the repeats).
    pub samples_per_s: Option<f64>,
    pub tokens_per_s: Option<f64>,
    /// The `pytorch` row's median step time over this row's (same model, precision, ranks).
    pub speedup: Option<f64>,
    /// 95 % interval of `speedup`: percentile bootstrap, resampling repeats and then the
    /// steps within each (metrics::speedup_interval).
    pub speedup_lo: Option<f64>,
    pub speedup_hi: Option<f64>,
    /// Whether the interval excludes 1.0; false marks a speedup that is not significant.
    pub speedup_significant: Option<bool>,
    /// The engine's configs (`ort`, `ort-zero1`): the `torch-compile` row's median step time
    /// over this row's (same model, precision, ranks), with its interval and significance
    /// computed as `speedup`'s; None for the other configs or without a torch-compile row.
    pub speedup_vs_torch_compile: Option<f64>,
    pub speedup_vs_torch_compile_lo: Option<f64>,
    pub speedup_vs_torch_compile_hi: Option<f64>,
    pub speedup_vs_torch_compile_significant: Option<bool>,
    pub step_ms_median: Option<f64>,
    pub step_ms_p90: Option<f64>,
    pub step_ms_min: Option<f64>,
    pub step_ms_max: Option<f64>,
    /// Population standard deviation of the measured step times.
    pub step_ms_std: Option<f64>,
    /// `torch-compile`: the first step's wall time in seconds — inductor compiles the forward
    /// and backward graphs there (one step's compute included) — the median over the runs,
    /// each compiling with a fresh cache. Never part of the step times (that step is warm-up).
    /// None for the other configs.
    pub compile_s: Option<f64>,
    /// How the engine's GPU steps reached the device: "captured" (a CUDA graph replayed each
    /// step) or "direct: <why>" (one host call per kernel, and the reason); empty for the CPU
    /// and the baselines.
    pub step_launches: String,
    /// Model FLOPs of one training sample, as the literature counts them for MFU
    /// (metrics::train_flops_per_sample: every position's LM head included).
    pub train_flops_per_sample: Option<f64>,
    /// Hardware FLOPs one sample actually cost in this config: the engine's executed GEMMs
    /// (rows a loss ignores skipped, recompute added), the model FLOPs for the baseline.
    pub hw_flops_per_sample: Option<f64>,
    /// Achieved model TFLOP/s: train_flops_per_sample × samples_per_s.
    pub tflops: Option<f64>,
    /// Model FLOPs utilisation: tflops over peak_tflops.
    pub mfu: Option<f64>,
    /// Hardware FLOPs utilisation: hw_flops_per_sample × samples_per_s over peak_tflops.
    pub hfu: Option<f64>,
    /// The device's theoretical peak for this precision (run.json: formula and inputs).
    pub peak_tflops: Option<f64>,
    /// The best fp32 GEMM measured on the device (CPU only): what a GEMM really reaches.
    pub gemm_peak_tflops: Option<f64>,
    pub peak_mem_bytes: Option<u64>,
    pub param_count: Option<usize>,
    /// Optimizer-state bytes one rank holds (fp32 Adam moments, plus the fp32 master shard
    /// under ZeRO-1).
    pub optimizer_bytes_per_rank: Option<usize>,
    /// Peak memory per rank split by what holds it (the report's memory chart); each None where
    /// that part is not known. How each part is derived depends on the config and is named by
    /// `mem_split_source` (docs/usage.md, "Output and reports").
    pub mem_params_bytes: Option<u64>,
    pub mem_grads_bytes: Option<u64>,
    pub mem_optimizer_bytes: Option<u64>,
    pub mem_activations_bytes: Option<u64>,
    pub mem_logits_bytes: Option<u64>,
    /// `plan` (the engine: flat buffers and its memory plan's arena), `analytic` (the torch
    /// configs: parameter counts and tensor shapes), empty when no split was recorded.
    pub mem_split_source: String,
    pub final_loss: Option<f64>,
    /// Parity probe: largest relative difference of this config's losses from pytorch's over
    /// their common (rank, step) pairs; 0 for the pytorch row.
    pub max_loss_rel_diff: Option<f64>,
    /// Parity probe: relative difference of the gradient norm (before clipping) at the first
    /// step, where both configs differentiate the same weights — what catches a wrongly scaled
    /// gradient, which AdamW's update would hide from the loss (later steps' norms drift apart
    /// even for correct engines: see `metrics::compare_with_baseline`).
    pub grad_norm_rel_diff_step0: Option<f64>,
    /// The tolerance both differences were held to (from the precision, or --diverge-tol).
    pub parity_tol: Option<f64>,
    /// `--batch-size auto`: the memory budget of one worker process (one rank), in bytes;
    /// None without auto.
    pub memory_budget_bytes: Option<u64>,
    /// `--batch-size auto`: the largest batch (rows per rank) whose run peaked within the
    /// budget, searched on one grid for every config; None when none fitted or without auto.
    pub max_batch_size: Option<usize>,
    /// Throughput and measured peak of the run at `max_batch_size` (one run, the row's steps
    /// and warm-up).
    pub max_batch_samples_per_s: Option<f64>,
    pub max_batch_tokens_per_s: Option<f64>,
    pub max_batch_peak_mem_bytes: Option<u64>,
    /// The batches the search tried, in order, ✓ fits / ✗ does not ("1✓ 2✓ 4✗ 3✓ · run 3✓");
    /// run.json's `batch_search` has each one's bytes and how it was judged.
    pub max_batch_search: String,
    /// Wall-clock seconds of the worker process (start-up and model build included).
    pub wall_s: Option<f64>,
    pub error: String,
}

/// A worker's memory split, one rank's bytes by what holds them (the `mem_*` columns of
/// [`ResultRow`]); a part is None where it is not known.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct MemSplit {
    pub params_bytes: Option<u64>,
    pub grads_bytes: Option<u64>,
    pub optimizer_bytes: Option<u64>,
    pub activations_bytes: Option<u64>,
    pub logits_bytes: Option<u64>,
    /// How the parts were obtained (`mem_split_source`).
    pub source: String,
}

impl MemSplit {
    /// `source` of the engine's split: its flat buffers and its memory plan's arena.
    pub const PLAN: &'static str = "plan";
    /// `source` of the torch configs' split: parameter counts and tensor shapes; the
    /// activations, when known, are what the measured peak leaves of the other parts.
    pub const ANALYTIC: &'static str = "analytic";

    /// Whether the activations are what the measured peak leaves of the other parts (so they
    /// hold the process's runtime too), not a count of their own.
    pub fn activations_are_remainder(&self) -> bool {
        self.source == Self::ANALYTIC
    }

    /// The parts in the order the chart stacks them, with their names.
    pub fn parts(&self) -> [(&'static str, Option<u64>); 5] {
        [
            ("parameters", self.params_bytes),
            ("gradients", self.grads_bytes),
            ("optimizer state", self.optimizer_bytes),
            ("activations", self.activations_bytes),
            ("logits", self.logits_bytes),
        ]
    }

    /// The sum of the known parts.
    pub fn known_bytes(&self) -> u64 {
        self.parts().iter().filter_map(|p| p.1).sum()
    }
}

impl ResultRow {
    /// This row's memory split (its `mem_*` columns).
    pub fn mem_split(&self) -> MemSplit {
        MemSplit {
            params_bytes: self.mem_params_bytes,
            grads_bytes: self.mem_grads_bytes,
            optimizer_bytes: self.mem_optimizer_bytes,
            activations_bytes: self.mem_activations_bytes,
            logits_bytes: self.mem_logits_bytes,
            source: self.mem_split_source.clone(),
        }
    }

    /// Sets the `mem_*` columns from `split` (None: no split, every part unknown).
    pub fn set_mem_split(&mut self, split: Option<&MemSplit>) {
        let s = split.cloned().unwrap_or_default();
        self.mem_params_bytes = s.params_bytes;
        self.mem_grads_bytes = s.grads_bytes;
        self.mem_optimizer_bytes = s.optimizer_bytes;
        self.mem_activations_bytes = s.activations_bytes;
        self.mem_logits_bytes = s.logits_bytes;
        self.mem_split_source = s.source;
    }
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

pub const STEP_COLUMNS: &[&str] = &[
    "model",
    "config",
    "precision",
    "repeat",
    "phase",
    "rank",
    "step",
    "loss",
    "step_ms",
    "device_ms",
    "grad_norm",
    "loss_scale",
    "skipped",
];
pub const RESULT_COLUMNS: &[&str] = &[
    "model",
    "task",
    "config",
    "precision",
    "device",
    "batch_size",
    "seq_len",
    "ranks",
    "steps",
    "warmup",
    "repeats",
    "status",
    "samples_per_s",
    "tokens_per_s",
    "speedup",
    "speedup_lo",
    "speedup_hi",
    "speedup_significant",
    "speedup_vs_torch_compile",
    "speedup_vs_torch_compile_lo",
    "speedup_vs_torch_compile_hi",
    "speedup_vs_torch_compile_significant",
    "step_ms_median",
    "step_ms_p90",
    "step_ms_min",
    "step_ms_max",
    "step_ms_std",
    "compile_s",
    "step_launches",
    "train_flops_per_sample",
    "hw_flops_per_sample",
    "tflops",
    "mfu",
    "hfu",
    "peak_tflops",
    "gemm_peak_tflops",
    "peak_mem_bytes",
    "param_count",
    "optimizer_bytes_per_rank",
    "mem_params_bytes",
    "mem_grads_bytes",
    "mem_optimizer_bytes",
    "mem_activations_bytes",
    "mem_logits_bytes",
    "mem_split_source",
    "final_loss",
    "max_loss_rel_diff",
    "grad_norm_rel_diff_step0",
    "parity_tol",
    "memory_budget_bytes",
    "max_batch_size",
    "max_batch_samples_per_s",
    "max_batch_tokens_per_s",
    "max_batch_peak_mem_bytes",
    "max_batch_search",
    "wall_s",
    "error",
];
