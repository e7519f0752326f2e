//! DistilBERT (transformers/models/distilbert): BERT's post-LN encoder layer under its own names
//! (`q_lin`, `sa_layer_norm`, `ffn.lin1`, …), no token types, LayerNorm eps fixed at 1e-12, no
//! dropout on the attention's output projection, its MLM head (`vocab_transform`, the config's
//! activation, `vocab_layer_norm`, `vocab_projector`) and its classifier (`pre_classifier`,
//! ReLU). Its config, parameters and FLOP count here; the engine graph in `graph`, the tch
//! module in `torch`.

mod graph;
#[cfg(feature = "torch")]
mod torch;

use ortbench_engine::graph::TensorId;
use serde::Deserialize;
use serde_json::Value;

use super::bert::{EncoderLayer, EncoderLayerNames, MlmHead};
use super::{Family, FamilyInfo, FamilyModel, FlopCount, Head, Pads};
use crate::config::{hf_fields, parse_activation, Activation, ModelConfig};
use crate::graph::{BResult, Builder, GraphOptions};
use crate::params::{Init, Layout, ParamSpec};
use crate::ModelError;

/// DistilBertForMaskedLM, DistilBertForSequenceClassification, DistilBertForTokenClassification.
pub static INFO: FamilyInfo = FamilyInfo {
    name: "DistilBERT",
    model_type: "distilbert",
    heads: &[
        (Head::MaskedLm, "DistilBertForMaskedLM"),
        (Head::SequenceClassification, "DistilBertForSequenceClassification"),
        (Head::TokenClassification, "DistilBertForTokenClassification"),
    ],
    base_prefix: "distilbert",
    word_embedding: "distilbert.embeddings.word_embeddings.weight",
    untied_head: "vocab_projector.weight",
    checkpoint_aliases: &[],
    parse,
};

/// TransformerBlock's names.
const LAYER: EncoderLayerNames = EncoderLayerNames {
    query: "attention.q_lin",
    key: "attention.k_lin",
    value: "attention.v_lin",
    attn_out: "attention.out_lin",
    attn_norm: "sa_layer_norm",
    up: "ffn.lin1",
    down: "ffn.lin2",
    out_norm: "output_layer_norm",
};

/// Every LayerNorm of DistilBERT: `nn.LayerNorm(dim, eps=1e-12)`, not a config field.
pub(crate) const LAYER_NORM_EPS: f64 = 1e-12;

/// `DistilBertConfig` (transformers/models/distilbert/configuration_distilbert.py): a field
/// missing from config.json takes HF 5.23's default.
#[derive(Clone, Debug, Deserialize)]
pub struct DistilBertConfig {
    #[serde(default = "d::vocab")]
    pub vocab_size: usize,
    #[serde(default = "d::positions")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub sinusoidal_pos_embds: bool,
    #[serde(default = "d::layers")]
    pub n_layers: usize,
    #[serde(default = "d::heads")]
    pub n_heads: usize,
    #[serde(default = "d::dim")]
    pub dim: usize,
    #[serde(default = "d::hidden_dim")]
    pub hidden_dim: usize,
    #[serde(default = "d::dropout")]
    pub dropout: f64,
    #[serde(default = "d::dropout")]
    pub attention_dropout: f64,
    #[serde(default = "d::act")]
    pub activation: String,
    #[serde(default = "d::init")]
    pub initializer_range: f64,
    #[serde(default = "d::dropout")]
    pub qa_dropout: f64,
    #[serde(default = "d::seq_classif_dropout")]
    pub seq_classif_dropout: f64,
    #[serde(default = "d::pad")]
    pub pad_token_id: Option<i64>,
    #[serde(default = "d::tied")]
    pub tie_word_embeddings: bool,
}

/// HF 5.23's `DistilBertConfig` defaults.
mod d {
    pub fn vocab() -> usize {
        30522
    }
    pub fn positions() -> usize {
        512
    }
    pub fn layers() -> usize {
        6
    }
    pub fn heads() -> usize {
        12
    }
    pub fn dim() -> usize {
        768
    }
    pub fn hidden_dim() -> usize {
        4 * 768
    }
    pub fn dropout() -> f64 {
        0.1
    }
    pub fn seq_classif_dropout() -> f64 {
        0.2
    }
    pub fn act() -> String {
        "gelu".into()
    }
    pub fn init() -> f64 {
        0.02
    }
    pub fn pad() -> Option<i64> {
        Some(0)
    }
    pub fn tied() -> bool {
        true
    }
}

impl DistilBertConfig {
    /// The word embedding's `padding_idx` when the pad id is one of its rows.
    pub fn padding_idx(&self) -> Option<i64> {
        self.pad_token_id.filter(|&p| p >= 0 && (p as usize) < self.vocab_size)
    }

    /// DistilBertForMaskedLM's head: vocab_transform, the config's activation,
    /// vocab_layer_norm, vocab_projector (its weight the word embedding unless untied).
    pub(crate) fn mlm_head(&self) -> MlmHead {
        MlmHead {
            dense: "vocab_transform",
            norm: "vocab_layer_norm",
            bias: "vocab_projector.bias",
            decoder: if self.tie_word_embeddings { INFO.word_embedding } else { INFO.untied_head },
            act: self.activation(),
            eps: LAYER_NORM_EPS,
        }
    }

