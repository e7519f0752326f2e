//! HF `config.json` for the supported architectures, mirrored field by field (as candle's
//! model files do) so that a hub or local config loads unchanged.

use serde::Deserialize;
use serde_json::Value;

use crate::ModelError;

/// Architectures the baseline and the engine implement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    Gpt2LMHeadModel,
    Gpt2ForSequenceClassification,
}

impl Architecture {
    pub const SUPPORTED: &'static [&'static str] = &[
        "BertForMaskedLM",
        "BertForSequenceClassification",
        "BertForTokenClassification",
        "GPT2LMHeadModel",
        "GPT2ForSequenceClassification",
    ];

    pub fn hf_name(self) -> &'static str {
        match self {
            Architecture::BertForMaskedLM => "BertForMaskedLM",
            Architecture::BertForSequenceClassification => "BertForSequenceClassification",
            Architecture::BertForTokenClassification => "BertForTokenClassification",
            Architecture::Gpt2LMHeadModel => "GPT2LMHeadModel",
            Architecture::Gpt2ForSequenceClassification => "GPT2ForSequenceClassification",
        }
    }

    /// A sequence classifier (one label, or `num_labels` targets, per row).
    pub fn is_classifier(self) -> bool {
        matches!(
            self,
            Architecture::BertForSequenceClassification
                | Architecture::Gpt2ForSequenceClassification
        )
    }

    /// The architecture of `family` for `task` (`--task`): what HF's AutoModelFor… builds.
    pub fn for_task(gpt2: bool, task: &str) -> Option<Self> {
        Some(match (gpt2, task) {
            (false, "masked-lm") => Architecture::BertForMaskedLM,
            (false, "sequence-classification") => Architecture::BertForSequenceClassification,
            (false, "token-classification") => Architecture::BertForTokenClassification,
            (true, "causal-lm") => Architecture::Gpt2LMHeadModel,
            (true, "sequence-classification") => Architecture::Gpt2ForSequenceClassification,
            _ => return None,
        })
    }

    fn from_hf_name(name: &str) -> Option<Self> {
        match name {
            "BertForMaskedLM" => Some(Architecture::BertForMaskedLM),
            "BertForSequenceClassification" => Some(Architecture::BertForSequenceClassification),
            "BertForTokenClassification" => Some(Architecture::BertForTokenClassification),
            "GPT2LMHeadModel" => Some(Architecture::Gpt2LMHeadModel),
            "GPT2ForSequenceClassification" => Some(Architecture::Gpt2ForSequenceClassification),
            _ => None,
        }
    }

    /// The prefix HF gives the base model's parameters (`base_model_prefix`).
    pub fn base_prefix(self) -> &'static str {
        match self {
            Architecture::BertForMaskedLM
            | Architecture::BertForSequenceClassification
            | Architecture::BertForTokenClassification => "bert",
            Architecture::Gpt2LMHeadModel | Architecture::Gpt2ForSequenceClassification => {
                "transformer"
            }
        }
    }
}

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

fn default_true() -> bool {
    true
}
fn default_type_vocab() -> usize {
    2
}
fn default_abs() -> String {
    "absolute".into()
}

/// `BertConfig` (transformers/models/bert/configuration_bert.py).
#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: String,
    pub hidden_dropout_prob: f64,
    pub attention_probs_dropout_prob: f64,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    pub initializer_range: f64,
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    #[serde(default = "default_abs")]
    pub position_embedding_type: String,
    #[serde(default)]
    pub classifier_dropout: Option<f64>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

/// `GPT2Config` (transformers/models/gpt2/configuration_gpt2.py).
#[derive(Clone, Debug, Deserialize)]
pub struct Gpt2Config {
    pub vocab_size: usize,
    pub n_positions: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    #[serde(default)]
    pub n_inner: Option<usize>,
    pub activation_function: String,
    pub resid_pdrop: f64,
    pub embd_pdrop: f64,
    pub attn_pdrop: f64,
    pub layer_norm_epsilon: f64,
    pub initializer_range: f64,
    #[serde(default = "default_true")]
    pub scale_attn_weights: bool,
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    #[serde(default)]
    pub reorder_and_upcast_attn: bool,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// GPT2ForSequenceClassification pools the last token that is not `pad_token_id`.
    #[serde(default)]
    pub pad_token_id: Option<i64>,
}

impl Gpt2Config {
    pub fn inner(&self) -> usize {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }
}

#[derive(Clone, Debug)]
pub enum Family {
    Bert(BertConfig),
    Gpt2(Gpt2Config),
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
}

fn activation(name: &str) -> Result<Activation, ModelError> {
    match name {
        "gelu" => Ok(Activation::GeluErf),
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::GeluTanh),
        other => Err(ModelError::Unsupported(format!(
            "activation '{other}' (supported: gelu, gelu_new, gelu_pytorch_tanh)"
        ))),
    }
}

impl ModelConfig {
    /// Parses a `config.json` text. `origin` names where it came from, for error messages.
    pub fn from_json_str(text: &str, origin: &str) -> Result<Self, ModelError> {
        let raw: Value = serde_json::from_str(text)
            .map_err(|e| ModelError::BadConfig(format!("{origin}: not valid JSON: {e}")))?;
        Self::from_value(raw, origin)
    }

