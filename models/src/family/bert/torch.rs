//! BERT and RoBERTa as transformers/models/bert/modeling_bert.py and
//! …/roberta/modeling_roberta.py write them (sdpa attention path).

use tch::{Kind, Tensor};

use super::graph::{EncoderLayer, MlmHead};
use super::{BertConfig, Variant};
use crate::config::{Activation, ModelConfig, ProblemType};
use crate::torch::layers::{
    activation, classification_loss, cross_entropy, padding_mask, sdpa, LayerNorm, Linear,
};
use crate::torch::{TorchLoss, Vars};

/// BertEmbeddings / RobertaEmbeddings: word + token type + position, LayerNorm, dropout.
struct BertEmbeddings {
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    layer_norm: LayerNorm,
    dropout: f64,
    padding_idx: i64,
    variant: Variant,
}

impl BertEmbeddings {
    // input_ids: (B, T) -> (B, T, C)
    fn forward(&self, input_ids: &Tensor, train: bool) -> Tensor {
        let (_, t) = input_ids.size2().expect("(B, T) ids");
        let dev = input_ids.device();
        let token_type_ids = Tensor::zeros_like(input_ids);
        // nn.Embedding(padding_idx=pad_token_id): the padding row gets no gradient.
        let x = Tensor::embedding(&self.word, input_ids, self.padding_idx, false, false)
            + Tensor::embedding(&self.token_type, &token_type_ids, -1, false, false);
        let x = match self.variant {
            Variant::Bert => {
                let position_ids = Tensor::arange(t, (Kind::Int64, dev)).unsqueeze(0);
                x + Tensor::embedding(&self.position, &position_ids, -1, false, false)
            }
            Variant::Roberta => {
                // create_position_ids_from_input_ids, as HF writes it.
                let mask = input_ids.ne(self.padding_idx).to_kind(Kind::Int);
                let positions =
                    (mask.cumsum(1, Kind::Int) * &mask).to_kind(Kind::Int64) + self.padding_idx;
                x + Tensor::embedding(&self.position, &positions, self.padding_idx, false, false)
            }
        };
        self.layer_norm.forward(&x).dropout(self.dropout, train)
    }
}

/// A post-LN encoder layer (BertLayer, RobertaLayer, DistilBERT's TransformerBlock): its
/// self-attention and output projection, then its feed-forward (up, activation, down).
pub(crate) struct TorchEncoderLayer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_ln: LayerNorm,
    up: Linear,
    down: Linear,
    out_ln: LayerNorm,
    l: EncoderLayer,
}

impl TorchEncoderLayer {
    pub(crate) fn new(v: &Vars, p: &str, l: EncoderLayer) -> Self {
        let n = |name: &str| format!("{p}.{name}");
        let names = l.names;
        TorchEncoderLayer {
            query: Linear::new(v, &n(names.query)),
            key: Linear::new(v, &n(names.key)),
            value: Linear::new(v, &n(names.value)),
            attn_out: Linear::new(v, &n(names.attn_out)),
            attn_ln: LayerNorm::new(v, &n(names.attn_norm), l.eps),
            up: Linear::new(v, &n(names.up)),
            down: Linear::new(v, &n(names.down)),
            out_ln: LayerNorm::new(v, &n(names.out_norm), l.eps),
            l,
        }
    }

    // x: (B, T, C), mask: (B, 1, 1, T) bool -> (B, T, C)
    pub(crate) fn forward(&self, x: &Tensor, mask: Option<&Tensor>, train: bool) -> Tensor {
        let (b, t, c) = x.size3().expect("(B, T, C)");
        let heads = self.l.heads as i64;
        let d = c / heads;
        // (B, T, C) -> (B, H, T, D), as the self-attention's view + transpose.
        let split = |y: Tensor| y.view([b, t, heads, d]).transpose(1, 2);
        let q = split(self.query.forward(x));
        let k = split(self.key.forward(x));
        let v = split(self.value.forward(x));
        let p = if train { self.l.attn_dropout } else { 0.0 };
        let ctx = sdpa(&q, &k, &v, mask, p, false).transpose(1, 2).reshape([b, t, c]);
        let attn = self.attn_out.forward(&ctx).dropout(self.l.attn_out_dropout, train);
        let attn = self.attn_ln.forward(&(attn + x));
        let inter = activation(self.l.act, true, &self.up.forward(&attn));
        let out = self.down.forward(&inter).dropout(self.l.ffn_dropout, train);
        self.out_ln.forward(&(out + attn))
    }
}