    /// TransformerBlock's settings: no dropout on the attention's output projection.
    pub(crate) fn encoder_layer(&self) -> EncoderLayer {
        EncoderLayer {
            names: LAYER,
            heads: self.n_heads,
            eps: LAYER_NORM_EPS,
            act: self.activation(),
            attn_dropout: self.attention_dropout,
            attn_out_dropout: 0.0,
            ffn_dropout: self.dropout,
        }
    }
}

/// [`FamilyInfo::parse`]: the fields and the activation; sinusoidal position embeddings (a
/// fixed init HF writes over the table) are refused.
fn parse(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    let c: DistilBertConfig = hf_fields(raw, origin)?;
    parse_activation(&c.activation)?;
    if c.sinusoidal_pos_embds {
        return Err(ModelError::Unsupported(format!(
            "{origin}: DistilBERT with sinusoidal_pos_embds (only learned position embeddings)"
        )));
    }
    if !c.dim.is_multiple_of(c.n_heads) {
        return Err(ModelError::BadConfig(format!(
            "{origin}: n_heads {} must divide dim {}",
            c.n_heads, c.dim
        )));
    }
    Ok(Family::DistilBert(c))
}

impl FamilyModel for DistilBertConfig {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
    fn hidden_size(&self) -> usize {
        self.dim
    }
    fn num_layers(&self) -> usize {
        self.n_layers
    }
    fn num_heads(&self) -> usize {
        self.n_heads
    }
    fn intermediate_size(&self) -> usize {
        self.hidden_dim
    }
    fn max_positions(&self) -> usize {
        self.max_position_embeddings
    }
    fn initializer_range(&self) -> f64 {
        self.initializer_range
    }
    fn layer_norm_eps(&self) -> f64 {
        LAYER_NORM_EPS
    }
    fn tie_word_embeddings(&self) -> bool {
        self.tie_word_embeddings
    }
    fn activation(&self) -> Activation {
        parse_activation(&self.activation).expect("validated at parse time")
    }

    fn set_dropout(&mut self, p: f64) {
        self.dropout = p;
        self.attention_dropout = p;
        self.qa_dropout = p;
        self.seq_classif_dropout = p;
    }
    fn dropout_keys(&self) -> &'static [&'static str] {
        &["dropout", "attention_dropout", "qa_dropout", "seq_classif_dropout"]
    }

    fn param_specs(&self, cfg: &ModelConfig) -> Vec<ParamSpec> {
        let std = self.initializer_range;
        let mut l = Layout::new(std);
        let h = self.dim;
        let word_init = match self.padding_idx() {
            Some(row) => Init::NormalPadRow { std, row: row as usize },
            None => Init::Normal { std },
        };
        l.push(INFO.word_embedding.into(), &[self.vocab_size, h], word_init, true);
        l.weight(
            "distilbert.embeddings.position_embeddings.weight".into(),
            &[self.max_position_embeddings, h],
        );
        l.layer_norm("distilbert.embeddings.LayerNorm", h);
        for i in 0..self.n_layers {
            LAYER.push_specs(
                &mut l,
                &format!("distilbert.transformer.layer.{i}"),
                h,
                self.hidden_dim,
            );
        }
        match cfg.arch.head() {
            // vocab_projector's weight is the word embedding unless untied; its bias is its own.
            Head::MaskedLm => {
                l.linear("vocab_transform", h, h);
                l.layer_norm("vocab_layer_norm", h);
                if !self.tie_word_embeddings {
                    l.weight(INFO.untied_head.into(), &[self.vocab_size, h]);
                }
                l.push("vocab_projector.bias".into(), &[self.vocab_size], Init::Zeros, false);
            }
            Head::SequenceClassification => {
                l.linear("pre_classifier", h, h);
                l.linear("classifier", cfg.num_labels(), h);
            }
            Head::TokenClassification => l.linear("classifier", cfg.num_labels(), h),
            Head::CausalLm => unreachable!("DistilBERT lists no causal-lm head"),
        }
        l.into_specs()
    }

    fn pads(&self) -> Pads {
        Pads { embedding: self.padding_idx(), pooling: None }
    }

    fn flop_count(&self, cfg: &ModelConfig) -> FlopCount {
        let head = cfg.arch.head();
        FlopCount {
            layers: self.n_layers,
            hidden: self.dim,
            intermediate: self.hidden_dim,
            mlp_gemms: 2,
            q_heads: self.n_heads,
            kv_heads: self.n_heads,
            head_dim: self.dim / self.n_heads,
            vocab: self.vocab_size,
            head,
            num_labels: cfg.num_labels(),
            // vocab_transform; pre_classifier.
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
        graph::logits(b, self, cfg, opts)
    }

    #[cfg(feature = "torch")]
    fn torch_model(
        &self,
        cfg: &ModelConfig,
        vars: &crate::torch::Vars,
    ) -> Box<dyn crate::torch::TorchLoss> {
        Box::new(torch::DistilBert::new(self, cfg, vars))
    }
}
