//! BERT (transformers/models/bert): its config, parameters, FLOP count and pad ids here; its
//! engine graph in `graph`, its tch module in `torch`.

mod graph;
#[cfg(feature = "torch")]
mod torch;

use ortbench_engine::graph::TensorId;
use serde::Deserialize;
use serde_json::Value;

use super::{Family, FamilyInfo, FamilyModel, FlopCount, Head, Pads};
use crate::config::{hf_fields, parse_activation, Activation, ModelConfig};
use crate::graph::{BResult, Builder, GraphOptions};
use crate::params::{Init, Layout, ParamSpec};
use crate::ModelError;

/// The BERT family: BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification.
pub static INFO: FamilyInfo = FamilyInfo {
    name: "BERT",
    model_type: "bert",
    heads: &[
        (Head::MaskedLm, "BertForMaskedLM"),
        (Head::SequenceClassification, "BertForSequenceClassification"),
        (Head::TokenClassification, "BertForTokenClassification"),
    ],
    base_prefix: "bert",
    word_embedding: "bert.embeddings.word_embeddings.weight",
    untied_head: "cls.predictions.decoder.weight",
    // HF ties the decoder's bias to `cls.predictions.bias`; some checkpoints save it there.
    checkpoint_aliases: &[("cls.predictions.decoder.bias", "cls.predictions.bias")],
    parse,
};

fn default_true() -> bool {
    true
}
fn default_type_vocab() -> usize {
    2
}
fn default_abs() -> String {
    "absolute".into()
}

/// `BertConfig` (transformers/models/bert/configuration_bert.py): a field missing from
/// config.json takes HF 5.23's default.
#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    #[serde(default = "d::vocab")]
    pub vocab_size: usize,
    #[serde(default = "d::hidden")]
    pub hidden_size: usize,
    #[serde(default = "d::twelve")]
    pub num_hidden_layers: usize,
    #[serde(default = "d::twelve")]
    pub num_attention_heads: usize,
    #[serde(default = "d::intermediate")]
    pub intermediate_size: usize,
    #[serde(default = "d::act")]
    pub hidden_act: String,
    #[serde(default = "d::dropout")]
    pub hidden_dropout_prob: f64,
    #[serde(default = "d::dropout")]
    pub attention_probs_dropout_prob: f64,
    #[serde(default = "d::positions")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "d::init")]
    pub initializer_range: f64,
    #[serde(default = "d::eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "d::pad")]
    pub pad_token_id: Option<i64>,
    #[serde(default = "default_abs")]
    pub position_embedding_type: String,
    #[serde(default)]
    pub classifier_dropout: Option<f64>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

/// HF 5.23's `BertConfig` defaults.
mod d {
    pub fn vocab() -> usize {
        30522
    }
    pub fn hidden() -> usize {
        768
    }
    pub fn twelve() -> usize {
        12
    }
    pub fn intermediate() -> usize {
        3072
    }
    pub fn act() -> String {
        "gelu".into()
    }
    pub fn dropout() -> f64 {
        0.1
    }
    pub fn positions() -> usize {
        512
    }
    pub fn init() -> f64 {
        0.02
    }
    pub fn eps() -> f64 {
        1e-12
    }
    pub fn pad() -> Option<i64> {
        Some(0)
    }
}

impl BertConfig {
    /// `nn.Embedding(padding_idx=pad_token_id)` of BertEmbeddings: the pad id when it is a row
    /// of the word embedding (that row gets no gradient from the lookup and is initialised 0).
    pub fn padding_idx(&self) -> Option<i64> {
        self.pad_token_id.filter(|&p| p >= 0 && (p as usize) < self.vocab_size)
    }
}

/// [`FamilyInfo::parse`]: the fields, the activation, absolute positions only.
fn parse(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    let c: BertConfig = hf_fields(raw, origin)?;
    parse_activation(&c.hidden_act)?;
    if c.position_embedding_type != "absolute" {
        return Err(ModelError::Unsupported(format!(
            "position_embedding_type '{}' (only 'absolute')",
            c.position_embedding_type
        )));
    }
    Ok(Family::Bert(c))
}

impl FamilyModel for BertConfig {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
    fn hidden_size(&self) -> usize {
        self.hidden_size
    }
    fn num_layers(&self) -> usize {
        self.num_hidden_layers
    }
    fn num_heads(&self) -> usize {
        self.num_attention_heads
    }
    fn intermediate_size(&self) -> usize {
        self.intermediate_size
    }
    fn max_positions(&self) -> usize {
        self.max_position_embeddings
    }
    fn initializer_range(&self) -> f64 {
        self.initializer_range
    }
    fn layer_norm_eps(&self) -> f64 {
        self.layer_norm_eps
    }
    fn tie_word_embeddings(&self) -> bool {
        self.tie_word_embeddings
    }
    fn activation(&self) -> Activation {
        parse_activation(&self.hidden_act).expect("validated at parse time")
    }

