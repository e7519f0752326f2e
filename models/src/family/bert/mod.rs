//! BERT and RoBERTa (transformers/models/bert, …/roberta): their config, parameters, FLOP
//! count and pad ids here; the engine graph in `graph`, the tch module in `torch`. RoBERTa is
//! BERT's layout under other names with three differences, all in this module: positions
//! counted from `padding_idx + 1` over the non-pad tokens, its LM head (`lm_head`, GELU always)
//! and its classification head (`classifier.dense` → tanh → `classifier.out_proj` on `<s>`).
//! The post-LN encoder layer is shared with DistilBERT (`EncoderLayerNames`).

mod graph;
#[cfg(feature = "torch")]
mod torch;

pub(crate) use graph::{
    encoder_layer, first_token, mlm_head, padded_lookup, EncoderLayer, MlmHead,
};
#[cfg(feature = "torch")]
pub(crate) use torch::{TorchEncoderLayer, TorchMlmHead};

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
    parse: parse_bert,
};

/// RoBERTa: RobertaForMaskedLM, RobertaForSequenceClassification, RobertaForTokenClassification.
pub static ROBERTA: FamilyInfo = FamilyInfo {
    name: "RoBERTa",
    model_type: "roberta",
    heads: &[
        (Head::MaskedLm, "RobertaForMaskedLM"),
        (Head::SequenceClassification, "RobertaForSequenceClassification"),
        (Head::TokenClassification, "RobertaForTokenClassification"),
    ],
    base_prefix: "roberta",
    word_embedding: "roberta.embeddings.word_embeddings.weight",
    untied_head: "lm_head.decoder.weight",
    // `_tied_weights_keys`: the decoder's bias is `lm_head.bias`.
    checkpoint_aliases: &[("lm_head.decoder.bias", "lm_head.bias")],
    parse: parse_roberta,
};

/// Which of the two layouts a [`BertConfig`] is (HF's two config classes have the same fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Variant {
    #[default]
    Bert,
    Roberta,
}

/// The parameter names of one post-LN encoder layer (BertLayer, DistilBERT's TransformerBlock)
/// after the layer's prefix: the graph and the tch module of each family read them from here.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EncoderLayerNames {
    pub query: &'static str,
    pub key: &'static str,
    pub value: &'static str,
    pub attn_out: &'static str,
    pub attn_norm: &'static str,
    pub up: &'static str,
    pub down: &'static str,
    pub out_norm: &'static str,
}

/// BertLayer's (and RobertaLayer's) names.
pub(crate) const BERT_LAYER: EncoderLayerNames = EncoderLayerNames {
    query: "attention.self.query",
    key: "attention.self.key",
    value: "attention.self.value",
    attn_out: "attention.output.dense",
    attn_norm: "attention.output.LayerNorm",
    up: "intermediate.dense",
    down: "output.dense",
    out_norm: "output.LayerNorm",
};

impl EncoderLayerNames {
    /// Each layer's parameters, in `named_parameters()` order.
    pub(crate) fn push_specs(&self, l: &mut Layout, p: &str, h: usize, inter: usize) {
        l.linear(&format!("{p}.{}", self.query), h, h);
        l.linear(&format!("{p}.{}", self.key), h, h);
        l.linear(&format!("{p}.{}", self.value), h, h);
        l.linear(&format!("{p}.{}", self.attn_out), h, h);
        l.layer_norm(&format!("{p}.{}", self.attn_norm), h);
        l.linear(&format!("{p}.{}", self.up), inter, h);
        l.linear(&format!("{p}.{}", self.down), h, inter);
        l.layer_norm(&format!("{p}.{}", self.out_norm), h);
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

/// `BertConfig` (transformers/models/bert/configuration_bert.py) or `RobertaConfig` (the same
/// fields; other defaults, filled in by `parse_roberta`): a field missing from config.json
/// takes HF 5.23's default.
#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    #[serde(skip)]
    pub variant: Variant,
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

    /// The family's registry entry.
    pub fn info(&self) -> &'static FamilyInfo {
        match self.variant {
            Variant::Bert => &INFO,
            Variant::Roberta => &ROBERTA,
        }
    }

    /// The base model's prefix ("bert", "roberta").
    pub(crate) fn prefix(&self) -> &'static str {
        self.info().base_prefix
    }

    /// The MLM head of the variant: BERT's (`cls.predictions`, the config's activation) or
    /// RoBERTa's (`lm_head`, erf GELU always, as HF's `RobertaLMHead`).
    pub(crate) fn mlm_head(&self, act: Activation) -> MlmHead {
        let info = self.info();
        let decoder = if self.tie_word_embeddings { info.word_embedding } else { info.untied_head };
        let eps = self.layer_norm_eps;
        match self.variant {
            Variant::Bert => MlmHead {
                dense: "cls.predictions.transform.dense",
                norm: "cls.predictions.transform.LayerNorm",
                bias: "cls.predictions.bias",
                decoder,
                act,
                eps,
            },
            Variant::Roberta => MlmHead {
                dense: "lm_head.dense",
                norm: "lm_head.layer_norm",
                bias: "lm_head.bias",
                decoder,
                act: Activation::GeluErf,
                eps,
            },
        }
    }

    /// The encoder layer's settings (the names are BertLayer's for both variants).
    pub(crate) fn encoder_layer(&self, act: Activation) -> EncoderLayer {
        EncoderLayer {
            names: BERT_LAYER,
            heads: self.num_attention_heads,
            eps: self.layer_norm_eps,
            act,
            attn_dropout: self.attention_probs_dropout_prob,
            attn_out_dropout: self.hidden_dropout_prob,
            ffn_dropout: self.hidden_dropout_prob,
        }
    }
}

