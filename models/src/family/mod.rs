//! Model families, one module each (`bert/`, `gpt2/`), holding everything that differs between
//! them: the config (HF's fields, mirrored) and its validation, the parameter specs with HF
//! names per head, the engine graph (`graph.rs`), the tch module (`torch.rs`), the pad ids the
//! graph's derived inputs use, and the FLOP count. The rest of the crate, the harness, `train`
//! and `export` see a family only through this module's two seams:
//!
//! - [`FamilyInfo`]: what a family is before any config is read — its names, the heads it
//!   builds (the second axis: an [`Architecture`] is a family with a [`Head`]), the checkpoint
//!   names its weights may carry, and its config reader;
//! - `FamilyModel`: what it does with a parsed config, implemented by the family's config
//!   struct.
//!
//! A new family is its module (a config struct implementing `FamilyModel` and a
//! `static INFO: FamilyInfo`), its variant of [`Family`] with its arm in `Family::model` and
//! `Family::model_mut`, and its `INFO` in [`FAMILIES`].

pub mod bert;
pub mod distilbert;
mod flops;
pub mod gpt2;
mod head;
pub mod llama;

pub use flops::FlopCount;
pub use head::{Architecture, Head, TASKS};

use ortbench_engine::graph::TensorId;
use serde_json::Value;

use crate::config::{Activation, ModelConfig};
use crate::graph::{BResult, Builder, GraphOptions};
use crate::params::ParamSpec;
use crate::ModelError;

/// Every family ortbench implements: where a config.json's `architectures` (or `model_type`)
/// is looked up.
pub static FAMILIES: &[&FamilyInfo] = &[
    &bert::INFO,
    &bert::ROBERTA,
    &distilbert::INFO,
    &gpt2::INFO,
    &llama::LLAMA,
    &llama::MISTRAL,
    &llama::QWEN2,
    &llama::QWEN3,
    &llama::SMOLLM3,
    &llama::PHI3,
    &llama::GEMMA,
    &llama::GEMMA2,
    &llama::GEMMA3,
];

/// What a family is before a config is read.
#[derive(Debug)]
pub struct FamilyInfo {
    /// The family in messages ("BERT").
    pub name: &'static str,
    /// HF's `model_type`: picks the family of a config.json without `architectures`.
    pub model_type: &'static str,
    /// The heads the family builds, with HF's class names; the first is the architecture of a
    /// config.json without `architectures`.
    pub heads: &'static [(Head, &'static str)],
    /// HF's `base_model_prefix`: checkpoints saved from the base model lack it.
    pub base_prefix: &'static str,
    /// The input embedding an LM head reuses when `tie_word_embeddings` is true.
    pub word_embedding: &'static str,
    /// The LM head's own weight when `tie_word_embeddings` is false.
    pub untied_head: &'static str,
    /// Older checkpoint names of parameters: (name in the file, the name here).
    pub checkpoint_aliases: &'static [(&'static str, &'static str)],
    /// Reads the family's fields of a config.json (`origin` names it in errors) and refuses
    /// the options the family does not implement, by name.
    pub parse: fn(raw: &Value, origin: &str) -> Result<Family, ModelError>,
}

impl FamilyInfo {
    /// The family whose `model_type` is `model_type`.
    pub fn by_model_type(model_type: &str) -> Option<&'static FamilyInfo> {
        FAMILIES.iter().copied().find(|f| f.model_type == model_type)
    }

    /// The `--task` names of the family's heads, for messages.
    pub fn task_names(&self) -> Vec<&'static str> {
        self.heads.iter().map(|(h, _)| h.task_name()).collect()
    }
}

/// A parsed config of one family: the family's struct mirroring HF's config class.
#[derive(Clone, Debug)]
pub enum Family {
    /// BERT and RoBERTa (one module: `BertConfig::variant` tells them apart).
    Bert(bert::BertConfig),
    DistilBert(distilbert::DistilBertConfig),
    Gpt2(gpt2::Gpt2Config),
    /// Llama, Mistral, Qwen2, Qwen3, SmolLM3, Phi-3 and Gemma (one module:
    /// `LlamaConfig::variant` tells them apart).
    Llama(llama::LlamaConfig),
}

impl Family {
    /// The family's implementation of the seam (the one place that lists the variants).
    pub(crate) fn model(&self) -> &dyn FamilyModel {
        match self {
            Family::Bert(c) => c,
            Family::DistilBert(c) => c,
            Family::Gpt2(c) => c,
            Family::Llama(c) => c,
        }
    }

