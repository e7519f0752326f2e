//! The Llama family (transformers/models/{llama,mistral,qwen2,qwen3,smollm3,phi3,gemma,gemma2,
//! gemma3}): HF model types that compute one function — RMSNorm pre-norm blocks, rotary position
//! embeddings, grouped-query attention, a gated MLP — and differ in a few switches (attention
//! biases, Qwen3's q/k norms, sliding windows, SmolLM3's NoPE layers, Phi-3's fused projections,
//! residual dropout and partial rotary, Gemma's (1 + w) norms, scaled embedding and GeGLU, Gemma
//! 2/3's score scale, sandwich norms, soft-capping and local rope, defaults), all held by
//! [`LlamaConfig`]. Its parameters, FLOP count and pad ids here; its config.json read in
//! `config` (Gemma's rules in `gemma`), its rotary embedding in `rope`, its engine graph in
//! `graph`, its tch module in `torch`.

mod config;
mod gemma;
mod graph;
mod rope;
#[cfg(feature = "torch")]
mod torch;

use ortbench_engine::graph::TensorId;

use super::{Family, FamilyInfo, FamilyModel, FlopCount, Head, Pads};
use crate::config::{Activation, ModelConfig};
use crate::graph::{BResult, Builder, GraphOptions};
use crate::params::{Init, Layout, ParamSpec};

const HEADS_LLAMA: &[(Head, &str)] = &[
    (Head::CausalLm, "LlamaForCausalLM"),
    (Head::SequenceClassification, "LlamaForSequenceClassification"),
];
const HEADS_MISTRAL: &[(Head, &str)] = &[
    (Head::CausalLm, "MistralForCausalLM"),
    (Head::SequenceClassification, "MistralForSequenceClassification"),
];
const HEADS_QWEN2: &[(Head, &str)] = &[
    (Head::CausalLm, "Qwen2ForCausalLM"),
    (Head::SequenceClassification, "Qwen2ForSequenceClassification"),
];
const HEADS_QWEN3: &[(Head, &str)] = &[
    (Head::CausalLm, "Qwen3ForCausalLM"),
    (Head::SequenceClassification, "Qwen3ForSequenceClassification"),
];
const HEADS_SMOLLM3: &[(Head, &str)] = &[
    (Head::CausalLm, "SmolLM3ForCausalLM"),
    (Head::SequenceClassification, "SmolLM3ForSequenceClassification"),
];
const HEADS_GEMMA: &[(Head, &str)] = &[
    (Head::CausalLm, "GemmaForCausalLM"),
    (Head::SequenceClassification, "GemmaForSequenceClassification"),
];
const HEADS_GEMMA2: &[(Head, &str)] = &[
    (Head::CausalLm, "Gemma2ForCausalLM"),
    (Head::SequenceClassification, "Gemma2ForSequenceClassification"),
];
const HEADS_GEMMA3: &[(Head, &str)] = &[
    (Head::CausalLm, "Gemma3ForCausalLM"),
    (Head::SequenceClassification, "Gemma3TextForSequenceClassification"),
];
const HEADS_PHI3: &[(Head, &str)] = &[
    (Head::CausalLm, "Phi3ForCausalLM"),
    (Head::SequenceClassification, "Phi3ForSequenceClassification"),
];

/// `model.embed_tokens.weight`: the input embedding the LM head ties to.
const EMBED: &str = "model.embed_tokens.weight";

macro_rules! info {
    ($name:expr, $model_type:expr, $heads:expr, $parse:path) => {
        FamilyInfo {
            name: $name,
            model_type: $model_type,
            heads: $heads,
            base_prefix: "model",
            word_embedding: EMBED,
            untied_head: "lm_head.weight",
            checkpoint_aliases: &[],
            parse: $parse,
        }
    };
}

