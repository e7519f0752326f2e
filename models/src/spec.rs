//! Model specs as a user writes them on the command line: a short alias (`bert`, `gpt2`), a
//! built-in config name, a local directory in HF format, or a hub id resolved through the HF
//! cache (hf-hub).

use std::path::{Path, PathBuf};

use hf_hub::{Cache, Repo};

use crate::config::ModelConfig;
use crate::family::{Architecture, TASKS};
use crate::ModelError;

/// Configs shipped with ortbench (models/configs/*.json), by their HF names.
pub const BUILTIN_NAMES: &[&str] = &[
    "bert-base-uncased",
    "bert-large-uncased",
    "roberta-base",
    "distilbert-base-uncased",
    "gpt2",
    "gpt2-medium",
    "tiny-bert",
    "tiny-roberta",
    "tiny-distilbert",
    "tiny-gpt2",
    "smollm2-135m",
    "qwen2.5-0.5b",
    "qwen3-0.6b",
    "llama-3.2-1b",
    "smollm3-3b",
    "phi-3-mini-4k-instruct",
    "gemma-2-2b",
    "gemma-3-270m",
    "gemma-3-1b",
    "tiny-llama",
    "tiny-mistral",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-smollm3",
    "tiny-phi3",
    "tiny-gemma",
    "tiny-gemma2",
    "tiny-gemma3",
];

/// Short names users type.
pub const ALIASES: &[(&str, &str)] = &[
    ("bert", "bert-base-uncased"),
    ("bert-large", "bert-large-uncased"),
    // The seeds' ORT Training chart: RoBERTa and DistilBERT beside BERT and GPT-2.
    ("roberta-base", "roberta-base"),
    ("roberta", "roberta-base"),
    ("distilbert-base-uncased", "distilbert-base-uncased"),
    ("distilbert", "distilbert-base-uncased"),
    ("gpt2", "gpt2"),
    ("gpt2-medium", "gpt2-medium"),
    // The Llama family; SmolLM2-135M is its benchmark default.
    ("smollm2-135m", "smollm2-135m"),
    ("qwen2.5-0.5b", "qwen2.5-0.5b"),
    ("qwen3-0.6b", "qwen3-0.6b"),
    ("llama-3.2-1b", "llama-3.2-1b"),
    // SmolLM3: the Llama layout with NoPE layers.
    ("smollm3-3b", "smollm3-3b"),
    // Phi-3: fused projections, a sliding window on every layer.
    ("phi-3-mini-4k-instruct", "phi-3-mini-4k-instruct"),
    ("phi-3-mini", "phi-3-mini-4k-instruct"),
    // Gemma 2 (soft-capping, alternating windows) and Gemma 3 (local rope, q/k norms).
    ("gemma-2-2b", "gemma-2-2b"),
    ("gemma-3-270m", "gemma-3-270m"),
    ("gemma-3-1b", "gemma-3-1b"),
];

