//! ortbench-models — the only crate that knows both sides of a model: HF configs, hub and
//! safetensors loading, deterministic data, the parameter layout shared by every config,
//! and the libtorch baseline (`torch`, feature `torch`). Everything family-specific (BERT,
//! GPT-2) is in `family/`, one module per family.

pub mod config;
pub mod data;
pub mod family;
pub mod graph;
pub mod onnx;
pub mod params;
pub mod rng;
pub mod schedule;
pub mod spec;
pub mod text;
pub mod weights;

#[cfg(feature = "torch")]
pub mod torch;

pub use config::{Activation, ModelConfig};
pub use data::{Batch, DataSource, Task, IGNORE_INDEX};
pub use family::{
    bert::BertConfig, gpt2::Gpt2Config, Architecture, Family, FlopCount, Head, TASKS,
};
pub use params::{param_count, param_specs, ParamSpec};
pub use schedule::LrSchedule;
pub use spec::{resolve, with_task, HubOptions, ResolvedModel, Source};
pub use weights::{LoadReport, NamedTensor, Weights};

/// Errors a user can cause: each message says what was wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{0}")]
    UnknownModel(String),
    #[error("unsupported architecture '{0}' in {1}: supported are {supported}", supported = family::Architecture::supported().join(", "))]
    UnsupportedArchitecture(String, String),
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    #[error("bad model config: {0}")]
    BadConfig(String),
    #[error("weights: {0}")]
    Weights(String),
    #[error("hub: {0}")]
    Hub(String),
    #[error("data: {0}")]
    Data(String),
    #[error("{0}")]
    Training(String),
}
