//! The Llama family (transformers/models/{llama,mistral,qwen2,qwen3,smollm3,phi3,gemma,gemma2,
//! gemma3}): HF model types that compute one function — RMSNorm pre-norm blocks, rotary position
//! embeddings, grouped-query attention, a gated MLP — and differ in a few switches (attention
//! biases, Qwen3's q/k norms, sliding windows, SmolLM3's NoPE layers, Phi-3's fused projections,
//! residual dropout and partial rotary, Gemma's (1 + w) norms, scaled embedding and GeGLU, Gemma
//! 2/3's score scale, sandwich norms, soft-capping and local rope, defaults), all held by
//! [`LlamaConfig`]. Its config, parameters, FLOP count, pad ids and rotary tables here (Gemma's
//! config rules in `gemma`); its engine graph in `graph`, its tch module in `torch`.

mod gemma;
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

/// HF's rotary embedding type (`rope_parameters["rope_type"]`), among those implemented.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `default`: inv_freq = 1 / θ^(2i/D).
    Default,
    /// `llama3` (`_compute_llama3_parameters`): low frequencies divided by `factor`, a smooth
    /// interpolation between `low_freq_factor` and `high_freq_factor` wavelengths.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// `linear` (`_compute_linear_scaling_rope_parameters`): inv_freq / factor (positions
    /// divided by factor).
    Linear { factor: f64 },
    /// `dynamic` (`_compute_dynamic_ntk_parameters`, NTK-aware): past
    /// `max_position_embeddings` the base becomes θ·(factor·T/max − (factor − 1))^(D/(D−2)) for
    /// a sequence of T. HF recomputes it in the forward when a longer sequence than any before
    /// comes (`dynamic_rope_update`); a run here has one T, so its tables are those of T.
    Dynamic { factor: f64, max_position_embeddings: f64 },
    /// `yarn` (`_compute_yarn_parameters`): each frequency blends interpolation (/factor) and
    /// extrapolation by a linear ramp over the dimensions between the correction range of
    /// `beta_fast` and `beta_slow` rotations in `original_max_position_embeddings`, and cos/sin
    /// are scaled by `attention_factor` (default 0.1·ln(factor) + 1, or the mscale ratio).
    Yarn {
        factor: f64,
        attention_factor: f64,
        beta_fast: f64,
        beta_slow: f64,
        truncate: bool,
        original_max_position_embeddings: f64,
    },
    /// `longrope` (`_compute_longrope_parameters`, Phi-3's): θ^(-2i/D) divided by a per-frequency
    /// factor — `short_factor` up to `original_max_position_embeddings` positions, `long_factor`
    /// past it (HF switches by the sequence's length in the forward) — and cos/sin scaled by
    /// `attention_factor` (default √(1 + ln(factor)/ln(original)), factor defaulting to
    /// max_position_embeddings / original).
    LongRope {
        short_factor: Vec<f64>,
        long_factor: Vec<f64>,
        attention_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// HF's standardised `rope_parameters`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)) in f32, as torch computes it.
fn default_inv_freq(base: f32, head_dim: usize) -> Vec<f32> {
    let dim = head_dim as f32;
    (0..head_dim / 2).map(|i| 1.0 / base.powf((2 * i) as f32 / dim)).collect()
}

/// `_compute_yarn_parameters`' frequencies: the extrapolated (θ^(-2i/D)) and interpolated
/// (/factor) ones blended by 1 − ramp, the ramp linear between the correction dimensions of
/// `beta_fast` and `beta_slow` rotations (floored / ceiled when `truncate`), in f32 as torch.
fn yarn_inv_freq(theta: f64, head_dim: usize, y: (f64, f64, f64, bool, f64)) -> Vec<f32> {
    let (factor, beta_fast, beta_slow, truncate, old) = y;
    let dim = head_dim as f64;
    // find_correction_dim in Python floats (f64).
    let corr =
        |rot: f64| (dim * (old / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * theta.ln());
    let (mut low, mut high) = (corr(beta_fast), corr(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
    if low == high {
        high += 0.001; // HF: prevent singularity
    }
    let base = theta as f32;
    (0..head_dim / 2)
        .map(|i| {
            let pos = base.powf((2 * i) as f32 / head_dim as f32);
            let extrapolation = 1.0 / pos;
            let interpolation = 1.0 / (factor as f32 * pos);
            // (arange(dim/2) − min) / (max − min), clamped to [0, 1], in f32.
            let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
            let extrapolation_factor = 1.0 - ramp;
            interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
        })
        .collect()
}

impl Rope {
    /// HF's `inv_freq` (D/2 values) for a sequence of `seq_len`, computed in f32 as torch does
    /// (only `dynamic` depends on the length).
    pub fn inv_freq(&self, head_dim: usize, seq_len: usize) -> Vec<f32> {
        let inv = default_inv_freq(self.theta as f32, head_dim);
        match &self.scaling {
            RopeScaling::Default => inv,
            RopeScaling::Linear { factor } => inv.iter().map(|&f| f / *factor as f32).collect(),
            &RopeScaling::Dynamic { factor, max_position_embeddings: max } => {
                // seq_len = max(T, max_position_embeddings); the new base as float32 tensors.
                let t = seq_len.max(max as usize) as f32;
                let grow = (factor as f32 * t / max as f32) - (factor - 1.0) as f32;
                let d = head_dim as f64;
                let base = self.theta as f32 * grow.powf((d / (d - 2.0)) as f32);
                default_inv_freq(base, head_dim)
            }
            &RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                truncate,
                original_max_position_embeddings: old,
                ..
            } => yarn_inv_freq(self.theta, head_dim, (factor, beta_fast, beta_slow, truncate, old)),
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings: old,
                ..
            } => {
                // 1 / (ext · base^(2i/D)) in f32; the long factors past the original length.
                let ext = if seq_len as f64 > *old { long_factor } else { short_factor };
                let base = self.theta as f32;
                (0..head_dim / 2)
                    .map(|i| 1.0 / (ext[i] as f32 * base.powf((2 * i) as f32 / head_dim as f32)))
                    .collect()
            }
            &RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let (factor, low, high) = (factor as f32, low_freq_factor, high_freq_factor);
                let low_wavelen = (old / low) as f32;
                let high_wavelen = (old / high) as f32;
                inv.iter()
                    .map(|&f| {
                        // wavelen = 2π / inv_freq (reciprocal, then times the scalar)
                        let wavelen = (1.0 / f) * (2.0 * std::f64::consts::PI) as f32;
                        let scaled = if wavelen > low_wavelen { f / factor } else { f };
                        let smooth =
                            ((1.0 / wavelen) * old as f32 - low as f32) / (high - low) as f32;
                        let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                        // ~(wavelen < high) * ~(wavelen > low); wavelengths are never NaN
                        let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                        if medium {
                            smoothed
                        } else {
                            scaled
                        }
                    })
                    .collect()
            }
        }
    }

    /// The factor HF's rotary embedding multiplies cos and sin by (`attention_scaling`): yarn's
    /// attention factor, else 1.
    pub fn attention_scaling(&self) -> f32 {
        match self.scaling {
            RopeScaling::Yarn { attention_factor, .. }
            | RopeScaling::LongRope { attention_factor, .. } => attention_factor as f32,
            _ => 1.0,
        }
    }

    /// HF's `LlamaRotaryEmbedding.forward` at positions 0..T: cos and sin, each (T, D) row-major,
    /// of cat(freqs, freqs) with freqs = position · inv_freq in f32, times
    /// [`Rope::attention_scaling`].
    pub fn tables(&self, head_dim: usize, t: usize) -> (Vec<f32>, Vec<f32>) {
        let inv = self.inv_freq(head_dim, t);
        let scale = self.attention_scaling();
        let half = head_dim / 2;
        let (mut cos, mut sin) = (vec![0.0; t * head_dim], vec![0.0; t * head_dim]);
        for p in 0..t {
            for (i, &f) in inv.iter().enumerate() {
                let a = p as f32 * f;
                let (c, s) = (a.cos() * scale, a.sin() * scale);
                for j in [i, i + half] {
                    cos[p * head_dim + j] = c;
                    sin[p * head_dim + j] = s;
                }
            }
        }
        (cos, sin)
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

/// The config.json fields any of the four reads; absent ones take the type's HF default.
#[derive(Deserialize)]
struct Raw {
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    hidden_act: Option<String>,
    max_position_embeddings: Option<usize>,
    initializer_range: Option<f64>,
    rms_norm_eps: Option<f64>,
    pad_token_id: Option<i64>,
    tie_word_embeddings: Option<bool>,
    rope_parameters: Option<Value>,
    rope_scaling: Option<Value>,
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
    attention_bias: Option<bool>,
    attention_dropout: Option<f64>,
    mlp_bias: Option<bool>,
    #[serde(default, deserialize_with = "nullable")]
    sliding_window: Option<Option<usize>>,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    no_rope_layers: Option<Vec<i64>>,
    no_rope_layer_interval: Option<usize>,
    layer_types: Option<Vec<String>>,
    resid_pdrop: Option<f64>,
    query_pre_attn_scalar: Option<f64>,
    #[serde(default, deserialize_with = "nullable")]
    attn_logit_softcapping: Option<Option<f64>>,
    #[serde(default, deserialize_with = "nullable")]
    final_logit_softcapping: Option<Option<f64>>,
    sliding_window_pattern: Option<usize>,
}

/// A field whose explicit null differs from its absence (HF's default): absent is None, null
/// Some(None).
fn nullable<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Ok(Some(Option::<T>::deserialize(d)?))
}

fn parse_llama(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    parse(raw, origin, Variant::Llama)
}
fn parse_mistral(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    parse(raw, origin, Variant::Mistral)
}
fn parse_qwen2(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    parse(raw, origin, Variant::Qwen2)
}
fn parse_qwen3(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    parse(raw, origin, Variant::Qwen3)
}
fn parse_smollm3(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    parse(raw, origin, Variant::SmolLM3)
}
/// Phi3Config's `convert_rope_params_to_dict` and `validate_rope`: `standardize_rope_params`
/// first — for a `longrope` or `yarn` type the config's top-level
/// `original_max_position_embeddings` (default 4096) replaces the dict's — then `su` and `yarn`
/// become `longrope` (an `su` dict keeps its own original length); the only other type is
/// `default`.
fn parse_phi3(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    let mut raw = raw.clone();
    let original = raw.get("original_max_position_embeddings").cloned().unwrap_or(4096.into());
    for key in ["rope_scaling", "rope_parameters"] {
        if let Some(obj) = raw.get_mut(key).and_then(Value::as_object_mut) {
            let t = obj.get("rope_type").or_else(|| obj.get("type")).and_then(Value::as_str);
            let t = t.unwrap_or("default").to_string();
            if matches!(t.as_str(), "longrope" | "yarn") {
                obj.insert("original_max_position_embeddings".into(), original.clone());
            }
            match t.as_str() {
                "su" | "yarn" => {
                    obj.remove("type");
                    obj.insert("rope_type".into(), "longrope".into());
                }
                "default" | "longrope" => {}
                other => {
                    return Err(unsupported(
                        origin,
                        format!(
                            "Phi-3 rope_type '{other}' (Phi3Config takes default and longrope)"
                        ),
                    ))
                }
            }
        }
    }
    parse(&raw, origin, Variant::Phi3)
}

fn unsupported(origin: &str, what: String) -> ModelError {
    ModelError::Unsupported(format!("{origin}: {what}"))
}

/// [`FamilyInfo::parse`] of one model type: HF 5.23's defaults and `__post_init__`, then the
/// options not implemented refused by name.
pub(crate) fn parse(raw: &Value, origin: &str, variant: Variant) -> Result<Family, ModelError> {
    let r: Raw = hf_fields(raw, origin)?;
    use Variant::*;
    let d = variant.defaults();
    let phi3 = variant == Phi3;
    // Gemma's norms and embedding scale (all three); Gemma 2/3's layer (sandwich norms, score
    // scale, soft-capping).
    let gemma = matches!(variant, Gemma | Gemma2 | Gemma3);
    let sandwich = matches!(variant, Gemma2 | Gemma3);
    let hidden_size = r.hidden_size.unwrap_or(d.hidden_size);
    let heads = r.num_attention_heads.unwrap_or(d.heads);
    if heads == 0 {
        return Err(ModelError::BadConfig(format!(
            "{origin}: num_attention_heads must be positive"
        )));
    }
    // An explicit null is None in both: HF then takes num_attention_heads.
    let kv_present = raw.get("num_key_value_heads").is_some();
    let num_key_value_heads =
        if kv_present { r.num_key_value_heads } else { d.kv_heads }.unwrap_or(heads);
    let head_dim = match (r.head_dim, d.head_dim) {
        (Some(h), _) => h,
        (None, Some(h)) if raw.get("head_dim").is_none() => h,
        (None, _) => hidden_size / heads,
    };
    let hidden_act = r.hidden_act.clone().unwrap_or_else(|| d.hidden_act.into());
    let mlp_act = parse_activation(&hidden_act)?;
    if !matches!(mlp_act, Activation::Silu | Activation::GeluTanh) {
        return Err(unsupported(
            origin,
            format!(
                "{} hidden_act '{hidden_act}' (implemented: silu, gelu_pytorch_tanh)",
                variant.info().name
            ),
        ));
    }
    let max_position_embeddings = r.max_position_embeddings.unwrap_or(d.max_positions);
    // Attention and MLP biases: which fields each type reads.
    let attention_bias = r.attention_bias.unwrap_or(false);
    let (qkv_bias, o_bias) = match variant {
        Llama | Qwen3 | SmolLM3 | Gemma | Gemma2 | Gemma3 => (attention_bias, attention_bias),
        Mistral | Phi3 => (false, false),
        Qwen2 => (true, false),
    };
    let mlp_bias = matches!(variant, Llama | SmolLM3) && r.mlp_bias.unwrap_or(false);
    let layers = r.num_hidden_layers.unwrap_or(d.layers);
    let rope_layers = rope_layers(&r, origin, variant, layers)?;

    let (sliding_window, layer_types) = layer_windows(&r, origin, variant, layers, &rope_layers)?;
    let sliding_window = sliding_window.filter(|_| layer_types.contains(&LayerType::Sliding));
    let layer_types =
        if sliding_window.is_some() { layer_types } else { vec![LayerType::Full; layers] };
    if sliding_window == Some(0) {
        return Err(ModelError::BadConfig(format!("{origin}: sliding_window must be positive")));
    }
    let (rope, rotary_dim) =
        parse_rope(&r, origin, (max_position_embeddings, head_dim), d.rope_theta, phi3)?;
    // An explicit null pad_token_id is None; absent, the class default.
    let pad_token_id = match raw.get("pad_token_id") {
        None => d.pad_token_id,
        Some(_) => r.pad_token_id,
    };
    let attn_logit_softcapping =
        sandwich.then(|| r.attn_logit_softcapping.unwrap_or(d.attn_logit_softcapping)).flatten();
    let c = LlamaConfig {
        variant,
        vocab_size: r.vocab_size.unwrap_or(d.vocab_size),
        hidden_size,
        intermediate_size: r.intermediate_size.unwrap_or(d.intermediate_size),
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads,
        head_dim,
        rotary_dim,
        hidden_act,
        max_position_embeddings,
        initializer_range: r.initializer_range.unwrap_or(0.02),
        rms_norm_eps: r.rms_norm_eps.unwrap_or(d.rms_norm_eps),
        pad_token_id,
        tie_word_embeddings: r.tie_word_embeddings.unwrap_or(d.tie_word_embeddings),
        rope,
        qkv_bias,
        o_bias,
        mlp_bias,
        qk_norm: matches!(variant, Qwen3 | Gemma3),
        attention_dropout: r.attention_dropout.unwrap_or(0.0),
        sliding_window,
        layer_types,
        rope_layers,
        fused_projections: phi3,
        resid_dropout: phi3.then(|| r.resid_pdrop.unwrap_or(0.0)),
        norm_offset: gemma,
        // torch.tensor(hidden_size**0.5): the f64 root as an f32.
        embed_scale: gemma.then(|| (hidden_size as f64).sqrt() as f32),
        mlp_act,
        query_pre_attn_scalar: d
            .query_pre_attn_scalar
            .map(|s| r.query_pre_attn_scalar.unwrap_or(s)),
        attn_logit_softcapping,
        final_logit_softcapping: sandwich
            .then(|| r.final_logit_softcapping.unwrap_or(d.final_logit_softcapping))
            .flatten(),
        sandwich_norms: sandwich,
        // HF's sdpa refuses soft-capping: a Gemma 3 with it runs eager there too.
        eager_attention: variant == Gemma2 || attn_logit_softcapping.is_some(),
        local_rope: None,
    };
    c.check(origin)?;
    Ok(Family::Llama(c))
}

/// A model type's config class defaults (HF 5.23), where the types differ.
struct Defaults {
    hidden_size: usize,
    intermediate_size: usize,
    layers: usize,
    heads: usize,
    /// None: num_attention_heads.
    kv_heads: Option<usize>,
    /// None: hidden_size / heads.
    head_dim: Option<usize>,
    hidden_act: &'static str,
    max_positions: usize,
    vocab_size: usize,
    rope_theta: f64,
    rms_norm_eps: f64,
    pad_token_id: Option<i64>,
    tie_word_embeddings: bool,
    /// Gemma 2/3's (None: the type has no such field).
    query_pre_attn_scalar: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
}

impl Variant {
    /// configuration_{llama,mistral,qwen2,qwen3,smollm3,phi3,gemma,gemma2,gemma3}.py's class
    /// attributes.
    fn defaults(self) -> Defaults {
        use Variant::*;
        let llama = Defaults {
            hidden_size: 4096,
            intermediate_size: 11008,
            layers: 32,
            heads: 32,
            kv_heads: None,
            head_dim: None,
            hidden_act: "silu",
            max_positions: 2048,
            vocab_size: 32000,
            rope_theta: 10_000.0,
            rms_norm_eps: 1e-6,
            pad_token_id: None,
            tie_word_embeddings: false,
            query_pre_attn_scalar: None,
            attn_logit_softcapping: None,
            final_logit_softcapping: None,
        };
        match self {
            Llama => llama,
            Mistral => Defaults {
                intermediate_size: 14336,
                kv_heads: Some(8),
                max_positions: 4096 * 32,
                ..llama
            },
            Qwen2 | Qwen3 => Defaults {
                intermediate_size: 22016,
                kv_heads: Some(32),
                // Qwen3's head_dim stays 128, not hidden_size / heads.
                head_dim: (self == Qwen3).then_some(128),
                max_positions: 32768,
                vocab_size: 151936,
                ..llama
            },
            SmolLM3 => Defaults {
                hidden_size: 2048,
                layers: 36,
                heads: 16,
                kv_heads: Some(4),
                max_positions: 32768,
                vocab_size: 128256,
                rope_theta: 2_000_000.0,
                pad_token_id: Some(128004),
                tie_word_embeddings: true,
                ..llama
            },
            Phi3 => Defaults {
                hidden_size: 3072,
                intermediate_size: 8192,
                max_positions: 4096,
                vocab_size: 32064,
                rms_norm_eps: 1e-5,
                pad_token_id: Some(32000),
                ..llama
            },
            Gemma => Defaults {
                hidden_size: 3072,
                intermediate_size: 24576,
                layers: 28,
                heads: 16,
                kv_heads: Some(16),
                head_dim: Some(256),
                hidden_act: "gelu_pytorch_tanh",
                max_positions: 8192,
                vocab_size: 256000,
                pad_token_id: Some(0),
                tie_word_embeddings: true,
                ..llama
            },
            Gemma2 | Gemma3 => Defaults {
                hidden_size: 2304,
                intermediate_size: 9216,
                layers: 26,
                heads: 8,
                kv_heads: Some(4),
                head_dim: Some(256),
                hidden_act: "gelu_pytorch_tanh",
                max_positions: if self == Gemma2 { 8192 } else { 131_072 },
                vocab_size: if self == Gemma2 { 256_000 } else { 262_208 },
                // Gemma 3's: the full layers' (the sliding layers' is 10 000, `gemma`).
                rope_theta: if self == Gemma2 { 10_000.0 } else { 1_000_000.0 },
                pad_token_id: Some(0),
                tie_word_embeddings: true,
                query_pre_attn_scalar: Some(256.0),
                attn_logit_softcapping: (self == Gemma2).then_some(50.0),
                final_logit_softcapping: (self == Gemma2).then_some(30.0),
                ..llama
            },
        }
    }
}

impl LlamaConfig {
    /// The sizes and probabilities a model of the family can run with.
    fn check(&self, origin: &str) -> Result<(), ModelError> {
        let bad = |what: String| Err(ModelError::BadConfig(format!("{origin}: {what}")));
        let (heads, kv) = (self.num_attention_heads, self.num_key_value_heads);
        if kv == 0 || !heads.is_multiple_of(kv) {
            return bad(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}"
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim {} must be even (rotary embeddings rotate halves)",
                self.head_dim
            ));
        }
        if let Some(p) = self.resid_dropout.filter(|p| !(0.0..1.0).contains(p)) {
            return bad(format!("resid_pdrop {p} is not in [0, 1)"));
        }
        if !(0.0..1.0).contains(&self.attention_dropout) {
            return bad(format!("attention_dropout {} is not in [0, 1)", self.attention_dropout));
        }
        for (name, v) in [
            ("query_pre_attn_scalar", self.query_pre_attn_scalar),
            ("attn_logit_softcapping", self.attn_logit_softcapping),
            ("final_logit_softcapping", self.final_logit_softcapping),
        ] {
            if let Some(v) = v.filter(|v| v.is_nan() || *v <= 0.0) {
                return bad(format!("{name} {v} must be positive"));
            }
        }
        Ok(())
    }
}

