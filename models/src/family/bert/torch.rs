//! BERT as transformers/models/bert/modeling_bert.py writes it (sdpa attention path).

use tch::{Kind, Tensor};

use super::{BertConfig, INFO};
use crate::config::{Activation, ModelConfig, ProblemType};
use crate::torch::layers::{
    activation, classification_loss, cross_entropy, padding_mask, sdpa, LayerNorm, Linear,
};
use crate::torch::{TorchLoss, Vars};

/// BertEmbeddings: word + position + token type, LayerNorm, dropout.
struct BertEmbeddings {
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    layer_norm: LayerNorm,
    dropout: f64,
    padding_idx: i64,
}

impl BertEmbeddings {
    // input_ids: (B, T) -> (B, T, C)
    fn forward(&self, input_ids: &Tensor, train: bool) -> Tensor {
        let (_, t) = input_ids.size2().expect("(B, T) ids");
        let dev = input_ids.device();
        let position_ids = Tensor::arange(t, (Kind::Int64, dev)).unsqueeze(0);
        let token_type_ids = Tensor::zeros_like(input_ids);
        // nn.Embedding(padding_idx=pad_token_id): the padding row gets no gradient.
        let x = Tensor::embedding(&self.word, input_ids, self.padding_idx, false, false)
            + Tensor::embedding(&self.token_type, &token_type_ids, -1, false, false)
            + Tensor::embedding(&self.position, &position_ids, -1, false, false);
        self.layer_norm.forward(&x).dropout(self.dropout, train)
    }
}

/// BertLayer: self-attention + BertSelfOutput, BertIntermediate + BertOutput.
struct BertLayer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_ln: LayerNorm,
    intermediate: Linear,
    output: Linear,
    out_ln: LayerNorm,
    heads: i64,
    act: Activation,
    hidden_dropout: f64,
    attn_dropout: f64,
}

impl BertLayer {
    fn new(v: &Vars, p: &str, c: &BertConfig, act: Activation) -> Self {
        BertLayer {
            query: Linear::new(v, &format!("{p}.attention.self.query")),
            key: Linear::new(v, &format!("{p}.attention.self.key")),
            value: Linear::new(v, &format!("{p}.attention.self.value")),
            attn_out: Linear::new(v, &format!("{p}.attention.output.dense")),
            attn_ln: LayerNorm::new(
                v,
                &format!("{p}.attention.output.LayerNorm"),
                c.layer_norm_eps,
            ),
            intermediate: Linear::new(v, &format!("{p}.intermediate.dense")),
            output: Linear::new(v, &format!("{p}.output.dense")),
            out_ln: LayerNorm::new(v, &format!("{p}.output.LayerNorm"), c.layer_norm_eps),
            heads: c.num_attention_heads as i64,
            act,
            hidden_dropout: c.hidden_dropout_prob,
            attn_dropout: c.attention_probs_dropout_prob,
        }
    }

    // x: (B, T, C), mask: (B, 1, 1, T) bool -> (B, T, C)
    fn forward(&self, x: &Tensor, mask: Option<&Tensor>, train: bool) -> Tensor {
        let (b, t, c) = x.size3().expect("(B, T, C)");
        let d = c / self.heads;
        // (B, T, C) -> (B, H, T, D), as BertSelfAttention's view + transpose.
        let heads = |y: Tensor| y.view([b, t, self.heads, d]).transpose(1, 2);
        let q = heads(self.query.forward(x));
        let k = heads(self.key.forward(x));
        let v = heads(self.value.forward(x));
        let p = if train { self.attn_dropout } else { 0.0 };
        let ctx = sdpa(&q, &k, &v, mask, p, false).transpose(1, 2).reshape([b, t, c]);
        let attn = self
            .attn_ln
            .forward(&(self.attn_out.forward(&ctx).dropout(self.hidden_dropout, train) + x));
        let inter = activation(self.act, true, &self.intermediate.forward(&attn));
        self.out_ln
            .forward(&(self.output.forward(&inter).dropout(self.hidden_dropout, train) + attn))
    }
}

/// BertModel without the pooler (`add_pooling_layer=False`, as BertForMaskedLM builds it).
struct BertEncoder {
    embeddings: BertEmbeddings,
    layers: Vec<BertLayer>,
}

impl BertEncoder {
    fn new(c: &BertConfig, cfg: &ModelConfig, v: &Vars) -> Self {
        let act = cfg.activation();
        BertEncoder {
            embeddings: BertEmbeddings {
                word: v.get(INFO.word_embedding),
                position: v.get("bert.embeddings.position_embeddings.weight"),
                token_type: v.get("bert.embeddings.token_type_embeddings.weight"),
                layer_norm: LayerNorm::new(v, "bert.embeddings.LayerNorm", c.layer_norm_eps),
                dropout: c.hidden_dropout_prob,
                padding_idx: c.padding_idx().unwrap_or(-1),
            },
            layers: (0..c.num_hidden_layers)
                .map(|i| BertLayer::new(v, &format!("bert.encoder.layer.{i}"), c, act))
                .collect(),
        }
    }