    /// [`model`](Self::model), to override the config's values (`--dropout`).
    pub(crate) fn model_mut(&mut self) -> &mut dyn FamilyModel {
        match self {
            Family::Bert(c) => c,
            Family::DistilBert(c) => c,
            Family::Gpt2(c) => c,
            Family::Llama(c) => c,
        }
    }
}

/// The pad ids a model's derived graph inputs compare against (`FeedInfo::feed`, and the
/// ONNX export, which computes the same inputs from `input_ids`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pads {
    /// The word embedding's `padding_idx` (a `pad_token_id` that is one of its rows): the
    /// graph then takes the pad masks that keep that row's gradient zero.
    pub embedding: Option<i64>,
    /// The id a sequence classifier's last-token pooling skips: each row pools its rightmost
    /// other token (the last position when None).
    pub pooling: Option<i64>,
}

/// What a family does with its parsed config. `cfg` is the whole config (its `arch.head()`,
/// `num_labels`, problem type) whose `family` is `self`.
pub(crate) trait FamilyModel {
    /// HF's sizes, under each family's own field names.
    fn vocab_size(&self) -> usize;
    fn hidden_size(&self) -> usize;
    fn num_layers(&self) -> usize;
    fn num_heads(&self) -> usize;
    fn intermediate_size(&self) -> usize;
    fn max_positions(&self) -> usize;
    /// The longest sequence the model takes: its learned position table's rows (BERT, GPT-2), or
    /// none for rotary embeddings, which HF computes at any position (past
    /// `max_position_embeddings` only `dynamic` rope scaling changes anything).
    fn position_limit(&self) -> Option<usize> {
        Some(self.max_positions())
    }
    /// Whether the sequence-length tables (`fixed_inputs`) at T are those at the longest length
    /// cut to T — what the ONNX export's sliced tables assume. Not so for `dynamic` rope scaling,
    /// whose frequencies depend on T.
    fn tables_slice_by_length(&self) -> bool {
        true
    }
    fn initializer_range(&self) -> f64;
    fn layer_norm_eps(&self) -> f64;
    fn tie_word_embeddings(&self) -> bool;
    /// The MLP's activation (checked when the config was parsed).
    fn activation(&self) -> Activation;

    /// Sets every dropout probability of the model to `p` (`--dropout`).
    fn set_dropout(&mut self, p: f64);
    /// The config.json keys of those probabilities, overridden in the raw config too.
    fn dropout_keys(&self) -> &'static [&'static str];

    /// Every parameter of `cfg`, each once (tied weights once, as HF saves them), in HF's
    /// `named_parameters()` order with HF's initialisation.
    fn param_specs(&self, cfg: &ModelConfig) -> Vec<ParamSpec>;
    /// The pad ids the graph's derived inputs use.
    fn pads(&self) -> Pads;
    /// The window of the model's sliding-window attention layers (`kv_idx > q_idx − window`),
    /// whose mask the graph then takes as a derived input; None when no layer slides.
    fn sliding_window(&self) -> Option<usize> {
        None
    }
    /// Graph inputs that depend on the config and the sequence length only (a rotary
    /// embedding's cos/sin tables): (name, row-major values), fed as they are.
    fn fixed_inputs(&self, _seq_len: usize) -> Vec<(&'static str, Vec<f32>)> {
        Vec::new()
    }
    /// The sizes of `cfg`'s forward FLOP count.
    fn flop_count(&self, cfg: &ModelConfig) -> FlopCount;

    /// Writes `cfg`'s forward graph (HF's eager form, on the parameters `b` declared from
    /// [`param_specs`](Self::param_specs)) up to its head's logits, and returns them.
    fn build_logits(
        &self,
        b: &mut Builder,
        cfg: &ModelConfig,
        opts: &GraphOptions,
    ) -> BResult<TensorId>;

    /// `cfg`'s tch module (the `pytorch` baseline) over the variables `vars`.
    #[cfg(feature = "torch")]
    fn torch_model(
        &self,
        cfg: &ModelConfig,
        vars: &crate::torch::Vars,
    ) -> Box<dyn crate::torch::TorchLoss>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every built-in config's family is in the registry, with the names its config gives.
    #[test]
    fn every_family_is_registered() {
        for name in crate::spec::BUILTIN_NAMES {
            let cfg = crate::spec::builtin_config(name).unwrap();
            let info = FamilyInfo::by_model_type(cfg.arch.family().model_type).unwrap();
            assert!(std::ptr::eq(info, cfg.arch.family()), "{name}");
            assert_eq!(cfg.raw["model_type"], info.model_type, "{name}");
        }
    }
}
