//! HF `config.json`: the architecture it names, looked up among the families
//! ([`crate::family::FAMILIES`]), whose module reads its fields (mirrored field by field, as
//! candle's model files do, so that a hub or local config loads unchanged); and what every
//! family shares — `num_labels`, `problem_type`, the activation names, size checks.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::family::{Architecture, Family, FamilyInfo, FlopCount, Head};
use crate::ModelError;

/// HF's `config.problem_type` of a sequence classifier: the loss it trains with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemType {
    /// Cross-entropy over `num_labels` classes, one int label per row.
    SingleLabel,
    /// BCEWithLogits over `num_labels` independent 0/1 targets per row.
    MultiLabel,
    /// MSE against one float target per row (`num_labels = 1`).
    Regression,
}

impl ProblemType {
    pub fn hf_name(self) -> &'static str {
        match self {
            ProblemType::SingleLabel => "single_label_classification",
            ProblemType::MultiLabel => "multi_label_classification",
            ProblemType::Regression => "regression",
        }
    }
}

/// A parsed, validated model configuration.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub family: Family,
    /// The config.json as read, written back next to saved weights.
    pub raw: Value,
}

/// The activation functions we implement, by HF's ACT2FN names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `gelu`: exact, 0.5·x·(1 + erf(x/√2)).
    GeluErf,
    /// `gelu_new` / `gelu_pytorch_tanh`: the tanh approximation.
    GeluTanh,
    /// `silu` / `swish`: x·σ(x) (nn.SiLU).
    Silu,
    /// `relu`: max(x, 0) (nn.ReLU; DistilBERT's other `activation`).
    Relu,
}

/// HF's `ACT2FN[name]`, among those we implement (a family checks its config's at parse time).
pub(crate) fn parse_activation(name: &str) -> Result<Activation, ModelError> {
    match name {
        "gelu" => Ok(Activation::GeluErf),
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::GeluTanh),
        "silu" | "swish" => Ok(Activation::Silu),
        "relu" => Ok(Activation::Relu),
        other => Err(ModelError::Unsupported(format!(
            "activation '{other}' (supported: gelu, gelu_new, gelu_pytorch_tanh, silu, relu)"
        ))),
    }
}

/// A family's config struct from a config.json (its fields mirror HF's config class).
pub(crate) fn hf_fields<T: DeserializeOwned>(raw: &Value, origin: &str) -> Result<T, ModelError> {
    serde_json::from_value(raw.clone()).map_err(|e| ModelError::BadConfig(format!("{origin}: {e}")))
}

impl ModelConfig {
    /// Parses a `config.json` text. `origin` names where it came from, for error messages.
    pub fn from_json_str(text: &str, origin: &str) -> Result<Self, ModelError> {
        let raw: Value = serde_json::from_str(text)
            .map_err(|e| ModelError::BadConfig(format!("{origin}: not valid JSON: {e}")))?;
        Self::from_value(raw, origin)
    }

    pub fn from_value(raw: Value, origin: &str) -> Result<Self, ModelError> {
        let archs: Vec<String> = raw
            .get("architectures")
            .and_then(|a| serde_json::from_value(a.clone()).ok())
            .unwrap_or_default();
        let model_type = raw.get("model_type").and_then(Value::as_str).unwrap_or("");
        let arch = match archs.first() {
            Some(name) => Architecture::from_hf_name(name).ok_or_else(|| {
                ModelError::UnsupportedArchitecture(name.clone(), origin.to_string())
            })?,
            // HF's default class of the model_type: the family's first head.
            None => match FamilyInfo::by_model_type(model_type) {
                Some(family) => Architecture::default_of(family),
                None => {
                    let what = if model_type.is_empty() {
                        "no architectures/model_type"
                    } else {
                        model_type
                    };
                    return Err(ModelError::UnsupportedArchitecture(
                        what.to_string(),
                        origin.to_string(),
                    ));
                }
            },
        };
        let family = (arch.family().parse)(&raw, origin)?;
        let cfg = ModelConfig { arch, family, raw };
        cfg.validate(origin)?;
        if arch.is_classifier() {
            cfg.problem_type().map_err(|e| ModelError::BadConfig(format!("{origin}: {e}")))?;
        }
        if arch.head() == Head::TokenClassification && cfg.num_labels() < 2 {
            return Err(ModelError::BadConfig(format!(
                "{origin}: {} needs num_labels >= 2",
                arch.hf_name()
            )));
        }
        Ok(cfg)
    }

    /// HF's `num_labels`: the config's, else the size of `id2label`, else 2.
    pub fn num_labels(&self) -> usize {
        self.raw
            .get("num_labels")
            .and_then(Value::as_u64)
            .map(|n| n as usize)
            .or_else(|| self.raw.get("id2label").and_then(Value::as_object).map(|m| m.len()))
            .unwrap_or(2)
    }

