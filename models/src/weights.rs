//! Model weights as named f32 tensors: HF initialisation from a seed, and safetensors
//! load/save under HF checkpoint names (so `model.safetensors` files move between ortbench,
//! the engine and HF Transformers unchanged).

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use crate::config::ModelConfig;
use crate::params::{param_specs, Init, ParamSpec};
use crate::rng::Rng;
use crate::ModelError;

#[derive(Clone, Debug, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// All parameters of one model, in `param_specs` order.
#[derive(Clone, Debug)]
pub struct Weights {
    pub tensors: Vec<NamedTensor>,
}

/// What a load found, as HF's loading report does (missing keys are initialised, unexpected
/// ones ignored).
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    pub loaded: usize,
    pub missing: Vec<String>,
    pub unexpected: Vec<String>,
}

fn init_tensor(spec: &ParamSpec, seed: u64) -> Vec<f32> {
    let n = spec.numel();
    let mut rng = Rng::for_stream(seed, &spec.name);
    match spec.init {
        Init::Zeros => vec![0.0; n],
        Init::Ones => vec![1.0; n],
        Init::Normal { std } => (0..n).map(|_| (rng.normal() * std) as f32).collect(),
        Init::NormalPadRow { std, row } => {
            let mut v: Vec<f32> = (0..n).map(|_| (rng.normal() * std) as f32).collect();
            let width = spec.shape[1];
            v[row * width..(row + 1) * width].fill(0.0);
            v
        }
    }
}

impl Weights {
    /// HF initialisation (`_init_weights`) drawn from `seed`; each parameter has its own
    /// stream, so a value does not depend on the model's other parameters.
    pub fn init(cfg: &ModelConfig, seed: u64) -> Self {
        let tensors = param_specs(cfg)
            .iter()
            .map(|s| NamedTensor {
                name: s.name.clone(),
                shape: s.shape.clone(),
                data: init_tensor(s, seed),
            })
            .collect();
        Weights { tensors }
    }

    pub fn get(&self, name: &str) -> Option<&NamedTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    pub fn param_count(&self) -> usize {
        self.tensors.iter().map(|t| t.data.len()).sum()
    }

    /// Loads `path` (a `.safetensors` file) for `cfg`. Accepts what HF's loader accepts:
    /// legacy `gamma`/`beta` LayerNorm names, checkpoints saved without the base-model prefix
    /// (the hub's `gpt2` has `h.0…` rather than `transformer.h.0…`), tied weights saved under
    /// either name, and f32/f16/bf16/f64 storage. Missing parameters get HF initialisation
    /// from `seed` (as a classifier head does when fine-tuning) and are reported.
    pub fn load(
        cfg: &ModelConfig,
        path: &Path,
        seed: u64,
    ) -> Result<(Self, LoadReport), ModelError> {
        let bytes = std::fs::read(path)
            .map_err(|e| ModelError::Weights(format!("cannot read {}: {e}", path.display())))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| {
            ModelError::Weights(format!("{} is not a valid safetensors file: {e}", path.display()))
        })?;
        let specs = param_specs(cfg);
        let expected: HashMap<&str, &ParamSpec> =
            specs.iter().map(|s| (s.name.as_str(), s)).collect();
        let family = cfg.arch.family();
        let prefix = family.base_prefix;

        // Map every file key onto our canonical name.
        let mut by_name: HashMap<String, String> = HashMap::new();
        let mut report = LoadReport::default();
        for key in st.names() {
            let mut name = key.to_string();
            if let Some(stem) = name.strip_suffix(".gamma") {
                name = format!("{stem}.weight");
            } else if let Some(stem) = name.strip_suffix(".beta") {
                name = format!("{stem}.bias");
            }
            if !expected.contains_key(name.as_str()) {
                let prefixed = format!("{prefix}.{name}");
                if expected.contains_key(prefixed.as_str()) {
                    name = prefixed;
                }
            }
            // Tied weights may be saved under the head's name.
            if cfg.tie_word_embeddings() && (name == family.untied_head || name == "lm_head.weight")
            {
                name = family.word_embedding.to_string();
            }
            if let Some((_, ours)) = family.checkpoint_aliases.iter().find(|(old, _)| *old == name)
            {
                name = ours.to_string();
            }
            if expected.contains_key(name.as_str()) {
                by_name.entry(name).or_insert_with(|| key.to_string());
            } else {
                report.unexpected.push(key.to_string());
            }
        }