fn builtin_json(name: &str) -> Option<&'static str> {
    Some(match name {
        "bert-base-uncased" => include_str!("../configs/bert-base-uncased.json"),
        "bert-large-uncased" => include_str!("../configs/bert-large-uncased.json"),
        "gpt2" => include_str!("../configs/gpt2.json"),
        "gpt2-medium" => include_str!("../configs/gpt2-medium.json"),
        "tiny-bert" => include_str!("../configs/tiny-bert.json"),
        "roberta-base" => include_str!("../configs/roberta-base.json"),
        "distilbert-base-uncased" => include_str!("../configs/distilbert-base-uncased.json"),
        "tiny-roberta" => include_str!("../configs/tiny-roberta.json"),
        "tiny-distilbert" => include_str!("../configs/tiny-distilbert.json"),
        "tiny-gpt2" => include_str!("../configs/tiny-gpt2.json"),
        "smollm2-135m" => include_str!("../configs/smollm2-135m.json"),
        "qwen2.5-0.5b" => include_str!("../configs/qwen2.5-0.5b.json"),
        "qwen3-0.6b" => include_str!("../configs/qwen3-0.6b.json"),
        "llama-3.2-1b" => include_str!("../configs/llama-3.2-1b.json"),
        "tiny-llama" => include_str!("../configs/tiny-llama.json"),
        "tiny-mistral" => include_str!("../configs/tiny-mistral.json"),
        "tiny-qwen2" => include_str!("../configs/tiny-qwen2.json"),
        "tiny-qwen3" => include_str!("../configs/tiny-qwen3.json"),
        "smollm3-3b" => include_str!("../configs/smollm3-3b.json"),
        "tiny-smollm3" => include_str!("../configs/tiny-smollm3.json"),
        "phi-3-mini-4k-instruct" => include_str!("../configs/phi-3-mini-4k-instruct.json"),
        "tiny-phi3" => include_str!("../configs/tiny-phi3.json"),
        "tiny-gemma" => include_str!("../configs/tiny-gemma.json"),
        "tiny-gemma2" => include_str!("../configs/tiny-gemma2.json"),
        "tiny-gemma3" => include_str!("../configs/tiny-gemma3.json"),
        "gemma-2-2b" => include_str!("../configs/gemma-2-2b.json"),
        "gemma-3-270m" => include_str!("../configs/gemma-3-270m.json"),
        "gemma-3-1b" => include_str!("../configs/gemma-3-1b.json"),
        _ => return None,
    })
}

/// The config of a built-in model or alias.
pub fn builtin_config(name: &str) -> Result<ModelConfig, ModelError> {
    let canonical = canonical_builtin(name).ok_or_else(|| unknown(name))?;
    let json = builtin_json(canonical).expect("every canonical name has a config");
    ModelConfig::from_json_str(json, &format!("models/configs/{canonical}.json"))
}

fn canonical_builtin(name: &str) -> Option<&'static str> {
    ALIASES
        .iter()
        .find(|(a, _)| *a == name)
        .map(|(_, c)| *c)
        .or_else(|| BUILTIN_NAMES.iter().copied().find(|n| *n == name))
}

fn unknown(name: &str) -> ModelError {
    let aliases: Vec<&str> = ALIASES.iter().map(|(a, _)| *a).collect();
    ModelError::UnknownModel(format!(
        "unknown model '{name}': use an alias ({}), a built-in config ({}), a local directory with config.json, or a hub id like 'org/name'",
        aliases.join(", "),
        BUILTIN_NAMES.join(", ")
    ))
}

/// Where a model came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    Builtin,
    Dir(PathBuf),
    Hub { repo_id: String, snapshot: PathBuf },
}

/// A model spec resolved to a config and, when the source has one, a weights file.
#[derive(Clone, Debug)]
pub struct ResolvedModel {
    /// The name runs are reported under (the spec as the user wrote it).
    pub name: String,
    pub config: ModelConfig,
    pub source: Source,
    /// `model.safetensors` of a directory or hub snapshot, when present.
    pub weights_file: Option<PathBuf>,
}

/// How hub ids are resolved: the HF cache first; a download only when not offline.
#[derive(Clone, Debug)]
pub struct HubOptions {
    pub cache: Cache,
    /// `HF_HUB_OFFLINE=1`, as huggingface_hub understands it: never touch the network.
    pub offline: bool,
}

impl HubOptions {
    /// The user's HF cache (`HF_HOME`, default `~/.cache/huggingface`) and `HF_HUB_OFFLINE`.
    pub fn from_env() -> Self {
        let offline = std::env::var("HF_HUB_OFFLINE")
            .map(|v| v == "1" || v.eq_ignore_ascii_case("true"))
            .unwrap_or(false);
        HubOptions { cache: Cache::from_env(), offline }
    }
}

/// Resolves `spec`: alias/built-in name, then local directory, then hub id.
pub fn resolve(spec: &str, hub: &HubOptions) -> Result<ResolvedModel, ModelError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(ModelError::UnknownModel("empty model name in --models".into()));
    }
    if canonical_builtin(spec).is_some() {
        return Ok(ResolvedModel {
            name: spec.to_string(),
            config: builtin_config(spec)?,
            source: Source::Builtin,
            weights_file: None,
        });
    }
    let path = Path::new(spec);
    if path.is_dir() {
        return resolve_dir(spec, path);
    }
    if looks_like_hub_id(spec) && !path.exists() {
        return resolve_hub(spec, hub);
    }
    Err(unknown(spec))
}

