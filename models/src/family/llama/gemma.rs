//! Gemma 1, 2 and 3's config rules (configuration_gemma{,2,3}.py, HF 5.23) on top of the
//! family's [`parse`]: the activation's field, refused options, and Gemma 3's rope per layer
//! type. What the types compute differently is in [`LlamaConfig`]'s switches.

use serde_json::{Map, Value};

use super::config::{parse, unsupported, Raw};
use super::rope::parse_rope;
use super::{Family, Variant};
use crate::config::hf_fields;
use crate::ModelError;

/// GemmaConfig's `__post_init__`: `hidden_act` "gelu" (the official releases' legacy value) is
/// the tanh approximation; bidirectional attention is refused.
pub(super) fn parse_gemma(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    let mut raw = refuse_bidirectional(raw, origin)?;
    if let Some(obj) = raw.as_object_mut() {
        if obj.get("hidden_act").and_then(Value::as_str) == Some("gelu") {
            obj.insert("hidden_act".into(), "gelu_pytorch_tanh".into());
        }
    }
    parse(&raw, origin, Variant::Gemma)
}

/// Gemma2Config: the MLP's activation from `hidden_activation`.
pub(super) fn parse_gemma2(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    let raw = activation_field(&refuse_bidirectional(raw, origin)?, origin);
    parse(&raw, origin, Variant::Gemma2)
}

/// Gemma3TextConfig: the MLP's activation from `hidden_activation`; the full layers' rope
/// and the sliding layers' ([`rope_dicts`]).
pub(super) fn parse_gemma3(raw: &Value, origin: &str) -> Result<Family, ModelError> {
    let raw = activation_field(&refuse_bidirectional(raw, origin)?, origin);
    let (full, sliding) = rope_dicts(&raw, origin)?;
    // Each parsed as a Llama-family `rope_parameters` dict (the type's own rules).
    let with = |params: Map<String, Value>| {
        let mut r = raw.clone();
        let obj = r.as_object_mut().expect("a config is an object");
        obj.insert("rope_parameters".into(), Value::Object(params));
        obj.remove("rope_scaling");
        obj.remove("rope_theta");
        r
    };
    let Family::Llama(mut c) = parse(&with(full), origin, Variant::Gemma3)? else {
        unreachable!("parse gives a Llama-family config")
    };
    let r: Raw = hf_fields(&with(sliding), origin)?;
    let positions = (c.max_position_embeddings, c.head_dim);
    let (local, _) = parse_rope(&r, origin, positions, LOCAL_THETA, false)?;
    c.local_rope = Some(Box::new(local));
    Ok(Family::Llama(c))
}

/// One layer type's `rope_parameters` dict.
type RopeDict = Map<String, Value>;

/// Gemma3TextConfig's `default_theta`: the full layers' base, and the sliding layers'.
const GLOBAL_THETA: f64 = 1_000_000.0;
const LOCAL_THETA: f64 = 10_000.0;

/// Gemma3TextConfig's `convert_rope_params_to_dict`: `rope_parameters` holds one dict per
/// layer type (each `{"rope_type": "default"}` when absent); a legacy `rope_scaling` updates the
/// full layers'; `rope_theta` defaults the full layers' base (else 1e6), `rope_local_base_freq`
/// the sliding layers' (else 1e4). A flat dict (the other types' form) is refused.
fn rope_dicts(raw: &Value, origin: &str) -> Result<(RopeDict, RopeDict), ModelError> {
    let default = || Map::from_iter([("rope_type".to_string(), Value::from("default"))]);
    let params = match raw.get("rope_parameters") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(v) => {
            return Err(ModelError::BadConfig(format!(
                "{origin}: rope_parameters must be an object, got {v}"
            )))
        }
    };
    if let Some(k) =
        params.keys().find(|k| !matches!(k.as_str(), "full_attention" | "sliding_attention"))
    {
        return Err(ModelError::BadConfig(format!(
            "{origin}: Gemma 3's rope_parameters hold one dict per layer type (full_attention, sliding_attention), not '{k}'"
        )));
    }
    let dict = |key: &str| -> Result<Option<Map<String, Value>>, ModelError> {
        match params.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m.clone())),
            Some(v) => Err(ModelError::BadConfig(format!(
                "{origin}: rope_parameters[\"{key}\"] must be an object, got {v}"
            ))),
        }
    };
    let mut full = dict("full_attention")?.unwrap_or_else(default);
    if let Some(Value::Object(scaling)) = raw.get("rope_scaling") {
        full.extend(scaling.clone());
    }
    let mut sliding = dict("sliding_attention")?.unwrap_or_else(default);
    let top =
        |key: &str, d: f64| raw.get(key).filter(|v| !v.is_null()).cloned().unwrap_or(d.into());
    full.entry("rope_theta").or_insert_with(|| top("rope_theta", GLOBAL_THETA));
    sliding.entry("rope_theta").or_insert_with(|| top("rope_local_base_freq", LOCAL_THETA));
    Ok((full, sliding))
}

/// Gemma 2/3's MLP reads `hidden_activation` (default gelu_pytorch_tanh), never `hidden_act`: a
/// differing `hidden_act` is ignored, as HF ignores it, with a warning.
fn activation_field(raw: &Value, origin: &str) -> Value {
    let mut raw = raw.clone();
    let Some(obj) = raw.as_object_mut() else { return raw };
    let given = obj.remove("hidden_act");
    let used = obj.get("hidden_activation").filter(|v| !v.is_null()).cloned();
    if let Some(given) = &given {
        let used = used.clone().unwrap_or("gelu_pytorch_tanh".into());
        if *given != used {
            eprintln!(
                "warning: {origin}: hidden_act {given} is not what this model type's MLP reads; it uses hidden_activation {used}, as HF does"
            );
        }
    }
    if let Some(used) = used {
        obj.insert("hidden_act".into(), used);
    }
    raw
}

/// `use_bidirectional_attention` (EmbeddingGemma's encoder form) is not implemented.
fn refuse_bidirectional(raw: &Value, origin: &str) -> Result<Value, ModelError> {
    if raw.get("use_bidirectional_attention").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported(origin, "Gemma with use_bidirectional_attention".into()));
    }
    Ok(raw.clone())
}
