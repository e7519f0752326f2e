//! BERT and RoBERTa as engine graphs: the same functions as `torch.rs` beside it (transformers'
//! modeling_bert.py and modeling_roberta.py, absolute positions; with an attention mask when the
//! graph is built for padded batches — without one, pad tokens are attended to like any token,
//! as HF does when no `attention_mask` is passed).

use ortbench_engine::graph::TensorId;

use super::{BertConfig, EncoderLayerNames, Variant};
use crate::config::{Activation, ModelConfig};
use crate::family::Head;
use crate::graph::{
    BResult, Builder, GraphOptions, INPUT_IDS, NOT_PAD_MASK, PAD_MASK, POSITION_IDS,
    POSITION_IDS_AFTER_PAD, TOKEN_TYPE_IDS,
};

/// A lookup with `padding_idx` where `ids` is the padding row exactly at the pad tokens (the
/// word embedding; RoBERTa's positions): rows of `table` for `ids`, where the padding row gets
/// no gradient from this lookup (it still gets one through a tied decoder).
///
/// The engine's embedding has no padding_idx, so: x·keep + stop_gradient(x)·pad, with keep/pad
/// the fed 0/1 masks of non-padding/padding positions and each product a batched K=1 matmul
/// (a per-row scale, (1,1)·(1,C)). Values are exact (x + 0 or 0 + x); the gradient w.r.t. x is
/// keep·dy, so the scatter-add into the table adds exact zeros at padding positions.
/// `masks`: the fed (keep, pad) inputs, declared by the first lookup that needs them.
// ids: (B, T) -> (B, T, C)
pub(crate) fn padded_lookup(
    b: &mut Builder,
    table: TensorId,
    ids: TensorId,
    masks: &mut Option<(TensorId, TensorId)>,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    let x = b.g.embedding(table, ids)?; // (B, T, C)
    let (bs, t) = (opts.batch_size, opts.seq_len);
    let c = b.g.shape(x)[2];
    let (keep, pad) = match *masks {
        Some(m) => m,
        None => {
            let keep = b.g.input_float(NOT_PAD_MASK, &[bs, t, 1, 1])?; // (B, T, 1, 1)
            let pad = b.g.input_float(PAD_MASK, &[bs, t, 1, 1])?; // (B, T, 1, 1)
            *masks.insert((keep, pad))
        }
    };
    let x4 = b.g.reshape(x, &[bs, t, 1, c])?; // (B, T, 1, C)
    let frozen = b.stop_gradient(x4)?; // (B, T, 1, C), no gradient
    let kept = b.g.matmul(keep, x4, false, false)?; // (B, T, 1, C)
    let padded = b.g.matmul(pad, frozen, false, false)?; // (B, T, 1, C)
    let y = b.g.add(kept, padded)?;
    Ok(b.g.reshape(y, &[bs, t, c])?)
}

/// `BertEmbeddings` / `RobertaEmbeddings`: word + token_type (zeros) + position embeddings →
/// LayerNorm → dropout. RoBERTa's positions are `create_position_ids_from_input_ids` (fed:
/// [`POSITION_IDS_AFTER_PAD`]), looked up with the padding_idx.
// returns (B, T, C)
fn embeddings(b: &mut Builder, c: &BertConfig, opts: &GraphOptions) -> BResult<TensorId> {
    let (bs, t) = (opts.batch_size, opts.seq_len);
    let base = c.prefix();
    let ids = b.g.input_ids(INPUT_IDS, &[bs, t])?; // (B, T)
    let token_types = b.g.input_ids(TOKEN_TYPE_IDS, &[bs, t])?; // (B, T)
    let positions = match c.variant {
        Variant::Bert => b.g.input_ids(POSITION_IDS, &[t])?, // (T)
        Variant::Roberta => b.g.input_ids(POSITION_IDS_AFTER_PAD, &[bs, t])?, // (B, T)
    };
    let mut masks = None;
    let word_table = b.p(c.info().word_embedding);
    let word = match c.padding_idx() {
        Some(_) => padded_lookup(b, word_table, ids, &mut masks, opts)?,
        None => b.g.embedding(word_table, ids)?,
    }; // (B, T, C)
    let tt = b
        .g
        .embedding(b.p(&format!("{base}.embeddings.token_type_embeddings.weight")), token_types)?; // (B, T, C)
    let pos_table = b.p(&format!("{base}.embeddings.position_embeddings.weight"));
    let pos = match c.variant {
        Variant::Bert => b.g.embedding(pos_table, positions)?, // (T, C)
        // The padding_idx is a pad row exactly where the token is pad (parse_roberta).
        Variant::Roberta => padded_lookup(b, pos_table, positions, &mut masks, opts)?, // (B, T, C)
    };
    let x = b.g.add(word, tt)?;
    let x = b.g.add(x, pos)?; // (B, T, C), BERT's positions broadcast over B
    let x = b.layer_norm(x, &format!("{base}.embeddings.LayerNorm"), c.layer_norm_eps)?;
    b.dropout(x, c.hidden_dropout_prob)
}

