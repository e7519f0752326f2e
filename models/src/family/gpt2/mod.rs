//! GPT-2 (transformers/models/gpt2): its config, parameters, FLOP count and pad ids here; its
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
use crate::params::{Layout, ParamSpec};
use crate::ModelError;

/// The GPT-2 family: GPT2LMHeadModel, GPT2ForSequenceClassification.
pub static INFO: FamilyInfo = FamilyInfo {
    name: "GPT-2",
    model_type: "gpt2",
    heads: &[
        (Head::CausalLm, "GPT2LMHeadModel"),
        (Head::SequenceClassification, "GPT2ForSequenceClassification"),
    ],
    base_prefix: "transformer",
    word_embedding: "transformer.wte.weight",
    untied_head: "lm_head.weight",
    checkpoint_aliases: &[],
    parse,
};

fn default_true() -> bool {
    true
}

/// `GPT2Config` (transformers/models/gpt2/configuration_gpt2.py): a field missing from
/// config.json takes HF 5.23's default.
#[derive(Clone, Debug, Deserialize)]
pub struct Gpt2Config {
    #[serde(default = "d::vocab")]
    pub vocab_size: usize,
    #[serde(default = "d::positions")]
    pub n_positions: usize,
    #[serde(default = "d::embd")]
    pub n_embd: usize,
    #[serde(default = "d::twelve")]
    pub n_layer: usize,
    #[serde(default = "d::twelve")]
    pub n_head: usize,
    #[serde(default)]
    pub n_inner: Option<usize>,
    #[serde(default = "d::act")]
    pub activation_function: String,
    #[serde(default = "d::dropout")]
    pub resid_pdrop: f64,
    #[serde(default = "d::dropout")]
    pub embd_pdrop: f64,
    #[serde(default = "d::dropout")]
    pub attn_pdrop: f64,
    #[serde(default = "d::eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "d::init")]
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

/// HF 5.23's `GPT2Config` defaults.
mod d {
    pub fn vocab() -> usize {
        50257
    }
    pub fn positions() -> usize {
        1024
    }
    pub fn embd() -> usize {
        768
    }
    pub fn twelve() -> usize {
        12
    }
    pub fn act() -> String {
        "gelu_new".into()
    }
    pub fn dropout() -> f64 {
        0.1
    }
    pub fn eps() -> f64 {
        1e-5
    }
    pub fn init() -> f64 {
        0.02
    }
}

impl Gpt2Config {
    /// The MLP's width: `n_inner`, else 4·`n_embd` (HF's default).
    pub fn inner(&self) -> usize {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }
}

/// [`FamilyInfo::parse`]: the fields, the activation, HF's default attention only.
fn parse(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    let c: Gpt2Config = hf_fields(raw, origin)?;
    parse_activation(&c.activation_function)?;
    if c.scale_attn_by_inverse_layer_idx || c.reorder_and_upcast_attn || !c.scale_attn_weights {
        return Err(ModelError::Unsupported(
            "GPT-2 attention variants (scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn, scale_attn_weights=false)".into(),
        ));
    }
    Ok(Family::Gpt2(c))
}

impl FamilyModel for Gpt2Config {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
    fn hidden_size(&self) -> usize {
        self.n_embd
    }
    fn num_layers(&self) -> usize {
        self.n_layer
    }
    fn num_heads(&self) -> usize {
        self.n_head
    }
    fn intermediate_size(&self) -> usize {
        self.inner()
    }
    fn max_positions(&self) -> usize {
        self.n_positions
    }
    fn initializer_range(&self) -> f64 {
        self.initializer_range
    }
    fn layer_norm_eps(&self) -> f64 {
        self.layer_norm_epsilon
    }
    fn tie_word_embeddings(&self) -> bool {
        self.tie_word_embeddings
    }
    fn activation(&self) -> Activation {
        parse_activation(&self.activation_function).expect("validated at parse time")
    }

    fn set_dropout(&mut self, p: f64) {
        self.resid_pdrop = p;
        self.embd_pdrop = p;
        self.attn_pdrop = p;
    }
    fn dropout_keys(&self) -> &'static [&'static str] {
        &["resid_pdrop", "embd_pdrop", "attn_pdrop"]
    }

    fn param_specs(&self, cfg: &ModelConfig) -> Vec<ParamSpec> {
        let std = self.initializer_range;
        let mut l = Layout::new(std);
        let e = self.n_embd;
        // HF re-initialises every c_proj weight with std / sqrt(2·n_layer) (GPT-2 paper §2.3).
        let proj_std = std / (2.0 * self.n_layer as f64).sqrt();
        l.weight(INFO.word_embedding.into(), &[self.vocab_size, e]);
        l.weight("transformer.wpe.weight".into(), &[self.n_positions, e]);
        for i in 0..self.n_layer {
            let p = format!("transformer.h.{i}");
            l.layer_norm(&format!("{p}.ln_1"), e);
            l.conv1d(&format!("{p}.attn.c_attn"), e, 3 * e, std);
            l.conv1d(&format!("{p}.attn.c_proj"), e, e, proj_std);
            l.layer_norm(&format!("{p}.ln_2"), e);
            l.conv1d(&format!("{p}.mlp.c_fc"), e, self.inner(), std);
            l.conv1d(&format!("{p}.mlp.c_proj"), self.inner(), e, proj_std);
        }
        l.layer_norm("transformer.ln_f", e);
        if cfg.arch.head() == Head::SequenceClassification {
            // nn.Linear(n_embd, num_labels, bias=False)
            l.weight("score.weight".into(), &[cfg.num_labels(), e]);
        } else if !self.tie_word_embeddings {
            l.weight(INFO.untied_head.into(), &[self.vocab_size, e]);
        }
        l.into_specs()
    }

    fn pads(&self) -> Pads {
        Pads { embedding: None, pooling: self.pad_token_id }
    }

    fn flop_count(&self, cfg: &ModelConfig) -> FlopCount {
        FlopCount {
            layers: self.n_layer,
            hidden: self.n_embd,
            intermediate: self.inner(),
            mlp_gemms: 2,
            q_heads: self.n_head,
            kv_heads: self.n_head,
            head_dim: self.n_embd / self.n_head,
            vocab: self.vocab_size,
            head: cfg.arch.head(),
            num_labels: cfg.num_labels(),
            // The LM head and the score are bare projections.
            head_dense: 0,
        }
    }

    fn build_logits(
        &self,
        b: &mut Builder,
        cfg: &ModelConfig,
        opts: &GraphOptions,
    ) -> BResult<TensorId> {
        match cfg.arch.head() {
            Head::CausalLm => graph::gpt2_lm_head_model(b, self, cfg, opts),
            Head::SequenceClassification => {
                graph::gpt2_for_sequence_classification(b, self, cfg, opts)
            }
            Head::MaskedLm | Head::TokenClassification => {
                unreachable!("GPT-2 lists no {} head", cfg.arch.head().task_name())
            }
        }
    }

    #[cfg(feature = "torch")]
    fn torch_model(
        &self,
        cfg: &ModelConfig,
        vars: &crate::torch::Vars,
    ) -> Box<dyn crate::torch::TorchLoss> {
        match cfg.arch.head() {
            Head::CausalLm => torch::causal_lm(self, cfg, vars),
            Head::SequenceClassification => torch::classifier(self, cfg, vars),
            Head::MaskedLm | Head::TokenClassification => {
                unreachable!("GPT-2 lists no {} head", cfg.arch.head().task_name())
            }
        }
    }
}
