//! DistilBERT as transformers/models/distilbert/modeling_distilbert.py writes it (sdpa
//! attention path), its blocks `bert::TorchEncoderLayer` under DistilBERT's names.

use tch::{Kind, Tensor};

use super::{DistilBertConfig, INFO, LAYER_NORM_EPS};
use crate::config::{ModelConfig, ProblemType};
use crate::family::bert::{TorchEncoderLayer, TorchMlmHead};
use crate::family::Head;
use crate::torch::layers::{classification_loss, cross_entropy, padding_mask, LayerNorm, Linear};
use crate::torch::{TorchLoss, Vars};

/// The head on top of DistilBertModel.
enum DistilHead {
    /// vocab_transform, activation, vocab_layer_norm, vocab_projector (weight, bias).
    MaskedLm(TorchMlmHead),
    /// pre_classifier, ReLU, dropout, classifier.
    Sequence { pre: Linear, classifier: Linear, dropout: f64, problem: ProblemType },
    /// dropout, classifier.
    Token { classifier: Linear, dropout: f64, num_labels: i64 },
}

/// DistilBertFor{MaskedLM, SequenceClassification, TokenClassification}.
pub struct DistilBert {
    word: Tensor,
    position: Tensor,
    embed_ln: LayerNorm,
    dropout: f64,
    padding_idx: i64,
    layers: Vec<TorchEncoderLayer>,
    head: DistilHead,
}

impl DistilBert {
    pub(super) fn new(c: &DistilBertConfig, cfg: &ModelConfig, v: &Vars) -> Self {
        let layer = c.encoder_layer();
        let head = match cfg.arch.head() {
            Head::MaskedLm => DistilHead::MaskedLm(TorchMlmHead::new(v, &c.mlm_head())),
            Head::SequenceClassification => DistilHead::Sequence {
                pre: Linear::new(v, "pre_classifier"),
                classifier: Linear::new(v, "classifier"),
                dropout: c.seq_classif_dropout,
                problem: cfg.problem_type().expect("checked when the config was parsed"),
            },
            Head::TokenClassification => DistilHead::Token {
                classifier: Linear::new(v, "classifier"),
                dropout: c.dropout,
                num_labels: cfg.num_labels() as i64,
            },
            Head::CausalLm => unreachable!("DistilBERT lists no causal-lm head"),
        };
        DistilBert {
            word: v.get(INFO.word_embedding),
            position: v.get("distilbert.embeddings.position_embeddings.weight"),
            embed_ln: LayerNorm::new(v, "distilbert.embeddings.LayerNorm", LAYER_NORM_EPS),
            dropout: c.dropout,
            padding_idx: c.padding_idx().unwrap_or(-1),
            layers: (0..c.n_layers)
                .map(|i| {
                    TorchEncoderLayer::new(v, &format!("distilbert.transformer.layer.{i}"), layer)
                })
                .collect(),
            head,
        }
    }

    /// DistilBertModel: Embeddings (word + position, LayerNorm, dropout), the blocks.
    // input_ids: (B, T), attention_mask: (B, T) 0/1 or None -> (B, T, C)
    fn hidden(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>, train: bool) -> Tensor {
        let (_, t) = input_ids.size2().expect("(B, T) ids");
        let positions = Tensor::arange(t, (Kind::Int64, input_ids.device())).unsqueeze(0);
        let x = Tensor::embedding(&self.word, input_ids, self.padding_idx, false, false)
            + Tensor::embedding(&self.position, &positions, -1, false, false);
        let mut x = self.embed_ln.forward(&x).dropout(self.dropout, train);
        let mask = attention_mask.map(|m| padding_mask(m, false));
        for layer in &self.layers {
            x = layer.forward(&x, mask.as_ref(), train);
        }
        x
    }
}

impl TorchLoss for DistilBert {
    // input_ids: (B, T), attention_mask: (B, T), labels: (B·T,) or (B,)/(B·L,), targets -> scalar
    fn loss(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
        targets: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let h = self.hidden(input_ids, attention_mask, train);
        match &self.head {
            DistilHead::MaskedLm(head) => head.loss(&h, labels),
            DistilHead::Sequence { pre, classifier, dropout, problem } => {
                let x = pre.forward(&h.select(1, 0)).relu().dropout(*dropout, train);
                classification_loss(&classifier.forward(&x), labels, targets, *problem)
            }
            DistilHead::Token { classifier, dropout, num_labels } => {
                let logits = classifier.forward(&h.dropout(*dropout, train));
                cross_entropy(&logits.view([-1, *num_labels]), &labels.view([-1]))
            }
        }
    }
}