/// A post-LN encoder layer's settings: BertLayer's, RobertaLayer's, DistilBERT's TransformerBlock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EncoderLayer {
    pub names: EncoderLayerNames,
    pub heads: usize,
    pub eps: f64,
    pub act: Activation,
    /// On the attention probabilities.
    pub attn_dropout: f64,
    /// On the attention's output projection, before the residual (none in DistilBERT).
    pub attn_out_dropout: f64,
    /// On the feed-forward's output, before the residual.
    pub ffn_dropout: f64,
}

/// A post-LN encoder layer (BertLayer): self-attention (eager: q·kᵀ/√D, softmax, dropout, ·v) →
/// output projection, dropout, residual, LayerNorm → up, activation, down, dropout, residual,
/// LayerNorm.
// x: (B, T, C) -> (B, T, C)
pub(crate) fn encoder_layer(
    b: &mut Builder,
    x: TensorId,
    p: &str,
    l: &EncoderLayer,
) -> BResult<TensorId> {
    let n = |name: &str| format!("{p}.{name}");
    let heads = l.heads;
    let q = b.linear(x, &n(l.names.query))?; // (B, T, C)
    let k = b.linear(x, &n(l.names.key))?;
    let v = b.linear(x, &n(l.names.value))?;
    let (q, k, v) = (b.split_heads(q, heads)?, b.split_heads(k, heads)?, b.split_heads(v, heads)?); // (B, H, T, D)
    let ctx = b.eager_attention(q, k, v, false, l.attn_dropout)?; // (B, H, T, D)
    let ctx = b.merge_heads(ctx)?; // (B, T, C)
    let a = b.linear(ctx, &n(l.names.attn_out))?;
    let a = b.dropout(a, l.attn_out_dropout)?;
    let a = b.g.add(a, x)?;
    let a = b.layer_norm(a, &n(l.names.attn_norm), l.eps)?; // (B, T, C)
    let h = b.linear(a, &n(l.names.up))?; // (B, T, I)
    let h = b.activation(h, l.act)?;
    let o = b.linear(h, &n(l.names.down))?; // (B, T, C)
    let o = b.dropout(o, l.ffn_dropout)?;
    let o = b.g.add(o, a)?;
    b.layer_norm(o, &n(l.names.out_norm), l.eps)
}

/// `BertModel` / `RobertaModel` without the pooler: embeddings and the encoder layers.
// returns (B, T, C)
fn bert_encoder(
    b: &mut Builder,
    c: &BertConfig,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    let mut x = embeddings(b, c, opts)?;
    let layer = c.encoder_layer(cfg.activation());
    for i in 0..c.num_hidden_layers {
        x = encoder_layer(b, x, &format!("{}.encoder.layer.{i}", c.prefix()), &layer)?;
    }
    Ok(x)
}

/// Each row's first token: `hidden_states[:, 0]`, the first C values of each (T·C) row.
// h: (B, T, C) -> (B, C)
pub(crate) fn first_token(b: &mut Builder, h: TensorId) -> BResult<TensorId> {
    let s = b.g.shape(h).to_vec();
    let (bs, t, hidden) = (s[0], s[1], s[2]);
    let flat = b.g.reshape(h, &[bs, t * hidden])?; // (B, T·C)
    Ok(if t > 1 { b.g.split(flat, &[hidden, (t - 1) * hidden])?[0] } else { flat })
}