/// LlamaForCausalLM, LlamaForSequenceClassification.
pub static LLAMA: FamilyInfo = info!("Llama", "llama", HEADS_LLAMA, parse_llama);
/// MistralForCausalLM, MistralForSequenceClassification.
pub static MISTRAL: FamilyInfo = info!("Mistral", "mistral", HEADS_MISTRAL, parse_mistral);
/// Qwen2ForCausalLM, Qwen2ForSequenceClassification.
pub static QWEN2: FamilyInfo = info!("Qwen2", "qwen2", HEADS_QWEN2, parse_qwen2);
/// Qwen3ForCausalLM, Qwen3ForSequenceClassification.
pub static QWEN3: FamilyInfo = info!("Qwen3", "qwen3", HEADS_QWEN3, parse_qwen3);
/// SmolLM3ForCausalLM, SmolLM3ForSequenceClassification: Llama's layout with the rotary
/// embedding left out of the layers `no_rope_layers` marks 0 (every fourth by default).
pub static SMOLLM3: FamilyInfo = info!("SmolLM3", "smollm3", HEADS_SMOLLM3, parse_smollm3);
/// Phi3ForCausalLM, Phi3ForSequenceClassification: Llama's function with q/k/v in one
/// `qkv_proj` and gate/up in one `gate_up_proj`, dropout on both residual branches.
pub static PHI3: FamilyInfo = info!("Phi-3", "phi3", HEADS_PHI3, parse_phi3);
/// GemmaForCausalLM, GemmaForSequenceClassification: Llama's layout with (1 + w) RMSNorms, the
/// embedding scaled by √hidden, a tanh-GELU gated MLP (GeGLU) and head_dim 256 by default.
pub static GEMMA: FamilyInfo = info!("Gemma", "gemma", HEADS_GEMMA, gemma::parse_gemma);
/// Gemma2ForCausalLM, Gemma2ForSequenceClassification: Gemma with the attention scale
/// query_pre_attn_scalar^-½, norms after the attention and around the MLP, tanh soft-capping of
/// the attention scores and the logits, sliding and global layers alternating.
pub static GEMMA2: FamilyInfo = info!("Gemma 2", "gemma2", HEADS_GEMMA2, gemma::parse_gemma2);
/// Gemma3ForCausalLM, Gemma3TextForSequenceClassification (model type `gemma3_text`): Gemma 2's
/// layer with q/k norms, no soft-capping by default, five sliding layers to a global one, and the
/// sliding layers' own rope (local base 10 000).
pub static GEMMA3: FamilyInfo = info!("Gemma 3", "gemma3_text", HEADS_GEMMA3, gemma::parse_gemma3);

use config::{parse_llama, parse_mistral, parse_phi3, parse_qwen2, parse_qwen3, parse_smollm3};
pub use rope::{Rope, RopeScaling};

/// Which of the HF model types a config is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    SmolLM3,
    Phi3,
    Gemma,
    Gemma2,
    Gemma3,
}

impl Variant {
    pub fn info(self) -> &'static FamilyInfo {
        match self {
            Variant::Llama => &LLAMA,
            Variant::Mistral => &MISTRAL,
            Variant::Qwen2 => &QWEN2,
            Variant::Qwen3 => &QWEN3,
            Variant::SmolLM3 => &SMOLLM3,
            Variant::Phi3 => &PHI3,
            Variant::Gemma => &GEMMA,
            Variant::Gemma2 => &GEMMA2,
            Variant::Gemma3 => &GEMMA3,
        }
    }
}

/// The attention of one decoder layer: HF's `layer_types` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    Full,
    Sliding,
}

