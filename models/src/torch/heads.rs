//! The heads HF puts on a decoder body (GPT-2, Llama, Mistral, Qwen2/3): `…ForCausalLM`
//! (`GPT2LMHeadModel`) and the last-token `…ForSequenceClassification`
//! (`GenericForSequenceClassification`, transformers/modeling_layers.py), generic over the
//! family's body: a decoder family writes its body ([`Decoder`]) and names its head weights.

use tch::Tensor;

use super::layers::{causal_lm_loss, classification_loss, last_token};
use super::{TorchLoss, Vars};
use crate::config::{ModelConfig, ProblemType};

/// A decoder family's body (`GPT2Model`, `LlamaModel`): embeddings, blocks, the final norm.
pub(crate) trait Decoder: Send {
    // input_ids: (B, T), attention_mask: (B, T) 0/1 -> hidden states (B, T, C)
    fn forward(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>, train: bool) -> Tensor;
}

/// `…ForCausalLM`: the body, lm_head (nn.Linear without bias; the input embedding when the
/// config ties them), HF 5.x's ForCausalLMLoss.
pub(crate) struct CausalLm<D> {
    body: D,
    lm_head: Tensor,
    /// Gemma 2's `final_logit_softcapping`: logits → cap · tanh(logits / cap).
    softcap: Option<f64>,
}

impl<D: Decoder> CausalLm<D> {
    /// `lm_head`: the HF name of the head's weight (V, C), the embedding's when tied.
    pub(crate) fn new(body: D, v: &Vars, lm_head: &str) -> Self {
        CausalLm { body, lm_head: v.get(lm_head), softcap: None }
    }

    /// The logits soft-capped at `cap` before the loss (Gemma 2).
    pub(crate) fn with_logit_softcapping(self, cap: f64) -> Self {
        CausalLm { softcap: Some(cap), ..self }
    }
}

impl<D: Decoder> TorchLoss for CausalLm<D> {
    // input_ids: (B, T), attention_mask: (B, T) 0/1, labels: (B·T,) -> scalar
    fn loss(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
        _targets: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let (b, t) = input_ids.size2().expect("(B, T) ids");
        let x = self.body.forward(input_ids, attention_mask, train);
        let logits = x.linear::<Tensor>(&self.lm_head, None); // (B, T, V)
        let logits = match self.softcap {
            Some(cap) => (logits / cap).tanh() * cap,
            None => logits,
        };
        // HF 5.x's ForCausalLMLoss: shift the labels, not the logits.
        causal_lm_loss(&logits, &labels.view([b, t]))
    }
}

/// `…ForSequenceClassification` of a decoder: `score` (no bias) over every position, the
/// logits of each row's last token that is not `pad_token_id` ([`last_token`]), HF's loss for
/// the config's problem type.
pub(crate) struct LastTokenClassifier<D> {
    body: D,
    score: Tensor,
    pad_token_id: Option<i64>,
    problem: ProblemType,
}

impl<D: Decoder> LastTokenClassifier<D> {
    pub(crate) fn new(body: D, cfg: &ModelConfig, v: &Vars, pad_token_id: Option<i64>) -> Self {
        LastTokenClassifier {
            body,
            score: v.get("score.weight"),
            pad_token_id,
            problem: cfg.problem_type().expect("checked when the config was parsed"),
        }
    }
}

impl<D: Decoder> TorchLoss for LastTokenClassifier<D> {
    // input_ids: (B, T), attention_mask: (B, T), labels: (B,) or (B·L,), targets: (B,) -> scalar
    fn loss(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
        targets: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let h = self.body.forward(input_ids, attention_mask, train);
        let logits = h.linear::<Tensor>(&self.score, None); // (B, T, L)
        let pooled = last_token(&logits, input_ids, self.pad_token_id); // (B, L)
        classification_loss(&pooled, labels, targets, self.problem)
    }
}