    // input_ids: (B, T), attention_mask: (B, T) 0/1 or None -> (B, T, C)
    fn forward(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>, train: bool) -> Tensor {
        let mask = attention_mask.map(|m| padding_mask(m, false));
        let mut x = self.embeddings.forward(input_ids, train);
        for layer in &self.layers {
            x = layer.forward(&x, mask.as_ref(), train);
        }
        x
    }
}

/// BertForMaskedLM: encoder + BertOnlyMLMHead (transform, decoder tied to the word
/// embedding, its own bias).
pub struct BertForMaskedLM {
    bert: BertEncoder,
    transform: Linear,
    transform_ln: LayerNorm,
    decoder_weight: Tensor,
    decoder_bias: Tensor,
    act: Activation,
}

impl BertForMaskedLM {
    pub(super) fn new(c: &BertConfig, cfg: &ModelConfig, v: &Vars) -> Self {
        let decoder_weight =
            v.get(if c.tie_word_embeddings { INFO.word_embedding } else { INFO.untied_head });
        BertForMaskedLM {
            bert: BertEncoder::new(c, cfg, v),
            transform: Linear::new(v, "cls.predictions.transform.dense"),
            transform_ln: LayerNorm::new(
                v,
                "cls.predictions.transform.LayerNorm",
                c.layer_norm_eps,
            ),
            decoder_weight,
            decoder_bias: v.get("cls.predictions.bias"),
            act: cfg.activation(),
        }
    }
}

impl TorchLoss for BertForMaskedLM {
    // input_ids: (B, T), attention_mask: (B, T), labels: (B·T,) -> scalar
    fn loss(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
        _targets: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let h = self.bert.forward(input_ids, attention_mask, train);
        let h = self.transform_ln.forward(&activation(self.act, true, &self.transform.forward(&h)));
        let logits = h.linear(&self.decoder_weight, Some(&self.decoder_bias));
        let v = self.decoder_weight.size()[0];
        cross_entropy(&logits.view([-1, v]), &labels.view([-1]))
    }
}

/// BertForSequenceClassification: encoder + BertPooler (first token, dense, tanh) + dropout
/// + classifier.
pub struct BertForSequenceClassification {
    bert: BertEncoder,
    pooler: Linear,
    classifier: Linear,
    dropout: f64,
    problem: ProblemType,
}

impl BertForSequenceClassification {
    pub(super) fn new(c: &BertConfig, cfg: &ModelConfig, v: &Vars) -> Self {
        BertForSequenceClassification {
            bert: BertEncoder::new(c, cfg, v),
            pooler: Linear::new(v, "bert.pooler.dense"),
            classifier: Linear::new(v, "classifier"),
            dropout: c.classifier_dropout.unwrap_or(c.hidden_dropout_prob),
            problem: cfg.problem_type().expect("checked when the config was parsed"),
        }
    }
}

impl TorchLoss for BertForSequenceClassification {
    // input_ids: (B, T), attention_mask: (B, T), labels: (B,) or (B·L,), targets: (B,) -> scalar
    fn loss(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
        targets: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let h = self.bert.forward(input_ids, attention_mask, train);
        let pooled = self.pooler.forward(&h.select(1, 0)).tanh();
        let logits = self.classifier.forward(&pooled.dropout(self.dropout, train));
        classification_loss(&logits, labels, targets, self.problem)
    }
}

/// BertForTokenClassification: encoder (no pooler) + dropout + classifier over every token,
/// cross-entropy over labels ≠ −100.
pub struct BertForTokenClassification {
    bert: BertEncoder,
    classifier: Linear,
    dropout: f64,
    num_labels: i64,
}

impl BertForTokenClassification {
    pub(super) fn new(c: &BertConfig, cfg: &ModelConfig, v: &Vars) -> Self {
        BertForTokenClassification {
            bert: BertEncoder::new(c, cfg, v),
            classifier: Linear::new(v, "classifier"),
            dropout: c.classifier_dropout.unwrap_or(c.hidden_dropout_prob),
            num_labels: cfg.num_labels() as i64,
        }
    }
}

impl TorchLoss for BertForTokenClassification {
    // input_ids: (B, T), attention_mask: (B, T), labels: (B·T,) -> scalar
    fn loss(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
        _targets: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let h = self.bert.forward(input_ids, attention_mask, train);
        let logits = self.classifier.forward(&h.dropout(self.dropout, train));
        cross_entropy(&logits.view([-1, self.num_labels]), &labels.view([-1]))
    }
}