/// `LlamaConfig` / `MistralConfig` / `Qwen2Config` / `Qwen3Config` after HF 5.23's
/// `__post_init__` (every default applied, derived fields resolved).
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub variant: Variant,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// The leading dimensions of each head the rotary embedding turns: `head_dim`, or Phi-3's
    /// `int(head_dim · partial_rotary_factor)` (the rest pass through).
    pub rotary_dim: usize,
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub pad_token_id: Option<i64>,
    pub tie_word_embeddings: bool,
    pub rope: Rope,
    /// Biases of q_proj, k_proj, v_proj.
    pub qkv_bias: bool,
    /// Bias of o_proj (Llama and Qwen3: `attention_bias`; Qwen2: never).
    pub o_bias: bool,
    /// Biases of the MLP's three projections (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Qwen3's q_norm / k_norm (RMSNorm over head_dim before the rotary embedding).
    pub qk_norm: bool,
    pub attention_dropout: f64,
    /// The window of sliding layers (`kv_idx > q_idx − window`), None when no layer slides.
    pub sliding_window: Option<usize>,
    pub layer_types: Vec<LayerType>,
    /// Per layer, whether its attention applies the rotary embedding (SmolLM3's
    /// `no_rope_layers`: 0 for a NoPE layer; every layer in the other types).
    pub rope_layers: Vec<bool>,
    /// Phi-3's `qkv_proj` (q, k, v rows in that order) and `gate_up_proj` (gate rows, then up)
    /// in place of the five projections.
    pub fused_projections: bool,
    /// Phi-3's `resid_pdrop`: dropout on the attention's and the MLP's output before each
    /// residual add (the other types have no such dropout).
    pub resid_dropout: Option<f64>,
    /// Gemma's RMSNorm: x̂ · (1 + w) in f32, weights initialised 0 (the others': w · x̂).
    pub norm_offset: bool,
    /// Gemma's embedding scale √hidden (in f32, then the weights' dtype), None elsewhere.
    pub embed_scale: Option<f32>,
    /// The gated MLP's activation: SiLU (SwiGLU), or Gemma's tanh GELU (GeGLU).
    pub mlp_act: Activation,
    /// Gemma 2/3: the attention scores' scale is `query_pre_attn_scalar`^-½ (else head_dim^-½).
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma 2: the attention scores soft-capped, cap · tanh(s / cap), before the mask.
    pub attn_logit_softcapping: Option<f64>,
    /// Gemma 2: the LM head's logits soft-capped the same way.
    pub final_logit_softcapping: Option<f64>,
    /// Gemma 2/3's sandwich norms: `post_attention_layernorm` on the attention's output before
    /// its residual add, `pre_feedforward_layernorm` before the MLP, `post_feedforward_layernorm`
    /// on its output (the others: `post_attention_layernorm` before the MLP, nothing after).
    pub sandwich_norms: bool,
    /// Gemma 2 (and a Gemma 3 with `attn_logit_softcapping`, which HF's sdpa refuses): HF runs
    /// eager attention (Gemma 2's class has no sdpa), whose finite float masks leave
    /// a query with no visible key (a left pad) reading every key alike, where sdpa's give
    /// zeros; the causal LM's loss reads that query (the last pad predicts the first token).
    pub eager_attention: bool,
    /// Gemma 3: the sliding layers' rope (`rope_parameters["sliding_attention"]`, the local base);
    /// [`LlamaConfig::rope`] is then the full layers'.
    pub local_rope: Option<Box<Rope>>,
}

/// HF Trainer's `get_decay_parameter_names`: no decay for names matching `bias`, `layernorm`,
/// `rmsnorm`, `(^|\.)norm($|\.)` or `_norm($|\.)` (none of this family's modules is an
/// nn.LayerNorm).
fn hf_decays(name: &str) -> bool {
    let lower = name.to_lowercase();
    let parts: Vec<&str> = lower.split('.').collect();
    let forbidden = lower.contains("bias")
        || lower.contains("layernorm")
        || lower.contains("rmsnorm")
        || parts.contains(&"norm")
        || parts.iter().any(|p| p.ends_with("_norm"));
    !forbidden
}

impl LlamaConfig {
    /// Query heads per K/V head.
    pub fn n_rep(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// `embed_tokens`' `padding_idx`: `pad_token_id` when it is a row of the table.
    pub fn padding_idx(&self) -> Option<i64> {
        self.pad_token_id.filter(|&p| p >= 0 && (p as usize) < self.vocab_size)
    }

    /// Gemma 3's sliding layers' rope, when a layer slides (its tables are then a graph input).
    pub fn local_rope(&self) -> Option<&Rope> {
        self.local_rope.as_deref().filter(|_| self.layer_types.contains(&LayerType::Sliding))
    }

    /// The rope of layer `i`: Gemma 3's local one on its sliding layers, else [`Self::rope`].
    pub fn rope_of(&self, i: usize) -> &Rope {
        match (self.layer_types[i], self.local_rope()) {
            (LayerType::Sliding, Some(local)) => local,
            _ => &self.rope,
        }
    }

    /// The window when it bites at `seq_len` (HF builds the window's mask when
    /// kv_length ≥ window; below that it changes nothing).
    pub fn biting_window(&self, seq_len: usize) -> Option<usize> {
        self.sliding_window.filter(|&w| seq_len > w)
    }
}

impl FamilyModel for LlamaConfig {
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
    fn position_limit(&self) -> Option<usize> {
        None
    }
    fn tables_slice_by_length(&self) -> bool {
        [Some(&self.rope), self.local_rope()].into_iter().flatten().all(|r| {
            !matches!(r.scaling, RopeScaling::Dynamic { .. } | RopeScaling::LongRope { .. })
        })
    }
    fn initializer_range(&self) -> f64 {
        self.initializer_range
    }
    fn layer_norm_eps(&self) -> f64 {
        self.rms_norm_eps
    }
    fn tie_word_embeddings(&self) -> bool {
        self.tie_word_embeddings
    }
    fn activation(&self) -> Activation {
        self.mlp_act
    }

