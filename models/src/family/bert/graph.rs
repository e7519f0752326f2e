//! BERT as engine graphs: the same function as `torch.rs` beside it (transformers'
//! modeling_bert.py, absolute positions; with an attention mask when the graph is built for
//! padded batches — without one, pad tokens are attended to like any token, as HF does when no
//! `attention_mask` is passed).

use ortbench_engine::graph::TensorId;

use super::{BertConfig, INFO};
use crate::config::ModelConfig;
use crate::family::Head;
use crate::graph::{
    BResult, Builder, GraphOptions, INPUT_IDS, NOT_PAD_MASK, PAD_MASK, POSITION_IDS, TOKEN_TYPE_IDS,
};

/// The word-embedding lookup with `padding_idx`: rows of `table` for `ids`, where the padding
/// row gets no gradient from this lookup (it still gets one through a tied decoder).
///
/// The engine's embedding has no padding_idx, so: x·keep + stop_gradient(x)·pad, with keep/pad
/// the fed 0/1 masks of non-padding/padding positions and each product a batched K=1 matmul
/// (a per-row scale, (1,1)·(1,C)). Values are exact (x + 0 or 0 + x); the gradient w.r.t. x is
/// keep·dy, so the scatter-add into the table adds exact zeros at padding positions.
// ids: (B, T) -> (B, T, C)
fn word_embedding(
    b: &mut Builder,
    table: TensorId,
    ids: TensorId,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    let x = b.g.embedding(table, ids)?; // (B, T, C)
    let (bs, t) = (opts.batch_size, opts.seq_len);
    let c = b.g.shape(x)[2];
    let keep = b.g.input_float(NOT_PAD_MASK, &[bs, t, 1, 1])?; // (B, T, 1, 1)
    let pad = b.g.input_float(PAD_MASK, &[bs, t, 1, 1])?; // (B, T, 1, 1)
    let x4 = b.g.reshape(x, &[bs, t, 1, c])?; // (B, T, 1, C)
    let frozen = b.stop_gradient(x4)?; // (B, T, 1, C), no gradient
    let kept = b.g.matmul(keep, x4, false, false)?; // (B, T, 1, C)
    let padded = b.g.matmul(pad, frozen, false, false)?; // (B, T, 1, C)
    let y = b.g.add(kept, padded)?;
    Ok(b.g.reshape(y, &[bs, t, c])?)
}

/// `BertEmbeddings`: word + token_type (zeros) + position embeddings → LayerNorm → dropout.
// returns (B, T, C)
fn bert_embeddings(b: &mut Builder, c: &BertConfig, opts: &GraphOptions) -> BResult<TensorId> {
    let (bs, t) = (opts.batch_size, opts.seq_len);
    let ids = b.g.input_ids(INPUT_IDS, &[bs, t])?; // (B, T)
    let token_types = b.g.input_ids(TOKEN_TYPE_IDS, &[bs, t])?; // (B, T)
    let positions = b.g.input_ids(POSITION_IDS, &[t])?; // (T)
    let word_table = b.p(INFO.word_embedding);
    let word = match c.padding_idx() {
        Some(_) => word_embedding(b, word_table, ids, opts)?,
        None => b.g.embedding(word_table, ids)?,
    }; // (B, T, C)
    let tt = b.g.embedding(b.p("bert.embeddings.token_type_embeddings.weight"), token_types)?; // (B, T, C)
    let pos = b.g.embedding(b.p("bert.embeddings.position_embeddings.weight"), positions)?; // (T, C)
    let x = b.g.add(word, tt)?;
    let x = b.g.add(x, pos)?; // (B, T, C), positions broadcast over B
    let x = b.layer_norm(x, "bert.embeddings.LayerNorm", c.layer_norm_eps)?;
    b.dropout(x, c.hidden_dropout_prob)
}