/// BertModel / RobertaModel without the pooler (`add_pooling_layer=False`, as their MLM
/// and token classifiers build it).
struct BertEncoder {
    embeddings: BertEmbeddings,
    layers: Vec<TorchEncoderLayer>,
}

impl BertEncoder {
    fn new(c: &BertConfig, cfg: &ModelConfig, v: &Vars) -> Self {
        let base = c.prefix();
        let layer = c.encoder_layer(cfg.activation());
        BertEncoder {
            embeddings: BertEmbeddings {
                word: v.get(c.info().word_embedding),
                position: v.get(&format!("{base}.embeddings.position_embeddings.weight")),
                token_type: v.get(&format!("{base}.embeddings.token_type_embeddings.weight")),
                layer_norm: LayerNorm::new(
                    v,
                    &format!("{base}.embeddings.LayerNorm"),
                    c.layer_norm_eps,
                ),
                dropout: c.hidden_dropout_prob,
                padding_idx: c.padding_idx().unwrap_or(-1),
                variant: c.variant,
            },
            layers: (0..c.num_hidden_layers)
                .map(|i| TorchEncoderLayer::new(v, &format!("{base}.encoder.layer.{i}"), layer))
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

/// An MLM head (`graph::MlmHead`): dense, activation, LayerNorm, the decoder and its bias.
pub(crate) struct TorchMlmHead {
    dense: Linear,
    norm: LayerNorm,
    weight: Tensor,
    bias: Tensor,
    act: Activation,
}

impl TorchMlmHead {
    pub(crate) fn new(v: &Vars, m: &MlmHead) -> Self {
        TorchMlmHead {
            dense: Linear::new(v, m.dense),
            norm: LayerNorm::new(v, m.norm, m.eps),
            weight: v.get(m.decoder),
            bias: v.get(m.bias),
            act: m.act,
        }
    }

    /// Mean cross-entropy of the logits over labels ≠ −100.
    // h: (B, T, C), labels: (B·T,) -> scalar
    pub(crate) fn loss(&self, h: &Tensor, labels: &Tensor) -> Tensor {
        let h = self.norm.forward(&activation(self.act, true, &self.dense.forward(h)));
        let logits = h.linear(&self.weight, Some(&self.bias));
        cross_entropy(&logits.view([-1, self.weight.size()[0]]), &labels.view([-1]))
    }
}

/// BertForMaskedLM / RobertaForMaskedLM: the encoder and the variant's MLM head.
pub struct ForMaskedLM {
    encoder: BertEncoder,
    head: TorchMlmHead,
}

impl ForMaskedLM {
    pub(super) fn new(c: &BertConfig, cfg: &ModelConfig, v: &Vars) -> Self {
        let head = TorchMlmHead::new(v, &c.mlm_head(cfg.activation()));
        ForMaskedLM { encoder: BertEncoder::new(c, cfg, v), head }
    }
}

impl TorchLoss for ForMaskedLM {
    // input_ids: (B, T), attention_mask: (B, T), labels: (B·T,) -> scalar
    fn loss(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
        _targets: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        self.head.loss(&self.encoder.forward(input_ids, attention_mask, train), labels)
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

/// RobertaForSequenceClassification: encoder (no pooler) + RobertaClassificationHead (`<s>`,
/// dropout, dense, tanh, dropout, out_proj).
pub struct RobertaForSequenceClassification {
    roberta: BertEncoder,
    dense: Linear,
    out_proj: Linear,
    dropout: f64,
    problem: ProblemType,
}

impl RobertaForSequenceClassification {
    pub(super) fn new(c: &BertConfig, cfg: &ModelConfig, v: &Vars) -> Self {
        RobertaForSequenceClassification {
            roberta: BertEncoder::new(c, cfg, v),
            dense: Linear::new(v, "classifier.dense"),
            out_proj: Linear::new(v, "classifier.out_proj"),
            dropout: c.classifier_dropout.unwrap_or(c.hidden_dropout_prob),
            problem: cfg.problem_type().expect("checked when the config was parsed"),
        }
    }
}

impl TorchLoss for RobertaForSequenceClassification {
    // input_ids: (B, T), attention_mask: (B, T), labels: (B,) or (B·L,), targets: (B,) -> scalar
    fn loss(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
        targets: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let h = self.roberta.forward(input_ids, attention_mask, train);
        let x = h.select(1, 0).dropout(self.dropout, train);
        let x = self.dense.forward(&x).tanh().dropout(self.dropout, train);
        classification_loss(&self.out_proj.forward(&x), labels, targets, self.problem)
    }
}