    /// A classifier's loss: `problem_type` when the config names it, else what HF infers
    /// from int labels — regression when `num_labels == 1`, single-label otherwise (HF takes
    /// multi-label only from float labels; here the config must say so).
    pub fn problem_type(&self) -> Result<ProblemType, String> {
        let n = self.num_labels();
        let p = match self.raw.get("problem_type").and_then(Value::as_str) {
            None => {
                if n == 1 {
                    ProblemType::Regression
                } else {
                    ProblemType::SingleLabel
                }
            }
            Some("regression") => ProblemType::Regression,
            Some("single_label_classification") => ProblemType::SingleLabel,
            Some("multi_label_classification") => ProblemType::MultiLabel,
            Some(other) => {
                return Err(format!(
                    "problem_type '{other}' (HF's are regression, single_label_classification, multi_label_classification)"
                ))
            }
        };
        match (p, n) {
            (_, 0) => Err("num_labels must be at least 1".into()),
            (ProblemType::Regression, 1) => Ok(p),
            (ProblemType::Regression, n) => Err(format!("regression with num_labels = {n}: ortbench trains one target per row (num_labels = 1)")),
            (_, 1) => Err(format!("{} needs num_labels >= 2", p.hf_name())),
            _ => Ok(p),
        }
    }

    /// The same checkpoint with another head (`--task`), as HF's AutoModelFor… loads it: the
    /// head's weights are then newly initialised, the base model's are kept.
    pub fn with_architecture(
        &self,
        arch: Architecture,
        origin: &str,
    ) -> Result<ModelConfig, ModelError> {
        let mut raw = self.raw.clone();
        raw["architectures"] = serde_json::json!([arch.hf_name()]);
        ModelConfig::from_value(raw, origin)
    }

    fn validate(&self, origin: &str) -> Result<(), ModelError> {
        let (h, heads) = (self.hidden_size(), self.num_heads());
        if h == 0
            || heads == 0
            || self.num_layers() == 0
            || self.vocab_size() == 0
            || self.max_positions() == 0
        {
            return Err(ModelError::BadConfig(format!("{origin}: sizes must be positive")));
        }
        if h % heads != 0 {
            return Err(ModelError::BadConfig(format!(
                "{origin}: hidden size {h} is not divisible by {heads} heads"
            )));
        }
        Ok(())
    }

    pub fn vocab_size(&self) -> usize {
        self.family.model().vocab_size()
    }
    pub fn hidden_size(&self) -> usize {
        self.family.model().hidden_size()
    }
    pub fn num_layers(&self) -> usize {
        self.family.model().num_layers()
    }
    pub fn num_heads(&self) -> usize {
        self.family.model().num_heads()
    }
    pub fn intermediate_size(&self) -> usize {
        self.family.model().intermediate_size()
    }
    pub fn max_positions(&self) -> usize {
        self.family.model().max_positions()
    }
    /// See the family trait's `position_limit`.
    pub fn position_limit(&self) -> Option<usize> {
        self.family.model().position_limit()
    }
    pub fn initializer_range(&self) -> f64 {
        self.family.model().initializer_range()
    }
    pub fn layer_norm_eps(&self) -> f64 {
        self.family.model().layer_norm_eps()
    }
    pub fn tie_word_embeddings(&self) -> bool {
        self.family.model().tie_word_embeddings()
    }
    pub fn activation(&self) -> Activation {
        self.family.model().activation()
    }

    /// The sizes of this model's forward matmul FLOP count (MFU), as its family states them.
    pub fn flop_count(&self) -> FlopCount {
        self.family.model().flop_count(self)
    }

    /// Overrides every dropout probability of the model (`--dropout`), in the raw config too.
    pub fn set_dropout(&mut self, p: f64) {
        let family = self.family.model_mut();
        family.set_dropout(p);
        for key in family.dropout_keys() {
            if let Some(v) = self.raw.get_mut(*key) {
                *v = serde_json::json!(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_configs_parse() {
        for name in crate::spec::BUILTIN_NAMES {
            let c = crate::spec::builtin_config(name).unwrap();
            assert!(c.vocab_size() > 0, "{name}");
        }
    }

    #[test]
    fn architecture_from_model_type_when_absent() {
        let c = ModelConfig::from_json_str(
            r#"{"model_type":"gpt2","vocab_size":10,"n_positions":8,"n_embd":8,"n_layer":1,"n_head":2,
                "activation_function":"gelu_new","resid_pdrop":0,"embd_pdrop":0,"attn_pdrop":0,
                "layer_norm_epsilon":1e-5,"initializer_range":0.02}"#,
            "test",
        )
        .unwrap();
        assert_eq!(c.arch.hf_name(), "GPT2LMHeadModel");
    }

    #[test]
    fn unsupported_architecture_lists_supported() {
        let e = ModelConfig::from_json_str(
            r#"{"architectures":["FalconForCausalLM"]}"#,
            "x/config.json",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("FalconForCausalLM")
                && e.contains("GPT2LMHeadModel")
                && e.contains("Qwen3ForSequenceClassification"),
            "{e}"
        );
        let e = ModelConfig::from_json_str(r#"{"model_type":"t5"}"#, "c").unwrap_err().to_string();
        assert!(e.contains("t5") && e.contains("BertForMaskedLM"), "{e}");
    }

    #[test]
    fn dropout_override_reaches_every_probability() {
        let mut c = crate::spec::builtin_config("tiny-bert").unwrap();
        c.set_dropout(0.0);
        match &c.family {
            Family::Bert(b) => {
                assert_eq!(b.hidden_dropout_prob, 0.0);
                assert_eq!(b.attention_probs_dropout_prob, 0.0);
            }
            _ => unreachable!(),
        }
    }
}