fn resolve_dir(name: &str, dir: &Path) -> Result<ResolvedModel, ModelError> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| {
        ModelError::BadConfig(format!(
            "{}: cannot read ({e}); an HF model directory needs config.json",
            cfg_path.display()
        ))
    })?;
    let config = ModelConfig::from_json_str(&text, &cfg_path.display().to_string())?;
    let weights = dir.join("model.safetensors");
    Ok(ResolvedModel {
        name: name.trim_end_matches('/').to_string(),
        config,
        source: Source::Dir(dir.to_path_buf()),
        weights_file: weights.is_file().then_some(weights),
    })
}

fn looks_like_hub_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
}

/// A hub repo: files from the HF cache; with network (and not offline), hf-hub downloads
/// what is missing into that cache.
fn resolve_hub(repo_id: &str, hub: &HubOptions) -> Result<ResolvedModel, ModelError> {
    let config_path = fetch_hub_file(repo_id, "config.json", hub)?;
    let snapshot = config_path.parent().map(Path::to_path_buf).unwrap_or_default();
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| ModelError::Hub(format!("{}: cannot read: {e}", config_path.display())))?;
    let config = ModelConfig::from_json_str(&text, &format!("{repo_id}/config.json"))?;
    let weights_file = fetch_hub_file(repo_id, "model.safetensors", hub).ok();
    Ok(ResolvedModel {
        name: repo_id.to_string(),
        config,
        source: Source::Hub { repo_id: repo_id.into(), snapshot },
        weights_file,
    })
}

impl ResolvedModel {
    /// The model's `tokenizer.json` (a directory's, or the hub repo's), for `--dataset`.
    pub fn tokenizer_file(&self, hub: &HubOptions) -> Result<PathBuf, ModelError> {
        match &self.source {
            Source::Dir(dir) => {
                let p = dir.join("tokenizer.json");
                if p.is_file() {
                    Ok(p)
                } else {
                    Err(ModelError::Data(format!(
                        "--dataset needs the model's tokenizer: {} has no tokenizer.json (save it with tokenizer.save_pretrained)",
                        dir.display()
                    )))
                }
            }
            Source::Hub { repo_id, .. } => fetch_hub_file(repo_id, "tokenizer.json", hub),
            Source::Builtin => Err(ModelError::Data(format!(
                "--dataset needs a tokenizer: the built-in '{}' has none; use a model directory or hub id with a tokenizer.json",
                self.name
            ))),
        }
    }
}

/// `cfg` with the head of `task` (`--task`), or unchanged for None or its own task. A
/// checkpoint trains the tasks of the heads its family lists (a BERT one masked-lm,
/// sequence-classification or token-classification, a GPT-2 one causal-lm or
/// sequence-classification); the new head's weights are then initialised (the loader reports
/// them as missing, the old head's as unused).
pub fn with_task(
    cfg: ModelConfig,
    task: Option<&str>,
    origin: &str,
) -> Result<ModelConfig, ModelError> {
    let Some(task) = task else { return Ok(cfg) };
    let family = cfg.arch.family();
    let arch = Architecture::for_task(family, task).ok_or_else(|| {
        if TASKS.contains(&task) {
            ModelError::Unsupported(format!(
                "--task {task}: a {} model ({origin}) trains {}",
                family.name,
                family.task_names().join(", ")
            ))
        } else {
            ModelError::Unsupported(format!(
                "unknown --task '{task}': known tasks are {}",
                TASKS.join(", ")
            ))
        }
    })?;
    if arch == cfg.arch {
        return Ok(cfg);
    }
    cfg.with_architecture(arch, origin)
}