/// The window and each layer's attention type (configuration_mistral, _qwen2, _qwen3,
/// _smollm3): Mistral slides every layer (window 4096 when absent); Qwen2/3 and SmolLM3 only
/// with `use_sliding_window`, per `layer_types` or, without it, from `max_window_layers`
/// (Qwen) or the NoPE layers (SmolLM3); Llama never.
fn layer_windows(
    r: &Raw,
    origin: &str,
    variant: Variant,
    layers: usize,
    rope_layers: &[bool],
) -> Result<(Option<usize>, Vec<LayerType>), ModelError> {
    use Variant::*;
    let window_field = match r.sliding_window {
        None if matches!(variant, SmolLM3 | Phi3) => None, // absent: the class default
        None => Some(4096),
        Some(w) => w,
    };
    Ok(match variant {
        Llama | Gemma => (None, vec![LayerType::Full; layers]),
        Mistral => (window_field, vec![LayerType::Sliding; layers]),
        // Phi3Model: every layer slides when sliding_window is set (default none).
        Phi3 => (r.sliding_window.flatten(), vec![LayerType::Sliding; layers]),
        // Gemma 2: every other layer slides (the first does); Gemma 3: all but every
        // `sliding_window_pattern`-th (6). A window is needed then (HF's sliding mask reads it).
        Gemma2 | Gemma3 => {
            let every = if variant == Gemma2 { 2 } else { r.sliding_window_pattern.unwrap_or(6) };
            if every == 0 {
                return Err(ModelError::BadConfig(format!(
                    "{origin}: sliding_window_pattern must be positive"
                )));
            }
            let types =
                match &r.layer_types {
                    Some(names) => named_layer_types(names, origin, layers)?,
                    None => (0..layers)
                        .map(|i| {
                            if (i + 1) % every != 0 {
                                LayerType::Sliding
                            } else {
                                LayerType::Full
                            }
                        })
                        .collect(),
                };
            if window_field.is_none() && types.contains(&LayerType::Sliding) {
                return Err(ModelError::BadConfig(format!(
                    "{origin}: sliding_attention layers need a sliding_window (it is null)"
                )));
            }
            (window_field, types)
        }
        Qwen2 | Qwen3 | SmolLM3 => {
            let window = window_field.filter(|_| r.use_sliding_window.unwrap_or(false));
            let types = match &r.layer_types {
                Some(names) => named_layer_types(names, origin, layers)?,
                // SmolLM3: the NoPE layers slide, when a window is on.
                None if variant == SmolLM3 => (0..layers)
                    .map(|i| {
                        if window.is_some() && !rope_layers[i] {
                            LayerType::Sliding
                        } else {
                            LayerType::Full
                        }
                    })
                    .collect(),
                None => {
                    let from = r.max_window_layers.unwrap_or(28);
                    (0..layers)
                        .map(|i| {
                            if window.is_some() && i >= from {
                                LayerType::Sliding
                            } else {
                                LayerType::Full
                            }
                        })
                        .collect()
                }
            };
            if window.is_none() && types.contains(&LayerType::Sliding) {
                return Err(ModelError::BadConfig(format!(
                    "{origin}: layer_types has sliding_attention layers but no sliding_window (use_sliding_window is false or sliding_window null)"
                )));
            }
            (window, types)
        }
    })
}