/// `BertLayer` (post-LN): BertSelfAttention (eager: q·kᵀ/√D, softmax, dropout, ·v) → BertSelfOutput (dense, dropout,
/// residual, LayerNorm) → BertIntermediate (dense, act) → BertOutput (dense, dropout,
/// residual, LayerNorm).
// x: (B, T, C) -> (B, T, C)
fn bert_layer(
    b: &mut Builder,
    x: TensorId,
    p: &str,
    c: &BertConfig,
    cfg: &ModelConfig,
) -> BResult<TensorId> {
    let heads = c.num_attention_heads;
    let q = b.linear(x, &format!("{p}.attention.self.query"))?; // (B, T, C)
    let k = b.linear(x, &format!("{p}.attention.self.key"))?;
    let v = b.linear(x, &format!("{p}.attention.self.value"))?;
    let (q, k, v) = (b.split_heads(q, heads)?, b.split_heads(k, heads)?, b.split_heads(v, heads)?); // (B, H, T, D)
    let ctx = b.eager_attention(q, k, v, false, c.attention_probs_dropout_prob)?; // (B, H, T, D)
    let ctx = b.merge_heads(ctx)?; // (B, T, C)
    let a = b.linear(ctx, &format!("{p}.attention.output.dense"))?;
    let a = b.dropout(a, c.hidden_dropout_prob)?;
    let a = b.g.add(a, x)?;
    let a = b.layer_norm(a, &format!("{p}.attention.output.LayerNorm"), c.layer_norm_eps)?; // (B, T, C)
    let h = b.linear(a, &format!("{p}.intermediate.dense"))?; // (B, T, I)
    let h = b.activation(h, cfg.activation())?;
    let o = b.linear(h, &format!("{p}.output.dense"))?; // (B, T, C)
    let o = b.dropout(o, c.hidden_dropout_prob)?;
    let o = b.g.add(o, a)?;
    b.layer_norm(o, &format!("{p}.output.LayerNorm"), c.layer_norm_eps)
}

/// `BertModel` without the pooler: embeddings and the encoder layers.
// returns (B, T, C)
fn bert_encoder(
    b: &mut Builder,
    c: &BertConfig,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    let mut x = bert_embeddings(b, c, opts)?;
    for i in 0..c.num_hidden_layers {
        x = bert_layer(b, x, &format!("bert.encoder.layer.{i}"), c, cfg)?;
    }
    Ok(x)
}

/// `BertForMaskedLM`: encoder → BertOnlyMLMHead (transform: dense, act, LayerNorm; decoder
/// tied to the word embedding unless `tie_word_embeddings` is false; `cls.predictions.bias`).
/// Returns the logits (B, T, V); the loss (mean cross-entropy over labels ≠ −100) is added by
/// the caller.
pub(super) fn bert_for_masked_lm(
    b: &mut Builder,
    c: &BertConfig,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    debug_assert_eq!(cfg.arch.head(), Head::MaskedLm);
    let h = bert_encoder(b, c, cfg, opts)?; // (B, T, C)
    let h = b.linear(h, "cls.predictions.transform.dense")?;
    let h = b.activation(h, cfg.activation())?;
    let h = b.layer_norm(h, "cls.predictions.transform.LayerNorm", c.layer_norm_eps)?; // (B, T, C)
    let decoder = if c.tie_word_embeddings { INFO.word_embedding } else { INFO.untied_head };
    let logits = b.g.matmul(h, b.p(decoder), false, true)?; // (B, T, V)
    Ok(b.g.bias_add(logits, b.p("cls.predictions.bias"))?) // (B, T, V)
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
    let (bs, t) = (opts.batch_size, opts.seq_len);
    let h = bert_encoder(b, c, cfg, opts)?; // (B, T, C)
    let hidden = c.hidden_size;
    // hidden_states[:, 0]: the first C values of each (T·C) row.
    let flat = b.g.reshape(h, &[bs, t * hidden])?; // (B, T·C)
    let first = if t > 1 { b.g.split(flat, &[hidden, (t - 1) * hidden])?[0] } else { flat }; // (B, C)
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
