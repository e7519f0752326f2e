//! GPT-2 as an engine graph: the same function as `torch.rs` beside it (transformers'
//! modeling_gpt2.py, eager attention as HF writes it — the engine passes fuse it —, the
//! padding mask combined with the causal one when the graph is built for padded batches).

use ortbench_engine::graph::TensorId;

use super::{Gpt2Config, INFO};
use crate::config::ModelConfig;
use crate::graph::{BResult, Builder, GraphOptions, INPUT_IDS, LAST_TOKEN, POSITION_IDS};
use crate::ModelError;

/// `GPT2Block` (pre-LN): ln_1 → GPT2Attention (c_attn split into q, k, v; causal eager attention;
/// c_proj; resid dropout) → residual; ln_2 → GPT2MLP (c_fc, act, c_proj, dropout) → residual.
// x: (B, T, C) -> (B, T, C)
fn gpt2_block(
    b: &mut Builder,
    x: TensorId,
    p: &str,
    c: &Gpt2Config,
    cfg: &ModelConfig,
) -> BResult<TensorId> {
    let e = c.n_embd;
    let h = b.layer_norm(x, &format!("{p}.ln_1"), c.layer_norm_epsilon)?;
    let qkv = b.conv1d(h, &format!("{p}.attn.c_attn"))?; // (B, T, 3C)
    let parts = b.g.split(qkv, &[e, e, e])?; // 3 × (B, T, C)
    let q = b.split_heads(parts[0], c.n_head)?; // (B, H, T, D)
    let k = b.split_heads(parts[1], c.n_head)?;
    let v = b.split_heads(parts[2], c.n_head)?;
    // scale_attn_weights: 1/√D; HF is causal whenever T > 1, and a
    // causal mask over one position changes nothing.
    let ctx = b.eager_attention(q, k, v, true, c.attn_pdrop)?; // (B, H, T, D)
    let ctx = b.merge_heads(ctx)?; // (B, T, C)
    let a = b.conv1d(ctx, &format!("{p}.attn.c_proj"))?;
    let a = b.dropout(a, c.resid_pdrop)?;
    let x = b.g.add(x, a)?; // (B, T, C)
    let h = b.layer_norm(x, &format!("{p}.ln_2"), c.layer_norm_epsilon)?;
    let h = b.conv1d(h, &format!("{p}.mlp.c_fc"))?; // (B, T, 4C)
    let h = b.activation(h, cfg.activation())?;
    let h = b.conv1d(h, &format!("{p}.mlp.c_proj"))?; // (B, T, C)
    let h = b.dropout(h, c.resid_pdrop)?;
    Ok(b.g.add(x, h)?)
}

/// `GPT2LMHeadModel`: GPT2Model (wte + wpe, embd dropout, blocks, ln_f) → lm_head (no bias,
/// tied to wte unless `tie_word_embeddings` is false). Returns the logits (B, T, V); the caller
/// adds the loss, the mean cross-entropy of logits[:, :-1] against labels[:, 1:] — the shift
/// is in the fed labels (see `EngineModel::feed`): position t carries label t+1, the last −100.
pub(super) fn gpt2_lm_head_model(
    b: &mut Builder,
    c: &Gpt2Config,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    let t = opts.seq_len;
    if t < 2 {
        return Err(ModelError::Data(format!(
            "GPT2LMHeadModel needs a sequence length of at least 2 (its loss pairs token t with t+1), got {t}"
        ))
        .into());
    }
    let x = gpt2_model(b, c, cfg, opts)?; // (B, T, C)
    let head = if c.tie_word_embeddings { INFO.word_embedding } else { INFO.untied_head };
    Ok(b.g.matmul(x, b.p(head), false, true)?) // (B, T, V)
}

/// `GPT2ForSequenceClassification`: GPT2Model → score (no bias) at each row's last non-pad
/// token; returns the logits (B, num_labels), the caller adds the problem type's loss. HF scores
/// every position and then indexes; here the
/// fed one-hot selector (B, 1, T) picks the pooled hidden state first (a K = T matmul: 1·x plus
/// exact zeros), the same values. Without a pad token HF takes the last position and refuses
/// batches of more than one row; so does this. Returns the loss.
pub(super) fn gpt2_for_sequence_classification(
    b: &mut Builder,
    c: &Gpt2Config,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    let bs = opts.batch_size;
    if c.pad_token_id.is_none() && bs != 1 {
        return Err(ModelError::BadConfig(
            "GPT2ForSequenceClassification without a pad_token_id cannot find the last token of padded rows (HF refuses batches > 1): set pad_token_id in config.json".into(),
        )
        .into());
    }
    let x = gpt2_model(b, c, cfg, opts)?; // (B, T, C)
    let sel = b.g.input_float(LAST_TOKEN, &[bs, 1, opts.seq_len])?; // (B, 1, T)
    let pooled = b.g.matmul(sel, x, false, false)?; // (B, 1, C)
    let pooled = b.g.reshape(pooled, &[bs, c.n_embd])?; // (B, C)
    Ok(b.g.matmul(pooled, b.p("score.weight"), false, true)?) // (B, num_labels)
}

/// `GPT2Model`: wte + wpe, embd dropout, the blocks, ln_f.
// returns (B, T, C)
fn gpt2_model(
    b: &mut Builder,
    c: &Gpt2Config,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    let (bs, t) = (opts.batch_size, opts.seq_len);
    let ids = b.g.input_ids(INPUT_IDS, &[bs, t])?; // (B, T)
    let positions = b.g.input_ids(POSITION_IDS, &[t])?; // (T)
    let tok = b.g.embedding(b.p(INFO.word_embedding), ids)?; // (B, T, C)
    let pos = b.g.embedding(b.p("transformer.wpe.weight"), positions)?; // (T, C)
    let x = b.g.add(tok, pos)?; // (B, T, C), positions broadcast over B
    let mut x = b.dropout(x, c.embd_pdrop)?;
    for i in 0..c.n_layer {
        x = gpt2_block(b, x, &format!("transformer.h.{i}"), c, cfg)?;
    }
    b.layer_norm(x, "transformer.ln_f", c.layer_norm_epsilon) // (B, T, C)
}