/// HF's `layer_types` names, one per layer.
fn named_layer_types(
    names: &[String],
    origin: &str,
    layers: usize,
) -> Result<Vec<LayerType>, ModelError> {
    if names.len() != layers {
        return Err(ModelError::BadConfig(format!(
            "{origin}: layer_types has {} entries for {layers} layers",
            names.len()
        )));
    }
    names
        .iter()
        .map(|n| match n.as_str() {
            "full_attention" => Ok(LayerType::Full),
            "sliding_attention" => Ok(LayerType::Sliding),
            other => Err(unsupported(origin, format!("layer type '{other}'"))),
        })
        .collect()
}

/// SmolLM3's `no_rope_layers` (1: the layer applies the rotary embedding; default every layer
/// but each `no_rope_layer_interval`-th, 4); every layer for the other types.
fn rope_layers(
    r: &Raw,
    origin: &str,
    variant: Variant,
    layers: usize,
) -> Result<Vec<bool>, ModelError> {
    if variant != Variant::SmolLM3 {
        return Ok(vec![true; layers]);
    }
    match &r.no_rope_layers {
        Some(flags) => {
            if flags.len() != layers {
                return Err(ModelError::BadConfig(format!(
                    "{origin}: no_rope_layers has {} entries for {layers} layers",
                    flags.len()
                )));
            }
            Ok(flags.iter().map(|&f| f != 0).collect())
        }
        None => {
            let every = r.no_rope_layer_interval.unwrap_or(4);
            if every == 0 {
                return Err(ModelError::BadConfig(format!(
                    "{origin}: no_rope_layer_interval must be positive"
                )));
            }
            Ok((0..layers).map(|i| (i + 1) % every != 0).collect())
        }
    }
}