    fn set_dropout(&mut self, p: f64) {
        self.hidden_dropout_prob = p;
        self.attention_probs_dropout_prob = p;
        self.classifier_dropout = Some(p);
    }
    fn dropout_keys(&self) -> &'static [&'static str] {
        &["hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"]
    }

    fn param_specs(&self, cfg: &ModelConfig) -> Vec<ParamSpec> {
        let std = self.initializer_range;
        let mut l = Layout::new(std);
        let h = self.hidden_size;
        let word_init = match self.padding_idx() {
            Some(row) => Init::NormalPadRow { std, row: row as usize },
            None => Init::Normal { std },
        };
        l.push(INFO.word_embedding.into(), &[self.vocab_size, h], word_init, true);
        l.weight(
            "bert.embeddings.position_embeddings.weight".into(),
            &[self.max_position_embeddings, h],
        );
        l.weight("bert.embeddings.token_type_embeddings.weight".into(), &[self.type_vocab_size, h]);
        l.layer_norm("bert.embeddings.LayerNorm", h);
        for i in 0..self.num_hidden_layers {
            let p = format!("bert.encoder.layer.{i}");
            l.linear(&format!("{p}.attention.self.query"), h, h);
            l.linear(&format!("{p}.attention.self.key"), h, h);
            l.linear(&format!("{p}.attention.self.value"), h, h);
            l.linear(&format!("{p}.attention.output.dense"), h, h);
            l.layer_norm(&format!("{p}.attention.output.LayerNorm"), h);
            l.linear(&format!("{p}.intermediate.dense"), self.intermediate_size, h);
            l.linear(&format!("{p}.output.dense"), h, self.intermediate_size);
            l.layer_norm(&format!("{p}.output.LayerNorm"), h);
        }
        match cfg.arch.head() {
            Head::MaskedLm => {
                l.push("cls.predictions.bias".into(), &[self.vocab_size], Init::Zeros, false);
                l.linear("cls.predictions.transform.dense", h, h);
                l.layer_norm("cls.predictions.transform.LayerNorm", h);
                if !self.tie_word_embeddings {
                    l.weight(INFO.untied_head.into(), &[self.vocab_size, h]);
                }
            }
            // BertForTokenClassification: BertModel(add_pooling_layer=False) + classifier.
            Head::TokenClassification => l.linear("classifier", cfg.num_labels(), h),
            Head::SequenceClassification => {
                l.linear("bert.pooler.dense", h, h);
                l.linear("classifier", cfg.num_labels(), h);
            }
            Head::CausalLm => unreachable!("BERT lists no causal-lm head"),
        }
        l.into_specs()
    }

    fn pads(&self) -> Pads {
        Pads { embedding: self.padding_idx(), pooling: None }
    }

    fn flop_count(&self, cfg: &ModelConfig) -> FlopCount {
        let head = cfg.arch.head();
        FlopCount {
            layers: self.num_hidden_layers,
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            mlp_gemms: 2,
            q_heads: self.num_attention_heads,
            kv_heads: self.num_attention_heads,
            head_dim: self.hidden_size / self.num_attention_heads,
            vocab: self.vocab_size,
            head,
            num_labels: cfg.num_labels(),
            // The MLM head's transform; the sequence classifier's pooler.
            head_dense: match head {
                Head::MaskedLm | Head::SequenceClassification => 1,
                Head::TokenClassification | Head::CausalLm => 0,
            },
        }
    }

    fn build_logits(
        &self,
        b: &mut Builder,
        cfg: &ModelConfig,
        opts: &GraphOptions,
    ) -> BResult<TensorId> {
        match cfg.arch.head() {
            Head::MaskedLm => graph::bert_for_masked_lm(b, self, cfg, opts),
            Head::SequenceClassification => {
                graph::bert_for_sequence_classification(b, self, cfg, opts)
            }
            Head::TokenClassification => graph::bert_for_token_classification(b, self, cfg, opts),
            Head::CausalLm => unreachable!("BERT lists no causal-lm head"),
        }
    }

    #[cfg(feature = "torch")]
    fn torch_model(
        &self,
        cfg: &ModelConfig,
        vars: &crate::torch::Vars,
    ) -> Box<dyn crate::torch::TorchLoss> {
        match cfg.arch.head() {
            Head::MaskedLm => Box::new(torch::BertForMaskedLM::new(self, cfg, vars)),
            Head::SequenceClassification => {
                Box::new(torch::BertForSequenceClassification::new(self, cfg, vars))
            }
            Head::TokenClassification => {
                Box::new(torch::BertForTokenClassification::new(self, cfg, vars))
            }
            Head::CausalLm => unreachable!("BERT lists no causal-lm head"),
        }
    }
}