/// [`FamilyInfo::parse`] of BERT: the fields, the activation, absolute positions only.
fn parse_bert(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    let c: BertConfig = hf_fields(raw, origin)?;
    check(c)
}

/// [`FamilyInfo::parse`] of RoBERTa: `RobertaConfig`'s own defaults (vocab 50265, pad 1) under
/// BertConfig's fields; a pad id that is a row of both embeddings, which its positions need.
fn parse_roberta(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    let mut raw = raw.clone();
    if let Some(obj) = raw.as_object_mut() {
        obj.entry("vocab_size").or_insert(50265.into());
        obj.entry("pad_token_id").or_insert(1.into());
    }
    let mut c: BertConfig = hf_fields(&raw, origin)?;
    c.variant = Variant::Roberta;
    match c.padding_idx() {
        Some(p) if (p as usize) + 1 < c.max_position_embeddings => check(c),
        _ => Err(ModelError::Unsupported(format!(
            "{origin}: RoBERTa with pad_token_id {:?}: its positions count from pad_token_id + 1, which must be a row of both embeddings (vocab {}, positions {})",
            c.pad_token_id, c.vocab_size, c.max_position_embeddings
        ))),
    }
}

/// What both variants refuse.
fn check(c: BertConfig) -> Result<Family, ModelError> {
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
    /// RoBERTa's last position is `padding_idx + T` (positions start after the pad id).
    fn position_limit(&self) -> Option<usize> {
        Some(match (self.variant, self.padding_idx()) {
            (Variant::Roberta, Some(p)) => self.max_position_embeddings - p as usize - 1,
            _ => self.max_position_embeddings,
        })
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
        let (h, base) = (self.hidden_size, self.prefix());
        let pad_row = |row: Option<i64>| match row {
            Some(row) => Init::NormalPadRow { std, row: row as usize },
            None => Init::Normal { std },
        };
        let word = pad_row(self.padding_idx());
        l.push(self.info().word_embedding.into(), &[self.vocab_size, h], word, true);
        let positions = format!("{base}.embeddings.position_embeddings.weight");
        let positions_shape = [self.max_position_embeddings, h];
        // BertEmbeddings declares positions before token types; RobertaEmbeddings after its
        // LayerNorm, with the padding_idx.
        if self.variant == Variant::Bert {
            l.weight(positions.clone(), &positions_shape);
        }
        l.weight(
            format!("{base}.embeddings.token_type_embeddings.weight"),
            &[self.type_vocab_size, h],
        );
        l.layer_norm(&format!("{base}.embeddings.LayerNorm"), h);
        if self.variant == Variant::Roberta {
            l.push(positions, &positions_shape, pad_row(self.padding_idx()), true);
        }
        for i in 0..self.num_hidden_layers {
            BERT_LAYER.push_specs(
                &mut l,
                &format!("{base}.encoder.layer.{i}"),
                h,
                self.intermediate_size,
            );
        }
        match (self.variant, cfg.arch.head()) {
            (Variant::Bert, Head::MaskedLm) => {
                l.push("cls.predictions.bias".into(), &[self.vocab_size], Init::Zeros, false);
                l.linear("cls.predictions.transform.dense", h, h);
                l.layer_norm("cls.predictions.transform.LayerNorm", h);
                if !self.tie_word_embeddings {
                    l.weight(self.info().untied_head.into(), &[self.vocab_size, h]);
                }
            }
            // RobertaLMHead: dense, layer_norm, decoder (tied unless untied), bias.
            (Variant::Roberta, Head::MaskedLm) => {
                l.linear("lm_head.dense", h, h);
                l.layer_norm("lm_head.layer_norm", h);
                if !self.tie_word_embeddings {
                    l.weight(self.info().untied_head.into(), &[self.vocab_size, h]);
                }
                l.push("lm_head.bias".into(), &[self.vocab_size], Init::Zeros, false);
            }
            // …ForTokenClassification: the model without a pooler + classifier.
            (_, Head::TokenClassification) => l.linear("classifier", cfg.num_labels(), h),
            (Variant::Bert, Head::SequenceClassification) => {
                l.linear("bert.pooler.dense", h, h);
                l.linear("classifier", cfg.num_labels(), h);
            }
            // RobertaClassificationHead (no pooler in the model).
            (Variant::Roberta, Head::SequenceClassification) => {
                l.linear("classifier.dense", h, h);
                l.linear("classifier.out_proj", cfg.num_labels(), h);
            }
            (_, Head::CausalLm) => unreachable!("BERT lists no causal-lm head"),
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
            // The MLM head's transform; the sequence classifier's pooler (RoBERTa: its dense).
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
            Head::MaskedLm => graph::for_masked_lm(b, self, cfg, opts),
            Head::SequenceClassification if self.variant == Variant::Roberta => {
                graph::roberta_for_sequence_classification(b, self, cfg, opts)
            }
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
            Head::MaskedLm => Box::new(torch::ForMaskedLM::new(self, cfg, vars)),
            Head::SequenceClassification if self.variant == Variant::Roberta => {
                Box::new(torch::RobertaForSequenceClassification::new(self, cfg, vars))
            }
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