/// HF's `convert_rope_params_to_dict` + `standardize_rope_params`: `rope_scaling` (legacy) or
/// `rope_parameters`, `rope_theta` from the dict, else the top level, else 10000; the type from
/// `rope_type` (or legacy `type`); llama3's and yarn's `original_max_position_embeddings` from
/// the dict, else `max_position_embeddings` ([`original_length`]). Returns the rope and the
/// rotary dimensions: `int(head_dim · partial_rotary_factor)` where the type computes a partial
/// rotary embedding (`partial`: Phi-3's `apply_rotary_pos_emb` passes the rest through; the
/// others' would fail on it, so a factor other than 1 is refused there).
fn parse_rope(
    r: &Raw,
    origin: &str,
    (max_positions, head_dim): (usize, usize),
    default_theta: f64,
    partial_allowed: bool,
) -> Result<(Rope, usize), ModelError> {
    let params = r
        .rope_scaling
        .clone()
        .filter(|v| !v.is_null())
        .or_else(|| r.rope_parameters.clone().filter(|v| !v.is_null()))
        .unwrap_or_else(|| Value::Object(Default::default()));
    let obj = params.as_object().ok_or_else(|| {
        ModelError::BadConfig(format!("{origin}: rope_parameters must be an object, got {params}"))
    })?;
    let num = |key: &str| obj.get(key).and_then(Value::as_f64);
    let theta = num("rope_theta").or(r.rope_theta).unwrap_or(default_theta);
    let rope_type = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let partial = num("partial_rotary_factor").or(r.partial_rotary_factor).unwrap_or(1.0);
    if partial != 1.0 && !partial_allowed {
        return Err(unsupported(
            origin,
            format!(
                "partial_rotary_factor {partial} (this model type's rotary embedding takes the whole head; Phi-3's takes a part)"
            ),
        ));
    }
    // HF: dim = int(head_dim * partial_rotary_factor).
    let rot = (head_dim as f64 * partial) as usize;
    if rot == 0 || rot > head_dim || !rot.is_multiple_of(2) {
        return Err(ModelError::BadConfig(format!(
            "{origin}: partial_rotary_factor {partial} gives {rot} rotary dimensions of head_dim {head_dim} (need an even number in 2..=head_dim)"
        )));
    }
    let head_dim = rot;
    let scaling = match rope_type {
        "default" => RopeScaling::Default,
        "llama3" => {
            let need = |key: &str| {
                num(key).ok_or_else(|| {
                    ModelError::BadConfig(format!("{origin}: llama3 rope_parameters need '{key}'"))
                })
            };
            let old = original_length(&num, r, origin, max_positions);
            RopeScaling::Llama3 {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max_position_embeddings: old,
            }
        }
        "linear" => RopeScaling::Linear { factor: need_factor(&num, origin, "linear")? },
        "dynamic" => RopeScaling::Dynamic {
            factor: need_factor(&num, origin, "dynamic")?,
            max_position_embeddings: max_positions as f64,
        },
        "yarn" => parse_yarn(obj, r, origin, max_positions)?,
        "longrope" => parse_longrope(obj, r, origin, max_positions, head_dim)?,
        other => {
            return Err(unsupported(
                origin,
                format!(
                    "rope_type '{other}' (implemented: default, llama3, linear, dynamic, yarn, longrope)"
                ),
            ))
        }
    };
    Ok((Rope { theta, scaling }, head_dim))
}

