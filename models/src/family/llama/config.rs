//! A Llama-family config.json read as HF 5.23 reads it: each model type's class defaults and
//! `__post_init__`, the sliding and NoPE layers, the checks; what is not implemented refused by
//! name. The rotary parameters are `rope`'s, Gemma's rules `gemma`'s.

use serde::Deserialize;
use serde_json::Value;

use super::rope::parse_rope;
use super::{LayerType, LlamaConfig, Variant};
use crate::config::{hf_fields, parse_activation, Activation};
use crate::family::Family;
use crate::ModelError;

/// The config.json fields the family reads; absent ones take the type's HF default (the
/// rotary ones, which `rope` reads, are `pub(super)`).
#[derive(Deserialize)]
pub(super) struct Raw {
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
    pub(super) rope_parameters: Option<Value>,
    pub(super) rope_scaling: Option<Value>,
    pub(super) rope_theta: Option<f64>,
    pub(super) partial_rotary_factor: Option<f64>,
    pub(super) original_max_position_embeddings: Option<f64>,
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

pub(super) fn parse_llama(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    parse(raw, origin, Variant::Llama)
}
pub(super) fn parse_mistral(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    parse(raw, origin, Variant::Mistral)
}
pub(super) fn parse_qwen2(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    parse(raw, origin, Variant::Qwen2)
}
pub(super) fn parse_qwen3(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    parse(raw, origin, Variant::Qwen3)
}
pub(super) fn parse_smollm3(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    parse(raw, origin, Variant::SmolLM3)
}
/// Phi3Config's `convert_rope_params_to_dict` and `validate_rope`: `standardize_rope_params`
/// first — for a `longrope` or `yarn` type the config's top-level
/// `original_max_position_embeddings` (default 4096) replaces the dict's — then `su` and `yarn`
/// become `longrope` (an `su` dict keeps its own original length); the only other type is
/// `default`.
pub(super) fn parse_phi3(raw: &Value, origin: &str) -> Result<Family, ModelError> {
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

pub(super) fn unsupported(origin: &str, what: String) -> ModelError {
    ModelError::Unsupported(format!("{origin}: {what}"))
}

/// [`FamilyInfo::parse`] of one model type: HF 5.23's defaults and `__post_init__`, then the
/// options not implemented refused by name.
pub(super) fn parse(raw: &Value, origin: &str, variant: Variant) -> Result<Family, ModelError> {
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
