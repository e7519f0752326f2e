//! The parameter layout of each architecture: HF checkpoint names, shapes and HF's
//! initialisation, in HF's `named_parameters()` order. The single source of truth that the
//! baseline, the engine builders and the safetensors loader all follow.

use crate::config::{Architecture, Family, ModelConfig};

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

struct Layout {
    specs: Vec<ParamSpec>,
    std: f64,
}

impl Layout {
    fn weight(&mut self, name: String, shape: &[usize]) {
        self.push(name, shape, Init::Normal { std: self.std }, true);
    }
    fn linear(&mut self, prefix: &str, out: usize, inp: usize) {
        // nn.Linear stores (out, in).
        self.weight(format!("{prefix}.weight"), &[out, inp]);
        self.push(format!("{prefix}.bias"), &[out], Init::Zeros, false);
    }
    fn conv1d(&mut self, prefix: &str, inp: usize, out: usize, std: f64) {
        // GPT-2's Conv1D stores (in, out): y = x·W + b.
        self.push(format!("{prefix}.weight"), &[inp, out], Init::Normal { std }, true);
        self.push(format!("{prefix}.bias"), &[out], Init::Zeros, false);
    }
    fn layer_norm(&mut self, prefix: &str, n: usize) {
        self.push(format!("{prefix}.weight"), &[n], Init::Ones, false);
        self.push(format!("{prefix}.bias"), &[n], Init::Zeros, false);
    }
    fn push(&mut self, name: String, shape: &[usize], init: Init, decay: bool) {
        self.specs.push(ParamSpec { name, shape: shape.to_vec(), init, decay });
    }
}

/// The name of the untied output projection when `tie_word_embeddings` is false.
pub fn untied_head_name(arch: Architecture) -> &'static str {
    match arch {
        Architecture::Gpt2LMHeadModel | Architecture::Gpt2ForSequenceClassification => {
            "lm_head.weight"
        }
        _ => "cls.predictions.decoder.weight",
    }
}

/// The input embedding that the LM head reuses when weights are tied.
pub fn word_embedding_name(arch: Architecture) -> &'static str {
    match arch {
        Architecture::Gpt2LMHeadModel | Architecture::Gpt2ForSequenceClassification => {
            "transformer.wte.weight"
        }
        _ => "bert.embeddings.word_embeddings.weight",
    }
}

/// All parameters of the model, each once (tied weights appear once, as HF saves them).
pub fn param_specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    let std = cfg.initializer_range();
    let mut l = Layout { specs: Vec::new(), std };
    match &cfg.family {
        Family::Bert(c) => {
            let h = c.hidden_size;
            let pad_row = c.pad_token_id.filter(|&p| p >= 0 && (p as usize) < c.vocab_size);
            let word_init = match pad_row {
                Some(row) => Init::NormalPadRow { std, row: row as usize },
                None => Init::Normal { std },
            };
            l.push(
                "bert.embeddings.word_embeddings.weight".into(),
                &[c.vocab_size, h],
                word_init,
                true,
            );
            l.weight(
                "bert.embeddings.position_embeddings.weight".into(),
                &[c.max_position_embeddings, h],
            );
            l.weight(
                "bert.embeddings.token_type_embeddings.weight".into(),
                &[c.type_vocab_size, h],
            );
            l.layer_norm("bert.embeddings.LayerNorm", h);
            for i in 0..c.num_hidden_layers {
                let p = format!("bert.encoder.layer.{i}");
                l.linear(&format!("{p}.attention.self.query"), h, h);
                l.linear(&format!("{p}.attention.self.key"), h, h);
                l.linear(&format!("{p}.attention.self.value"), h, h);
                l.linear(&format!("{p}.attention.output.dense"), h, h);
                l.layer_norm(&format!("{p}.attention.output.LayerNorm"), h);
                l.linear(&format!("{p}.intermediate.dense"), c.intermediate_size, h);
                l.linear(&format!("{p}.output.dense"), h, c.intermediate_size);
                l.layer_norm(&format!("{p}.output.LayerNorm"), h);
            }
            match cfg.arch {
                Architecture::BertForMaskedLM => {
                    l.push("cls.predictions.bias".into(), &[c.vocab_size], Init::Zeros, false);
                    l.linear("cls.predictions.transform.dense", h, h);
                    l.layer_norm("cls.predictions.transform.LayerNorm", h);
                    if !c.tie_word_embeddings {
                        l.weight(untied_head_name(cfg.arch).into(), &[c.vocab_size, h]);
                    }
                }
                // BertForTokenClassification: BertModel(add_pooling_layer=False) + classifier.
                Architecture::BertForTokenClassification => {
                    l.linear("classifier", cfg.num_labels(), h)
                }
                Architecture::BertForSequenceClassification => {
                    l.linear("bert.pooler.dense", h, h);
                    l.linear("classifier", cfg.num_labels(), h);
                }
                Architecture::Gpt2LMHeadModel | Architecture::Gpt2ForSequenceClassification => {
                    unreachable!("bert family")
                }
            }
        }
        Family::Gpt2(c) => {
            let e = c.n_embd;
            // HF re-initialises every c_proj weight with std / sqrt(2·n_layer) (GPT-2 paper §2.3).
            let proj_std = std / (2.0 * c.n_layer as f64).sqrt();
            l.weight("transformer.wte.weight".into(), &[c.vocab_size, e]);
            l.weight("transformer.wpe.weight".into(), &[c.n_positions, e]);
            for i in 0..c.n_layer {
                let p = format!("transformer.h.{i}");
                l.layer_norm(&format!("{p}.ln_1"), e);
                l.conv1d(&format!("{p}.attn.c_attn"), e, 3 * e, std);
                l.conv1d(&format!("{p}.attn.c_proj"), e, e, proj_std);
                l.layer_norm(&format!("{p}.ln_2"), e);
                l.conv1d(&format!("{p}.mlp.c_fc"), e, c.inner(), std);
                l.conv1d(&format!("{p}.mlp.c_proj"), c.inner(), e, proj_std);
            }
            l.layer_norm("transformer.ln_f", e);
            if cfg.arch == Architecture::Gpt2ForSequenceClassification {
                // nn.Linear(n_embd, num_labels, bias=False)
                l.weight("score.weight".into(), &[cfg.num_labels(), e]);
            } else if !c.tie_word_embeddings {
                l.weight(untied_head_name(cfg.arch).into(), &[c.vocab_size, e]);
            }
        }
    }
    l.specs
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