/// llama3's and yarn's pretraining length as HF 5.23's Llama-family configs standardise it:
/// `rope_parameters["original_max_position_embeddings"]`, else `max_position_embeddings`. A
/// top-level `original_max_position_embeddings` is not read there (only Phi-3's config class
/// has the attribute that would take it): it is ignored as HF ignores it, with a warning.
fn original_length(
    num: &dyn Fn(&str) -> Option<f64>,
    r: &Raw,
    origin: &str,
    max_positions: usize,
) -> f64 {
    let old = num("original_max_position_embeddings").unwrap_or(max_positions as f64);
    if let Some(top) = r.original_max_position_embeddings.filter(|&t| t != old) {
        eprintln!(
            "warning: {origin}: the top-level original_max_position_embeddings {top} is not what \
             HF 5.23 reads for this family; rope uses {old} (rope_parameters' or \
             max_position_embeddings), as HF does"
        );
    }
    old
}

/// longrope's parameters as `_compute_longrope_parameters` reads them: `short_factor` and
/// `long_factor` (D/2 numbers each; HF only warns on another length, and then fails in the
/// forward: refused here), the original length ([`original_length`]), `factor` (else
/// max_position / original) and `attention_factor` (else 1 for a factor ≤ 1, else
/// √(1 + ln(factor)/ln(original))).
fn parse_longrope(
    obj: &serde_json::Map<String, Value>,
    r: &Raw,
    origin: &str,
    max_positions: usize,
    head_dim: usize,
) -> Result<RopeScaling, ModelError> {
    let num = |key: &str| obj.get(key).and_then(Value::as_f64);
    let list = |key: &str| -> Result<Vec<f64>, ModelError> {
        let v: Option<Vec<f64>> = obj
            .get(key)
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_f64).collect());
        match v {
            Some(v) if v.len() == head_dim / 2 => Ok(v),
            _ => Err(ModelError::BadConfig(format!(
                "{origin}: longrope rope_parameters need '{key}': {} numbers (rotary dimensions / 2), got {}",
                head_dim / 2,
                obj.get(key).map_or("none".into(), |v| v.to_string())
            ))),
        }
    };
    let old = original_length(&num, r, origin, max_positions);
    let factor = num("factor").unwrap_or(max_positions as f64 / old);
    let attention_factor = num("attention_factor").unwrap_or(if factor <= 1.0 {
        1.0
    } else {
        (1.0 + factor.ln() / old.ln()).sqrt()
    });
    Ok(RopeScaling::LongRope {
        short_factor: list("short_factor")?,
        long_factor: list("long_factor")?,
        attention_factor,
        original_max_position_embeddings: old,
    })
}

