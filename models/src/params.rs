//! The parameter layout of each architecture: HF checkpoint names, shapes and HF's
//! initialisation, in HF's `named_parameters()` order. The single source of truth that the
//! baseline, the engine builders and the safetensors loader all follow; each family writes its
//! own (`FamilyModel::param_specs`, in `family/`) with the `Layout` helpers.

use crate::config::ModelConfig;

/// How HF's `_init_weights` initialises a parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// normal(0, std) — Linear/Conv1D weights and embeddings.
    Normal {
        std: f64,
    },
    /// normal(0, std) with one row zeroed — embeddings with a `padding_idx`.
    NormalPadRow {
        std: f64,
        row: usize,
    },
    Zeros,
    Ones,
}

#[derive(Clone, Debug)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
    /// HF Trainer's `get_decay_parameter_names`: every parameter but biases and LayerNorm
    /// weights gets weight decay.
    pub decay: bool,
}

impl ParamSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The specs of a model as a family writes them: HF's module types (Linear, Conv1D, LayerNorm)
/// each as its parameters, in declaration order.
pub(crate) struct Layout {
    specs: Vec<ParamSpec>,
    std: f64,
}

impl Layout {
    /// An empty layout whose weights initialise with normal(0, `std`) (`initializer_range`).
    pub(crate) fn new(std: f64) -> Self {
        Layout { specs: Vec::new(), std }
    }
    pub(crate) fn into_specs(self) -> Vec<ParamSpec> {
        self.specs
    }
    pub(crate) fn weight(&mut self, name: String, shape: &[usize]) {
        self.push(name, shape, Init::Normal { std: self.std }, true);
    }
    pub(crate) fn linear(&mut self, prefix: &str, out: usize, inp: usize) {
        // nn.Linear stores (out, in).
        self.weight(format!("{prefix}.weight"), &[out, inp]);
        self.push(format!("{prefix}.bias"), &[out], Init::Zeros, false);
    }
    pub(crate) fn conv1d(&mut self, prefix: &str, inp: usize, out: usize, std: f64) {
        // GPT-2's Conv1D stores (in, out): y = x·W + b.
        self.push(format!("{prefix}.weight"), &[inp, out], Init::Normal { std }, true);
        self.push(format!("{prefix}.bias"), &[out], Init::Zeros, false);
    }
    pub(crate) fn layer_norm(&mut self, prefix: &str, n: usize) {
        self.push(format!("{prefix}.weight"), &[n], Init::Ones, false);
        self.push(format!("{prefix}.bias"), &[n], Init::Zeros, false);
    }
    pub(crate) fn push(&mut self, name: String, shape: &[usize], init: Init, decay: bool) {
        self.specs.push(ParamSpec { name, shape: shape.to_vec(), init, decay });
    }
}

/// All parameters of the model, each once (tied weights appear once, as HF saves them): its
/// family's layout for its head.
pub fn param_specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    cfg.family.model().param_specs(cfg)
}

/// Number of trainable parameters, tied weights counted once (as `model.num_parameters()`).
pub fn param_count(cfg: &ModelConfig) -> usize {
    param_specs(cfg).iter().map(ParamSpec::numel).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::builtin_config;

    #[test]
    fn parameter_counts_match_hf() {
        // HF: BertForMaskedLM(bert-base-uncased).num_parameters() and GPT2LMHeadModel(gpt2).
        assert_eq!(param_count(&builtin_config("bert-base-uncased").unwrap()), 109_514_298);
        assert_eq!(param_count(&builtin_config("gpt2").unwrap()), 124_439_808);
        assert_eq!(param_count(&builtin_config("bert-large-uncased").unwrap()), 335_174_458);
        assert_eq!(param_count(&builtin_config("gpt2-medium").unwrap()), 354_823_168);
        // RobertaForMaskedLM(roberta-base), DistilBertForMaskedLM(distilbert-base-uncased).
        assert_eq!(param_count(&builtin_config("roberta-base").unwrap()), 124_697_433);
        assert_eq!(param_count(&builtin_config("distilbert-base-uncased").unwrap()), 66_985_530);
    }

    #[test]
    fn names_are_unique_and_decay_excludes_bias_and_layernorm() {
        let specs = param_specs(&builtin_config("gpt2").unwrap());
        let mut names: Vec<_> = specs.iter().map(|s| &s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), specs.len());
        for s in &specs {
            let no_decay = s.name.ends_with(".bias") || s.name.contains("ln_");
            assert_eq!(s.decay, !no_decay, "{}", s.name);
        }
    }
}