        let mut tensors = Vec::with_capacity(specs.len());
        for spec in &specs {
            match by_name.get(&spec.name) {
                Some(key) => {
                    let view = st.tensor(key).map_err(|e| {
                        ModelError::Weights(format!("{}: {key}: {e}", path.display()))
                    })?;
                    if view.shape() != spec.shape.as_slice() {
                        return Err(ModelError::Weights(format!(
                            "{}: '{key}' has shape {:?}, the config expects {:?} for {}",
                            path.display(),
                            view.shape(),
                            spec.shape,
                            spec.name
                        )));
                    }
                    let data = to_f32(&view).map_err(|e| {
                        ModelError::Weights(format!("{}: '{key}': {e}", path.display()))
                    })?;
                    tensors.push(NamedTensor {
                        name: spec.name.clone(),
                        shape: spec.shape.clone(),
                        data,
                    });
                    report.loaded += 1;
                }
                None => {
                    report.missing.push(spec.name.clone());
                    tensors.push(NamedTensor {
                        name: spec.name.clone(),
                        shape: spec.shape.clone(),
                        data: init_tensor(spec, seed),
                    });
                }
            }
        }
        if report.loaded == 0 {
            return Err(ModelError::Weights(format!(
                "{} holds none of the {} parameters of a {} with this config (e.g. '{}'): wrong model?",
                path.display(),
                specs.len(),
                cfg.arch.hf_name(),
                specs[0].name
            )));
        }
        report.unexpected.sort();
        Ok((Weights { tensors }, report))
    }

    /// The engine's flat parameter buffer for `cfg`: the tensors in `param_specs` order at the
    /// engine's aligned offsets (`ortbench_engine::graph::flat_offsets`), zero in the pads
    /// (looked up by name; a missing or misshapen one is an error naming it).
    pub fn flat(&self, cfg: &ModelConfig) -> Result<Vec<f32>, ModelError> {
        let specs = param_specs(cfg);
        let (offsets, len) =
            ortbench_engine::graph::flat_offsets(specs.iter().map(ParamSpec::numel));
        let mut out = vec![0.0; len];
        for (spec, offset) in specs.iter().zip(offsets) {
            let t = self
                .get(&spec.name)
                .ok_or_else(|| ModelError::Weights(format!("weights have no '{}'", spec.name)))?;
            if t.shape != spec.shape {
                return Err(ModelError::Weights(format!(
                    "'{}' has shape {:?}, the model needs {:?}",
                    spec.name, t.shape, spec.shape
                )));
            }
            out[offset..offset + t.data.len()].copy_from_slice(&t.data);
        }
        Ok(out)
    }

    /// Saves as HF does: f32, tied weights once, metadata `{"format": "pt"}`. Written to a
    /// temporary file and renamed, so a reader never sees a half-written file.
    pub fn save(&self, path: &Path) -> Result<(), ModelError> {
        let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = self
            .tensors
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    t.shape.clone(),
                )
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(n, b, s)| Ok((n.clone(), TensorView::new(Dtype::F32, s.clone(), b)?)))
            .collect::<Result<_, safetensors::SafeTensorError>>()
            .map_err(|e| ModelError::Weights(e.to_string()))?;
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let tmp = path.with_extension("safetensors.tmp");
        safetensors::serialize_to_file(views, Some(meta), &tmp)
            .map_err(|e| ModelError::Weights(format!("cannot write {}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| ModelError::Weights(format!("cannot write {}: {e}", path.display())))
    }
}

fn to_f32(view: &TensorView<'_>) -> Result<Vec<f32>, String> {
    let b = view.data();
    Ok(match view.dtype() {
        Dtype::F32 => {
            b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
        }
        Dtype::F16 => {
            b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        Dtype::BF16 => {
            b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        Dtype::F64 => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
            .collect(),
        other => return Err(format!("dtype {other:?} is not a floating-point weight type")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::builtin_config;

    #[test]
    fn init_follows_hf_statistics() {
        let cfg = builtin_config("gpt2").unwrap();
        let w = Weights::init(&cfg, 0);
        let std_of = |name: &str| {
            let d = &w.get(name).unwrap().data;
            (d.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / d.len() as f64).sqrt()
        };
        assert!((std_of("transformer.wte.weight") - 0.02).abs() < 2e-4);
        // c_proj: 0.02 / sqrt(2 · 12)
        assert!((std_of("transformer.h.3.mlp.c_proj.weight") - 0.02 / 24f64.sqrt()).abs() < 1e-4);
        assert!(w.get("transformer.h.0.ln_1.weight").unwrap().data.iter().all(|&x| x == 1.0));
        assert!(w.get("transformer.h.0.attn.c_attn.bias").unwrap().data.iter().all(|&x| x == 0.0));
        let bert = Weights::init(&builtin_config("tiny-bert").unwrap(), 0);
        let emb = bert.get("bert.embeddings.word_embeddings.weight").unwrap();
        assert!(emb.data[..64].iter().all(|&x| x == 0.0), "padding row zeroed");
        assert!(emb.data[64..128].iter().any(|&x| x != 0.0));
    }

    #[test]
    fn safetensors_round_trip_by_hf_names() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["tiny-bert", "tiny-gpt2"] {
            let cfg = builtin_config(name).unwrap();
            let w = Weights::init(&cfg, 42);
            let path = dir.path().join(format!("{name}.safetensors"));
            w.save(&path).unwrap();
            // The file holds HF's names, tied weights once.
            let bytes = std::fs::read(&path).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            let mut keys: Vec<String> = st.names().into_iter().map(String::from).collect();
            keys.sort();
            let mut want: Vec<_> = w.tensors.iter().map(|t| t.name.clone()).collect();
            want.sort();
            assert_eq!(keys, want);
            assert!(!keys
                .iter()
                .any(|k| k == "lm_head.weight" || k == "cls.predictions.decoder.weight"));
            let (back, report) = Weights::load(&cfg, &path, 0).unwrap();
            assert!(report.missing.is_empty() && report.unexpected.is_empty());
            assert_eq!(back.tensors, w.tensors);
        }
    }

    #[test]
    fn loads_legacy_names_and_reports_missing() {
        // A hub-style GPT-2 file: no "transformer." prefix, f16 storage, an extra buffer.
        let cfg = builtin_config("tiny-gpt2").unwrap();
        let w = Weights::init(&cfg, 1);
        let mut owned: Vec<(String, Vec<u8>, Vec<usize>)> = Vec::new();
        for t in &w.tensors {
            if t.name == "transformer.ln_f.bias" {
                continue; // missing: must be initialised and reported
            }
            let key = t.name.strip_prefix("transformer.").unwrap().to_string();
            let b: Vec<u8> =
                t.data.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
            owned.push((key, b, t.shape.clone()));
        }
        owned.push(("h.0.attn.bias".into(), vec![0; 4], vec![2]));
        let views: Vec<(String, TensorView<'_>)> = owned
            .iter()
            .map(|(k, b, s)| (k.clone(), TensorView::new(Dtype::F16, s.clone(), b).unwrap()))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        safetensors::serialize_to_file(views, None, &path).unwrap();
        let (back, report) = Weights::load(&cfg, &path, 1).unwrap();
        assert_eq!(report.missing, vec!["transformer.ln_f.bias".to_string()]);
        assert_eq!(report.unexpected, vec!["h.0.attn.bias".to_string()]);
        let a = &w.get("transformer.wte.weight").unwrap().data;
        let b = &back.get("transformer.wte.weight").unwrap().data;
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-3 * x.abs().max(1e-4), "{x} vs {y}");
        }
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let cfg = builtin_config("tiny-bert").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("model.safetensors");
        std::fs::write(&garbage, b"not safetensors").unwrap();
        let e = Weights::load(&cfg, &garbage, 0).unwrap_err().to_string();
        assert!(e.contains("not a valid safetensors"), "{e}");
        let e =
            Weights::load(&cfg, &dir.path().join("absent.safetensors"), 0).unwrap_err().to_string();
        assert!(e.contains("cannot read"), "{e}");
        // GPT-2 weights for a BERT config: nothing matches.
        let other = dir.path().join("gpt2.safetensors");
        Weights::init(&builtin_config("tiny-gpt2").unwrap(), 0).save(&other).unwrap();
        let e = Weights::load(&cfg, &other, 0).unwrap_err().to_string();
        assert!(e.contains("wrong model"), "{e}");
    }
}