/// `factor` of a rope type that needs it.
fn need_factor(
    num: &dyn Fn(&str) -> Option<f64>,
    origin: &str,
    rope_type: &str,
) -> Result<f64, ModelError> {
    num("factor").ok_or_else(|| {
        ModelError::BadConfig(format!("{origin}: {rope_type} rope_parameters need 'factor'"))
    })
}

/// yarn's parameters as `_compute_yarn_parameters` reads them: `factor` (else max_position /
/// original), `attention_factor` (else from `mscale` and `mscale_all_dim`, else
/// 0.1·ln(factor) + 1), `beta_fast` 32, `beta_slow` 1, `truncate` true; the original length from
/// the top level, else the dict, else `max_position_embeddings`. As HF 5.23 warns when the
/// factor is not max_position / original (and that ratio is not 1), and then uses the factor.
fn parse_yarn(
    obj: &serde_json::Map<String, Value>,
    r: &Raw,
    origin: &str,
    max_positions: usize,
) -> Result<RopeScaling, ModelError> {
    let num = |key: &str| obj.get(key).and_then(Value::as_f64);
    let old = original_length(&num, r, origin, max_positions);
    let implicit = max_positions as f64 / old;
    // HF reads rope_parameters["factor"] (a missing key fails there); null means the ratio.
    let factor = match obj.get("factor") {
        None => {
            return Err(ModelError::BadConfig(format!(
                "{origin}: yarn rope_parameters need 'factor'"
            )))
        }
        Some(v) => v.as_f64().unwrap_or(implicit),
    };
    if implicit != factor && implicit != 1.0 {
        eprintln!(
            "warning: {origin}: yarn factor {factor} is not max_position_embeddings / \
             original_max_position_embeddings = {implicit}; the factor is used (as HF 5.23 does)"
        );
    }
    let mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
    let attention_factor = match (num("attention_factor"), num("mscale"), num("mscale_all_dim")) {
        (Some(a), _, _) => a,
        // HF: `if mscale and mscale_all_dim` (0 counts as absent).
        (None, Some(m), Some(a)) if m != 0.0 && a != 0.0 => mscale(factor, m) / mscale(factor, a),
        _ => mscale(factor, 1.0),
    };
    let or = |key: &str, d: f64| num(key).filter(|&v| v != 0.0).unwrap_or(d);
    let truncate = match obj.get("truncate") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ModelError::BadConfig(format!(
                "{origin}: yarn 'truncate' must be a bool, got {v}"
            )))
        }
    };
    Ok(RopeScaling::Yarn {
        factor,
        attention_factor,
        beta_fast: or("beta_fast", 32.0),
        beta_slow: or("beta_slow", 1.0),
        truncate,
        original_max_position_embeddings: old,
    })
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