    fn set_dropout(&mut self, p: f64) {
        self.attention_dropout = p;
        if self.resid_dropout.is_some() {
            self.resid_dropout = Some(p);
        }
    }
    fn dropout_keys(&self) -> &'static [&'static str] {
        match self.variant {
            Variant::Phi3 => &["attention_dropout", "resid_pdrop"],
            _ => &["attention_dropout"],
        }
    }

    fn param_specs(&self, cfg: &ModelConfig) -> Vec<ParamSpec> {
        let std = self.initializer_range;
        let mut l = Layout::new(std);
        let (h, d) = (self.hidden_size, self.head_dim);
        let (q, kv) = (self.num_attention_heads * d, self.num_key_value_heads * d);
        let push = |l: &mut Layout, name: String, shape: &[usize], init: Init| {
            let decay = hf_decays(&name);
            l.push(name, shape, init, decay);
        };
        let emb_init = match self.padding_idx() {
            Some(row) => Init::NormalPadRow { std, row: row as usize },
            None => Init::Normal { std },
        };
        push(&mut l, EMBED.into(), &[self.vocab_size, h], emb_init);
        // Gemma's (1 + w) norms start at w = 0, the others' at w = 1: both the identity scale.
        let norm = if self.norm_offset { Init::Zeros } else { Init::Ones };
        let linear = |l: &mut Layout, prefix: &str, out: usize, inp: usize, bias: bool| {
            push(l, format!("{prefix}.weight"), &[out, inp], Init::Normal { std });
            if bias {
                push(l, format!("{prefix}.bias"), &[out], Init::Zeros);
            }
        };
        for i in 0..self.num_hidden_layers {
            let p = format!("model.layers.{i}");
            // named_parameters() order: self_attn (q, k, v, o, q_norm, k_norm), mlp (gate, up,
            // down), input_layernorm, post_attention_layernorm.
            // Phi-3: o_proj, then qkv_proj (declaration order); no biases.
            if self.fused_projections {
                linear(&mut l, &format!("{p}.self_attn.o_proj"), h, q, false);
                linear(&mut l, &format!("{p}.self_attn.qkv_proj"), q + 2 * kv, h, false);
            } else {
                linear(&mut l, &format!("{p}.self_attn.q_proj"), q, h, self.qkv_bias);
                linear(&mut l, &format!("{p}.self_attn.k_proj"), kv, h, self.qkv_bias);
                linear(&mut l, &format!("{p}.self_attn.v_proj"), kv, h, self.qkv_bias);
                linear(&mut l, &format!("{p}.self_attn.o_proj"), h, q, self.o_bias);
            }
            if self.qk_norm {
                l.push(format!("{p}.self_attn.q_norm.weight"), &[d], norm, false);
                l.push(format!("{p}.self_attn.k_norm.weight"), &[d], norm, false);
            }
            let inter = self.intermediate_size;
            if self.fused_projections {
                linear(&mut l, &format!("{p}.mlp.gate_up_proj"), 2 * inter, h, false);
            } else {
                linear(&mut l, &format!("{p}.mlp.gate_proj"), inter, h, self.mlp_bias);
                linear(&mut l, &format!("{p}.mlp.up_proj"), inter, h, self.mlp_bias);
            }
            linear(&mut l, &format!("{p}.mlp.down_proj"), h, inter, self.mlp_bias);
            l.push(format!("{p}.input_layernorm.weight"), &[h], norm, false);
            l.push(format!("{p}.post_attention_layernorm.weight"), &[h], norm, false);
            if self.sandwich_norms {
                l.push(format!("{p}.pre_feedforward_layernorm.weight"), &[h], norm, false);
                l.push(format!("{p}.post_feedforward_layernorm.weight"), &[h], norm, false);
            }
        }
        l.push("model.norm.weight".into(), &[h], norm, false);
        if cfg.arch.head() == Head::SequenceClassification {
            // nn.Linear(hidden_size, num_labels, bias=False)
            l.weight("score.weight".into(), &[cfg.num_labels(), h]);
        } else if !self.tie_word_embeddings {
            l.weight("lm_head.weight".into(), &[self.vocab_size, h]);
        }
        l.into_specs()
    }