    pub fn from_value(raw: Value, origin: &str) -> Result<Self, ModelError> {
        let bad = |e: serde_json::Error| ModelError::BadConfig(format!("{origin}: {e}"));
        let archs: Vec<String> = raw
            .get("architectures")
            .and_then(|a| serde_json::from_value(a.clone()).ok())
            .unwrap_or_default();
        let model_type = raw.get("model_type").and_then(Value::as_str).unwrap_or("");
        let arch = match archs.first() {
            Some(name) => Architecture::from_hf_name(name).ok_or_else(|| {
                ModelError::UnsupportedArchitecture(name.clone(), origin.to_string())
            })?,
            None => match model_type {
                "bert" => Architecture::BertForMaskedLM,
                "gpt2" => Architecture::Gpt2LMHeadModel,
                other => {
                    let what = if other.is_empty() { "no architectures/model_type" } else { other };
                    return Err(ModelError::UnsupportedArchitecture(
                        what.to_string(),
                        origin.to_string(),
                    ));
                }
            },
        };
        let family = match arch {
            Architecture::BertForMaskedLM
            | Architecture::BertForSequenceClassification
            | Architecture::BertForTokenClassification => {
                let c: BertConfig = serde_json::from_value(raw.clone()).map_err(bad)?;
                activation(&c.hidden_act)?;
                if c.position_embedding_type != "absolute" {
                    return Err(ModelError::Unsupported(format!(
                        "position_embedding_type '{}' (only 'absolute')",
                        c.position_embedding_type
                    )));
                }
                Family::Bert(c)
            }
            Architecture::Gpt2LMHeadModel | Architecture::Gpt2ForSequenceClassification => {
                let c: Gpt2Config = serde_json::from_value(raw.clone()).map_err(bad)?;
                activation(&c.activation_function)?;
                if c.scale_attn_by_inverse_layer_idx
                    || c.reorder_and_upcast_attn
                    || !c.scale_attn_weights
                {
                    return Err(ModelError::Unsupported(
                        "GPT-2 attention variants (scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn, scale_attn_weights=false)".into(),
                    ));
                }
                Family::Gpt2(c)
            }
        };
        let cfg = ModelConfig { arch, family, raw };
        cfg.validate(origin)?;
        if arch.is_classifier() {
            cfg.problem_type().map_err(|e| ModelError::BadConfig(format!("{origin}: {e}")))?;
        }
        if arch == Architecture::BertForTokenClassification && cfg.num_labels() < 2 {
            return Err(ModelError::BadConfig(format!(
                "{origin}: BertForTokenClassification needs num_labels >= 2"
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
        match &self.family {
            Family::Bert(c) => c.vocab_size,
            Family::Gpt2(c) => c.vocab_size,
        }
    }
    pub fn hidden_size(&self) -> usize {
        match &self.family {
            Family::Bert(c) => c.hidden_size,
            Family::Gpt2(c) => c.n_embd,
        }
    }
    pub fn num_layers(&self) -> usize {
        match &self.family {
            Family::Bert(c) => c.num_hidden_layers,
            Family::Gpt2(c) => c.n_layer,
        }
    }
    pub fn num_heads(&self) -> usize {
        match &self.family {
            Family::Bert(c) => c.num_attention_heads,
            Family::Gpt2(c) => c.n_head,
        }
    }
    pub fn intermediate_size(&self) -> usize {
        match &self.family {
            Family::Bert(c) => c.intermediate_size,
            Family::Gpt2(c) => c.inner(),
        }
    }
    pub fn max_positions(&self) -> usize {
        match &self.family {
            Family::Bert(c) => c.max_position_embeddings,
            Family::Gpt2(c) => c.n_positions,
        }
    }
    pub fn initializer_range(&self) -> f64 {
        match &self.family {
            Family::Bert(c) => c.initializer_range,
            Family::Gpt2(c) => c.initializer_range,
        }
    }
    pub fn layer_norm_eps(&self) -> f64 {
        match &self.family {
            Family::Bert(c) => c.layer_norm_eps,
            Family::Gpt2(c) => c.layer_norm_epsilon,
        }
    }
    pub fn tie_word_embeddings(&self) -> bool {
        match &self.family {
            Family::Bert(c) => c.tie_word_embeddings,
            Family::Gpt2(c) => c.tie_word_embeddings,
        }
    }
    pub fn activation(&self) -> Activation {
        let name = match &self.family {
            Family::Bert(c) => &c.hidden_act,
            Family::Gpt2(c) => &c.activation_function,
        };
        activation(name).expect("validated at parse time")
    }

    /// Overrides every dropout probability of the model (`--dropout`).
    pub fn set_dropout(&mut self, p: f64) {
        match &mut self.family {
            Family::Bert(c) => {
                c.hidden_dropout_prob = p;
                c.attention_probs_dropout_prob = p;
                c.classifier_dropout = Some(p);
            }
            Family::Gpt2(c) => {
                c.resid_pdrop = p;
                c.embd_pdrop = p;
                c.attn_pdrop = p;
            }
        }
        for key in [
            "hidden_dropout_prob",
            "attention_probs_dropout_prob",
            "classifier_dropout",
            "resid_pdrop",
            "embd_pdrop",
            "attn_pdrop",
        ] {
            if let Some(v) = self.raw.get_mut(key) {
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
        assert_eq!(c.arch, Architecture::Gpt2LMHeadModel);
    }

    #[test]
    fn unsupported_architecture_lists_supported() {
        let e = ModelConfig::from_json_str(
            r#"{"architectures":["LlamaForCausalLM"]}"#,
            "x/config.json",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("LlamaForCausalLM") && e.contains("GPT2LMHeadModel"), "{e}");
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