/// One file of a hub repo: the cache first, then a download unless offline.
pub fn fetch_hub_file(repo_id: &str, file: &str, hub: &HubOptions) -> Result<PathBuf, ModelError> {
    if let Some(p) = hub.cache.repo(Repo::model(repo_id.to_string())).get(file) {
        return Ok(p);
    }
    let how = format!(
        "get it on a machine with network (`huggingface-cli download {repo_id} config.json model.safetensors`), copy the HF cache to {} (or set HF_HOME), or pass a local directory with config.json and model.safetensors",
        hub.cache.path().display()
    );
    if hub.offline {
        return Err(ModelError::Hub(format!(
            "'{repo_id}': {file} is not in the HF cache and HF_HUB_OFFLINE is set; {how}"
        )));
    }
    let api = hf_hub::api::sync::ApiBuilder::from_cache(hub.cache.clone())
        .with_progress(false)
        .build()
        .map_err(|e| ModelError::Hub(format!("'{repo_id}': cannot start the hub client: {e}")))?;
    api.model(repo_id.to_string()).get(file).map_err(|e| {
        ModelError::Hub(format!(
            "'{repo_id}': {file} is not in the HF cache and could not be downloaded ({e}); {how}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Weights;

    fn offline(dir: &Path) -> HubOptions {
        HubOptions { cache: Cache::new(dir.to_path_buf()), offline: true }
    }

    #[test]
    fn aliases_resolve_to_builtin_configs() {
        let hub = offline(Path::new("/nonexistent"));
        assert_eq!(resolve("bert", &hub).unwrap().config.hidden_size(), 768);
        assert_eq!(resolve("bert-large", &hub).unwrap().config.num_layers(), 24);
        assert_eq!(resolve("gpt2-medium", &hub).unwrap().config.hidden_size(), 1024);
        assert_eq!(resolve("tiny-gpt2", &hub).unwrap().config.vocab_size(), 1000);
    }

    #[test]
    fn unknown_names_say_what_is_known() {
        let hub = offline(Path::new("/nonexistent"));
        let e = resolve("bret", &hub).unwrap_err().to_string();
        assert!(e.contains("unknown model 'bret'") && e.contains("gpt2"), "{e}");
    }

    #[test]
    fn local_directory_in_hf_format() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = builtin_config("tiny-gpt2").unwrap();
        std::fs::write(dir.path().join("config.json"), serde_json::to_string(&cfg.raw).unwrap())
            .unwrap();
        Weights::init(&cfg, 0).save(&dir.path().join("model.safetensors")).unwrap();
        let r = resolve(dir.path().to_str().unwrap(), &offline(Path::new("/nonexistent"))).unwrap();
        assert_eq!(r.config.arch.hf_name(), "GPT2LMHeadModel");
        assert_eq!(r.weights_file.unwrap(), dir.path().join("model.safetensors"));
        // A directory without config.json is a clear error.
        let empty = tempfile::tempdir().unwrap();
        let e = resolve(empty.path().to_str().unwrap(), &offline(Path::new("/x")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.json"), "{e}");
    }

    #[test]
    fn hub_id_from_a_local_cache() {
        // The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<rev>/…}.
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--acme--tiny-bert");
        let snap = repo.join("snapshots").join("0123abcd");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join("main"), "0123abcd").unwrap();
        let cfg = builtin_config("tiny-bert").unwrap();
        std::fs::write(snap.join("config.json"), serde_json::to_string(&cfg.raw).unwrap()).unwrap();
        Weights::init(&cfg, 3).save(&snap.join("model.safetensors")).unwrap();
        let r = resolve("acme/tiny-bert", &offline(cache.path())).unwrap();
        assert_eq!(r.config.vocab_size(), 1000);
        assert!(matches!(r.source, Source::Hub { .. }));
        let (w, _) = Weights::load(&r.config, r.weights_file.as_ref().unwrap(), 0).unwrap();
        assert_eq!(w.tensors, Weights::init(&cfg, 3).tensors);
        // Not cached and offline: says how to get the files.
        let e = resolve("acme/absent", &offline(cache.path())).unwrap_err().to_string();
        assert!(
            e.contains("not in the HF cache") && e.contains("huggingface-cli download acme/absent"),
            "{e}"
        );
    }
}