    fn pads(&self) -> Pads {
        Pads { embedding: self.padding_idx(), pooling: self.pad_token_id }
    }

    fn sliding_window(&self) -> Option<usize> {
        self.sliding_window
    }

    fn fixed_inputs(&self, seq_len: usize) -> Vec<(&'static str, Vec<f32>)> {
        use crate::graph::{ROPE_COS, ROPE_COS_LOCAL, ROPE_SIN, ROPE_SIN_LOCAL};
        let (cos, sin) = self.rope.tables(self.rotary_dim, seq_len);
        let mut inputs = vec![(ROPE_COS, cos), (ROPE_SIN, sin)];
        if let Some(local) = self.local_rope() {
            let (cos, sin) = local.tables(self.rotary_dim, seq_len);
            inputs.extend([(ROPE_COS_LOCAL, cos), (ROPE_SIN_LOCAL, sin)]);
        }
        inputs
    }

    fn flop_count(&self, cfg: &ModelConfig) -> FlopCount {
        FlopCount {
            layers: self.num_hidden_layers,
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            mlp_gemms: 3,
            q_heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            vocab: self.vocab_size,
            head: cfg.arch.head(),
            num_labels: cfg.num_labels(),
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
            Head::CausalLm => graph::for_causal_lm(b, self, cfg, opts),
            Head::SequenceClassification => graph::for_sequence_classification(b, self, cfg, opts),
            Head::MaskedLm | Head::TokenClassification => {
                unreachable!(
                    "{} lists no {} head",
                    self.variant.info().name,
                    cfg.arch.head().task_name()
                )
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
            Head::CausalLm => torch::causal_lm(self, vars),
            Head::SequenceClassification => torch::classifier(self, cfg, vars),
            Head::MaskedLm | Head::TokenClassification => {
                unreachable!(
                    "{} lists no {} head",
                    self.variant.info().name,
                    cfg.arch.head().task_name()
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{build_training_graph, GraphOptions};
    use crate::spec::builtin_config;
    use crate::ModelError;

    fn parse_json(v: serde_json::Value) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_value(v, "test/config.json")
    }

    fn llama(c: &ModelConfig) -> &LlamaConfig {
        match &c.family {
            Family::Llama(l) => l,
            _ => panic!("not a Llama-family config"),
        }
    }

    /// The published parameter counts (the hub's model cards; scripts/make-fixtures.py checks
    /// the configs against HF with the same numbers).
    #[test]
    fn builtin_configs_have_the_published_parameter_counts() {
        for (name, want) in [
            ("smollm2-135m", 134_515_008),
            ("qwen2.5-0.5b", 494_032_768),
            ("qwen3-0.6b", 596_049_920),
            ("llama-3.2-1b", 1_235_814_400),
            ("smollm3-3b", 3_075_098_624),
            ("phi-3-mini-4k-instruct", 3_821_079_552),
            ("gemma-2-2b", 2_614_341_888),
            ("gemma-3-270m", 268_098_176),
            ("gemma-3-1b", 999_885_952),
        ] {
            let cfg = builtin_config(name).unwrap();
            assert_eq!(crate::params::param_count(&cfg), want, "{name}");
        }
        let l = builtin_config("llama-3.2-1b").unwrap();
        assert!(
            matches!(llama(&l).rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 32.0)
        );
        assert_eq!(llama(&builtin_config("qwen2.5-0.5b").unwrap()).variant, Variant::Qwen2);
        // Phi-3-mini: fused projections, every layer sliding at 2047.
        let p = llama(&builtin_config("phi-3-mini-4k-instruct").unwrap()).clone();
        assert!(p.fused_projections && p.variant == Variant::Phi3);
        assert_eq!(p.sliding_window, Some(2047));
        assert!(p.layer_types.iter().all(|&t| t == LayerType::Sliding));
        // SmolLM3-3B: every fourth of its 36 layers without the rotary embedding.
        let s = llama(&builtin_config("smollm3-3b").unwrap()).rope_layers.clone();
        assert_eq!(s.len(), 36);
        assert!(s.iter().enumerate().all(|(i, &r)| r == ((i + 1) % 4 != 0)), "{s:?}");
    }

    /// What is not implemented is refused in one line naming it.
    #[test]
    fn unimplemented_options_are_refused_by_name() {
        let base = builtin_config("tiny-llama").unwrap().raw;
        let refused = |edit: &dyn Fn(&mut serde_json::Value), what: &str| {
            let mut raw = base.clone();
            edit(&mut raw);
            let e = parse_json(raw).unwrap_err().to_string();
            assert!(e.contains(what) && !e.contains('\n'), "{what}: {e}");
        };
        refused(&|r| r["rope_parameters"]["rope_type"] = serde_json::json!("su"), "rope_type 'su'");
        refused(
            &|r| r["rope_parameters"]["rope_type"] = serde_json::json!("longrope"),
            "longrope rope_parameters need 'short_factor': 8 numbers",
        );
        refused(
            &|r| r["rope_parameters"]["rope_type"] = serde_json::json!("yarn"),
            "yarn rope_parameters need 'factor'",
        );
        refused(
            &|r| r["rope_scaling"] = serde_json::json!({"type": "dynamic"}),
            "dynamic rope_parameters need 'factor'",
        );
        refused(&|r| r["hidden_act"] = serde_json::json!("gelu"), "hidden_act 'gelu'");
        refused(&|r| r["hidden_act"] = serde_json::json!("relu2"), "activation 'relu2'");
        refused(&|r| r["partial_rotary_factor"] = serde_json::json!(0.5), "partial_rotary_factor");
        refused(
            &|r| r["rope_parameters"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
            "need 'low_freq_factor'",
        );
        refused(&|r| r["num_key_value_heads"] = serde_json::json!(3), "not a multiple");
        // A Qwen2 layer_types naming sliding layers without a window.
        let mut q = builtin_config("tiny-qwen2").unwrap().raw;
        q["layer_types"] = serde_json::json!(["full_attention", "sliding_attention"]);
        q["use_sliding_window"] = serde_json::json!(false);
        let e = parse_json(q).unwrap_err().to_string();
        assert!(e.contains("no sliding_window"), "{e}");
    }

    /// HF's legacy forms: rope_theta at the top level, rope_scaling with `type`.
    #[test]
    fn legacy_rope_fields_are_read() {
        let mut raw = builtin_config("tiny-llama").unwrap().raw;
        raw.as_object_mut().unwrap().remove("rope_parameters");
        raw["rope_theta"] = serde_json::json!(500000.0);
        let c = parse_json(raw.clone()).unwrap();
        assert_eq!(llama(&c).rope, Rope { theta: 500000.0, scaling: RopeScaling::Default });
        raw["rope_scaling"] = serde_json::json!({"type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0});
        let c = parse_json(raw).unwrap();
        assert_eq!(
            llama(&c).rope.scaling,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 128.0
            }
        );
    }

    /// linear divides every frequency by its factor; dynamic is the default up to
    /// max_position_embeddings and lowers the frequencies past it; yarn keeps the fastest
    /// frequencies, divides the slowest by its factor and scales cos/sin by 0.1·ln(factor) + 1.
    #[test]
    fn linear_dynamic_and_yarn_scale_as_hf_defines_them() {
        let parse = |rope: serde_json::Value| {
            let mut raw = builtin_config("tiny-llama").unwrap().raw;
            raw["max_position_embeddings"] = serde_json::json!(16);
            raw["rope_parameters"] = rope;
            llama(&parse_json(raw).unwrap()).rope.clone()
        };
        let default = parse(serde_json::json!({"rope_type": "default", "rope_theta": 1e4}));
        let base = default.inv_freq(16, 32);
        let lin =
            parse(serde_json::json!({"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}));
        assert!(lin.inv_freq(16, 32).iter().zip(&base).all(|(a, b)| *a == b / 4.0));
        let dy =
            parse(serde_json::json!({"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}));
        assert_eq!(dy.inv_freq(16, 16), base, "up to max_position_embeddings");
        let long = dy.inv_freq(16, 32);
        assert_eq!(long[0], base[0]);
        assert!(long[1..].iter().zip(&base[1..]).all(|(a, b)| a < b), "{long:?} vs {base:?}");
        let yarn = parse(serde_json::json!({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
            "original_max_position_embeddings": 8}));
        let want_af = 0.1 * 4f64.ln() + 1.0;
        assert!(
            matches!(yarn.scaling, RopeScaling::Yarn { attention_factor, .. } if attention_factor == want_af)
        );
        let y = yarn.inv_freq(16, 32);
        assert_eq!(y[0], base[0], "the fastest frequency extrapolates");
        assert_eq!(y[7], base[7] / 4.0, "the slowest interpolates");
        let (cos, _) = yarn.tables(16, 2);
        assert_eq!(cos[0], want_af as f32, "cos(0) scaled by the attention factor");
    }

    /// The tables are HF's layout: cos/sin of cat(freqs, freqs), position 0 → (1, 0); llama3
    /// leaves high frequencies alone and divides the lowest by `factor`.
    #[test]
    fn rotary_tables_follow_hf() {
        let rope = Rope { theta: 10000.0, scaling: RopeScaling::Default };
        let (cos, sin) = rope.tables(8, 3);
        assert!(cos[..8].iter().all(|&c| c == 1.0) && sin[..8].iter().all(|&s| s == 0.0));
        for p in 0..3 {
            assert_eq!(cos[p * 8..p * 8 + 4], cos[p * 8 + 4..p * 8 + 8]);
        }
        assert_eq!(cos[8], 1f32.cos());
        let inv = rope.inv_freq(8, 3);
        let scaled = Rope {
            theta: 10000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 32.0,
            },
        }
        .inv_freq(8, 3);
        // wavelengths 2π/inv: 6.3 (< 8: kept), 63 and 628 (> 32: divided), 6283 (divided).
        assert_eq!(scaled[0], inv[0]);
        assert_eq!(scaled[3], inv[3] / 8.0);
    }

    /// Decay groups: HF Trainer's patterns on this family's names.
    #[test]
    fn decay_follows_hf_trainer_patterns() {
        for (name, decays) in [
            ("model.embed_tokens.weight", true),
            ("model.layers.0.self_attn.q_proj.weight", true),
            ("model.layers.0.self_attn.q_proj.bias", false),
            ("model.layers.0.self_attn.q_norm.weight", false),
            ("model.layers.0.input_layernorm.weight", false),
            ("model.layers.0.post_attention_layernorm.weight", false),
            ("model.norm.weight", false),
            ("lm_head.weight", true),
            ("score.weight", true),
        ] {
            assert_eq!(hf_decays(name), decays, "{name}");
        }
    }

    /// The FLOP count: three MLP GEMMs, K/V at the kv heads' width, the untied or tied head.
    #[test]
    fn flop_count_has_gated_mlp_and_kv_width() {
        let cfg = builtin_config("smollm2-135m").unwrap();
        let f = cfg.flop_count();
        assert_eq!((f.mlp_gemms, f.q_heads, f.kv_heads, f.head_dim), (3, 9, 3, 64));
        let t = 128.0;
        let (l, h, i, v) = (30.0, 576.0, 1536.0, 49152.0);
        let (q, kv) = (576.0, 192.0);
        let want = l
            * (4.0 * t * h * q + 4.0 * t * h * kv + 4.0 * t * t * q + 3.0 * 2.0 * t * h * i)
            + 2.0 * t * h * v;
        assert_eq!(f.forward_per_sample(128), want);
    }

    /// The window's mask is an input only when the window bites, and every builtin config
    /// builds; the graph runs on the reference executor with a biting window.
    #[test]
    fn window_mask_input_only_when_the_window_bites() {
        let mut raw = builtin_config("tiny-mistral").unwrap().raw;
        raw["sliding_window"] = serde_json::json!(4);
        let cfg = parse_json(raw).unwrap();
        let has = |t: usize| {
            let m = build_training_graph(&cfg, &GraphOptions::new(1, t)).unwrap();
            m.graph
                .inputs()
                .iter()
                .any(|&i| m.graph.input_name(i) == Some(crate::graph::SLIDING_WINDOW_MASK))
        };
        assert!(!has(4) && has(5));
    }

    /// With the default passes every layer's eager attention (repeat_kv included, the window's
    /// mask too) becomes one fused attention reading the un-repeated K/V.
    #[test]
    fn passes_fuse_each_layers_attention() {
        let mut raw = builtin_config("tiny-mistral").unwrap().raw;
        raw["sliding_window"] = serde_json::json!(4);
        for cfg in [builtin_config("tiny-llama").unwrap(), parse_json(raw).unwrap()] {
            let m = build_training_graph(&cfg, &GraphOptions::new(2, 8)).unwrap();
            let counts = ortbench_engine::passes::op_counts(&m.forward);
            assert_eq!(counts.get("attention"), Some(&cfg.num_layers()), "{counts:?}");
            assert_eq!(counts.get("softmax"), None, "{counts:?}");
        }
    }
}
