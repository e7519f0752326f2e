//! Rotary position embeddings as HF 5.23 computes them (`modeling_rope_utils`): the rope types
//! implemented, their `inv_freq` in f32 as torch computes it, the cos/sin tables, and the
//! `rope_parameters` (or legacy `rope_scaling`) that choose them.

use serde_json::Value;

use super::config::{unsupported, Raw};
use crate::ModelError;

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

/// HF's `convert_rope_params_to_dict` + `standardize_rope_params`: `rope_scaling` (legacy) or
/// `rope_parameters`, `rope_theta` from the dict, else the top level, else 10000; the type from
/// `rope_type` (or legacy `type`); llama3's and yarn's `original_max_position_embeddings` from
/// the dict, else `max_position_embeddings` ([`original_length`]). Returns the rope and the
/// rotary dimensions: `int(head_dim · partial_rotary_factor)` where the type computes a partial
/// rotary embedding (`partial`: Phi-3's `apply_rotary_pos_emb` passes the rest through; the
/// others' would fail on it, so a factor other than 1 is refused there).
pub(super) fn parse_rope(
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