/// An MLM head's names and settings: BertOnlyMLMHead (`cls.predictions.transform.dense`, the
/// config's activation, `….LayerNorm`, `cls.predictions.bias`), RobertaLMHead (`lm_head.dense`,
/// erf GELU whatever `hidden_act` says, `lm_head.layer_norm`, `lm_head.bias`), DistilBERT's
/// (`vocab_transform`, its activation, `vocab_layer_norm`, `vocab_projector.bias`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MlmHead {
    pub dense: &'static str,
    pub norm: &'static str,
    /// The decoder's bias.
    pub bias: &'static str,
    /// The decoder's weight: the word embedding when tied, else the head's own.
    pub decoder: &'static str,
    pub act: Activation,
    pub eps: f64,
}

/// dense → activation → LayerNorm → decoder + bias, over every position. Returns the logits
/// (B, T, V); the caller's loss is the mean cross-entropy over labels ≠ −100.
// h: (B, T, C) -> (B, T, V)
pub(crate) fn mlm_head(b: &mut Builder, h: TensorId, m: &MlmHead) -> BResult<TensorId> {
    let h = b.linear(h, m.dense)?;
    let h = b.activation(h, m.act)?;
    let h = b.layer_norm(h, m.norm, m.eps)?; // (B, T, C)
    let logits = b.g.matmul(h, b.p(m.decoder), false, true)?; // (B, T, V)
    Ok(b.g.bias_add(logits, b.p(m.bias))?)
}

/// `BertForMaskedLM` / `RobertaForMaskedLM`: the encoder and the variant's MLM head
/// ([`BertConfig::mlm_head`]). Returns the logits (B, T, V).
pub(super) fn for_masked_lm(
    b: &mut Builder,
    c: &BertConfig,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    debug_assert_eq!(cfg.arch.head(), Head::MaskedLm);
    let h = bert_encoder(b, c, cfg, opts)?; // (B, T, C)
    mlm_head(b, h, &c.mlm_head(cfg.activation()))
}

/// `BertForSequenceClassification`: encoder → BertPooler (token 0, dense, tanh) → dropout
/// (`classifier_dropout` or `hidden_dropout_prob`) → classifier. Returns the logits
/// (B, num_labels); the caller adds the problem type's loss ([`Builder::classification_loss`]).
pub(super) fn bert_for_sequence_classification(
    b: &mut Builder,
    c: &BertConfig,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    debug_assert_eq!(cfg.arch.head(), Head::SequenceClassification);
    let h = bert_encoder(b, c, cfg, opts)?; // (B, T, C)
    let first = first_token(b, h)?; // (B, C)
    let pooled = b.linear(first, "bert.pooler.dense")?;
    let pooled = b.g.tanh(pooled)?; // (B, C)
    let pooled = b.dropout(pooled, c.classifier_dropout.unwrap_or(c.hidden_dropout_prob))?;
    b.linear(pooled, "classifier") // (B, num_labels)
}

/// `BertForTokenClassification`: encoder (no pooler) → dropout (`classifier_dropout` or
/// `hidden_dropout_prob`) → classifier. Returns the logits (B, T, num_labels); the caller adds
/// the mean cross-entropy over labels ≠ −100.
pub(super) fn bert_for_token_classification(
    b: &mut Builder,
    c: &BertConfig,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    debug_assert_eq!(cfg.arch.head(), Head::TokenClassification);
    let h = bert_encoder(b, c, cfg, opts)?; // (B, T, C)
    let h = b.dropout(h, c.classifier_dropout.unwrap_or(c.hidden_dropout_prob))?;
    b.linear(h, "classifier") // (B, T, num_labels)
}

/// `RobertaForSequenceClassification`: encoder (no pooler) → RobertaClassificationHead (token
/// 0, dropout, dense, tanh, dropout, out_proj; dropout `classifier_dropout` or
/// `hidden_dropout_prob`). Returns the logits (B, num_labels).
pub(super) fn roberta_for_sequence_classification(
    b: &mut Builder,
    c: &BertConfig,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    debug_assert_eq!(cfg.arch.head(), Head::SequenceClassification);
    let p = c.classifier_dropout.unwrap_or(c.hidden_dropout_prob);
    let h = bert_encoder(b, c, cfg, opts)?; // (B, T, C)
    let x = first_token(b, h)?; // (B, C)
    let x = b.dropout(x, p)?;
    let x = b.linear(x, "classifier.dense")?;
    let x = b.g.tanh(x)?;
    let x = b.dropout(x, p)?;
    b.linear(x, "classifier.out_proj") // (B, num_labels)
}
