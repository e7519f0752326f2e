//! One run of the plan: everything a worker needs, serialised to it as JSON.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The configurations `run` compares (defined beside the charts, which order by it).
pub use ortbench_report::CONFIGS;
/// The ones this build implements.
pub const IMPLEMENTED_CONFIGS: &[&str] = &["pytorch", "torch-compile", "ort", "ort-zero1"];
/// What `run` compares when `--configs` is not given: `torch-compile` is asked for by name (it
/// needs the venv's python and a C++ compiler, and compiles for minutes on a CPU).
pub const DEFAULT_CONFIGS: &[&str] = &["pytorch", "ort", "ort-zero1"];
pub const PRECISIONS: &[&str] = &["fp32", "fp16", "bf16"];

/// Where initial weights come from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum WeightsSource {
    /// HF initialisation from the seed.
    Random,
    /// A safetensors file (a directory's or hub snapshot's `model.safetensors`).
    File(PathBuf),
}

fn default_launch() -> String {
    "processes".into()
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunSpec {
    /// The model as the user named it (alias, directory or hub id).
    pub model: String,
    pub config: String,
    pub precision: String,
    pub device: String,
    /// Rows per rank; the global batch is batch_size × ranks.
    pub batch_size: usize,
    /// Data-parallel ranks.
    pub ranks: usize,
    /// How ranks > 1 run: `processes` (one worker each, joined over TCP) or `threads` (of one
    /// worker).
    #[serde(default = "default_launch")]
    pub launch: String,
    pub seq_len: usize,
    pub steps: usize,
    pub warmup: usize,
    pub seed: u64,
    pub lr: f64,
    pub weight_decay: f64,
    pub max_grad_norm: f64,
    pub lr_schedule: String,
    pub lr_warmup_steps: usize,
    pub dropout: Option<f64>,
    pub data: Option<PathBuf>,
    /// `--task` (None: the checkpoint's architecture).
    #[serde(default)]
    pub task: Option<String>,
    /// What the model trains, as results record it (`Task::name`: masked-lm, causal-lm,
    /// sequence-classification, multi-label-classification, regression).
    #[serde(default)]
    pub task_name: String,
    pub weights: WeightsSource,
    /// `--collective-timeout-s` (None: the device's default, `hang::collective_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_timeout_s: Option<f64>,
}
