//! The Llama family as an engine graph: the same function as `torch.rs` beside it, in HF's
//! eager form (modeling_llama.py's `eager_attention_forward`: repeat_kv, q·kᵀ·scale + mask,
//! softmax, dropout, ·v — the engine passes fuse it), on the engine's rms_norm, rotary and
//! repeat_kv ops. The rotary cos/sin tables are fed graph inputs ([`ROPE_COS`], [`ROPE_SIN`])
//! computed on the host in f32 as HF computes them (Gemma 3's sliding layers' own: [`ROPE_COS_LOCAL`],
//! [`ROPE_SIN_LOCAL`]); a sliding window that bites is the fed additive mask
//! [`SLIDING_WINDOW_MASK`]. Gemma 2's soft-capped attention is written eager too (the passes
//! fuse it, soft-cap and all); padded, it reads HF's eager float masks ([`EAGER_MASK`]).

use ortbench_engine::graph::{GeluApprox, TensorId};
use ortbench_engine::ops::pointwise::{BinaryFn, UnaryFn};

use super::{LayerType, LlamaConfig, EMBED};
use crate::config::{Activation, ModelConfig};
use crate::family::bert::padded_lookup;
use crate::graph::{
    BResult, Builder, GraphOptions, EAGER_MASK, EAGER_SLIDING_MASK, INPUT_IDS, LAST_TOKEN,
    ROPE_COS, ROPE_COS_LOCAL, ROPE_SIN, ROPE_SIN_LOCAL, SLIDING_WINDOW_MASK,
};
use crate::ModelError;

/// nn.Linear `{prefix}` with or without its bias.
fn proj(b: &mut Builder, x: TensorId, prefix: &str, bias: bool) -> BResult<TensorId> {
    if bias {
        b.linear(x, prefix)
    } else {
        let w = b.p(&format!("{prefix}.weight"));
        Ok(b.g.linear(x, w, None)?)
    }
}

/// LlamaRMSNorm `{prefix}.weight` (w · x̂), or GemmaRMSNorm's (1 + w) · x̂ (`offset`).
fn rms_norm(
    b: &mut Builder,
    x: TensorId,
    prefix: &str,
    eps: f64,
    offset: bool,
) -> BResult<TensorId> {
    let w = b.p(&format!("{prefix}.weight"));
    let w = if offset {
        let n = b.g.shape(w).to_vec();
        let one = b.g.fill(&n, 1.0);
        b.g.add(w, one)? // (C): 1 + w
    } else {
        w
    };
    Ok(b.g.rms_norm(x, w, eps as f32)?)
}

/// apply_rotary_pos_emb on one of q, k with `tables` (cos, sin): the whole head, or (Phi-3's
/// partial rotary) its first R dimensions, the rest passed through: cat(rotary(x[..., :R]),
/// x[..., R:]).
// x: (B, n, T, D) -> (B, n, T, D)
fn rotary(
    b: &mut Builder,
    x: TensorId,
    c: &LlamaConfig,
    (cos, sin): (TensorId, TensorId),
) -> BResult<TensorId> {
    if c.rotary_dim == c.head_dim {
        return Ok(b.g.rotary(x, cos, sin)?);
    }
    let parts = b.g.split(x, &[c.rotary_dim, c.head_dim - c.rotary_dim])?; // (…, R), (…, D − R)
    let turned = b.g.rotary(parts[0], cos, sin)?;
    Ok(b.g.concat(&[turned, parts[1]])?)
}

/// The rotary tables and masks every layer reads.
struct Shared {
    /// (cos, sin), each (T, R).
    rope: (TensorId, TensorId),
    /// Gemma 3's sliding layers' (cos, sin).
    local_rope: Option<(TensorId, TensorId)>,
    /// The additive mask of full layers: the padding mask (or none), or Gemma 2's eager mask.
    full_mask: Option<TensorId>,
    /// The additive mask of sliding layers (padding + window), when the window bites; else
    /// they read `full_mask`.
    sliding_mask: Option<TensorId>,
    /// Whether the softmax applies the causal mask itself (not with Gemma 2's eager masks,
    /// which hold it).
    causal: bool,
}

/// LlamaAttention (and the other types'): q/k/v projections (Phi-3: one fused), [q_norm /
/// k_norm], rotary (not on SmolLM3's NoPE layers; Gemma 3's sliding layers with their own
/// tables), repeat_kv, eager attention (scale head_dim^-½ or Gemma's query_pre_attn_scalar^-½,
/// Gemma 2's soft-capped scores; the layer's mask), o_proj.
// h: (B, T, C) -> (B, T, C)
fn self_attention(
    b: &mut Builder,
    h: TensorId,
    i: usize,
    c: &LlamaConfig,
    s: &Shared,
) -> BResult<TensorId> {
    let p = format!("model.layers.{i}");
    let (bs, t) = (b.g.shape(h)[0], b.g.shape(h)[1]);
    let (d, heads, kv_heads) = (c.head_dim, c.num_attention_heads, c.num_key_value_heads);
    // view(B, T, -1, D) [q_norm / k_norm over D] .transpose(1, 2)
    let split = |b: &mut Builder, y: TensorId, n: usize, norm: Option<&str>| -> BResult<TensorId> {
        let y = b.g.reshape(y, &[bs, t, n, d])?;
        let y = match norm {
            Some(name) => {
                rms_norm(b, y, &format!("{p}.self_attn.{name}"), c.rms_norm_eps, c.norm_offset)?
            }
            None => y,
        };
        Ok(b.g.permute(y, &[0, 2, 1, 3])?) // (B, n, T, D)
    };
    let (q, k, v) = if c.fused_projections {
        // Phi-3: qkv[..., :H·D], then K·D, then K·D.
        let qkv = proj(b, h, &format!("{p}.self_attn.qkv_proj"), false)?; // (B, T, (H + 2K)·D)
        let parts = b.g.split(qkv, &[heads * d, kv_heads * d, kv_heads * d])?;
        (parts[0], parts[1], parts[2])
    } else {
        let q = proj(b, h, &format!("{p}.self_attn.q_proj"), c.qkv_bias)?;
        let k = proj(b, h, &format!("{p}.self_attn.k_proj"), c.qkv_bias)?;
        let v = proj(b, h, &format!("{p}.self_attn.v_proj"), c.qkv_bias)?;
        (q, k, v)
    };
    let q = split(b, q, heads, c.qk_norm.then_some("q_norm"))?;
    let k = split(b, k, kv_heads, c.qk_norm.then_some("k_norm"))?;
    let v = split(b, v, kv_heads, None)?;
    let sliding = c.layer_types[i] == LayerType::Sliding;
    let tables = match s.local_rope {
        Some(local) if sliding => local,
        _ => s.rope,
    };
    // SmolLM3's NoPE layers leave q and k unrotated.
    let (q, k) = if c.rope_layers[i] {
        (rotary(b, q, c, tables)?, rotary(b, k, c, tables)?)
    } else {
        (q, k)
    };
    let k = b.g.repeat_kv(k, c.n_rep())?; // (B, H, T, D)
    let v = b.g.repeat_kv(v, c.n_rep())?;
    let mask = if sliding { s.sliding_mask.or(s.full_mask) } else { s.full_mask };
    let scale = match c.query_pre_attn_scalar {
        Some(s) => s.powf(-0.5) as f32, // a Python float: f64, then the f32 op's scalar
        None => 1.0 / (d as f32).sqrt(),
    };
    let scores = (scale, c.attn_logit_softcapping); // Gemma 2's soft-capped
    let p_drop = c.attention_dropout;
    let ctx = b.eager_attention_scaled(q, k, v, s.causal, scores, p_drop, mask)?; // (B, H, T, D)
    let ctx = b.merge_heads(ctx)?; // (B, T, H·D)
    proj(b, ctx, &format!("{p}.self_attn.o_proj"), c.o_bias)
}

/// LlamaMLP: down(act(gate(x)) · up(x)), SiLU (SwiGLU) or Gemma's tanh GELU (GeGLU); Phi-3's
/// gate and up from one fused projection.
// h: (B, T, C) -> (B, T, C)
fn mlp(b: &mut Builder, h: TensorId, p: &str, c: &LlamaConfig) -> BResult<TensorId> {
    let (gate, up) = if c.fused_projections {
        // Phi-3: gate_up.chunk(2, dim=-1).
        let gate_up = proj(b, h, &format!("{p}.mlp.gate_up_proj"), false)?; // (B, T, 2I)
        let inter = c.intermediate_size;
        let parts = b.g.split(gate_up, &[inter, inter])?;
        (parts[0], parts[1])
    } else {
        let gate = proj(b, h, &format!("{p}.mlp.gate_proj"), c.mlp_bias)?;
        (gate, proj(b, h, &format!("{p}.mlp.up_proj"), c.mlp_bias)?)
    };
    let act = match c.mlp_act {
        Activation::GeluTanh => b.g.gelu(gate, GeluApprox::Tanh)?,
        _ => b.g.apply(UnaryFn::Silu, gate)?,
    };
    let m = b.g.apply2(BinaryFn::Mul, act, up)?;
    proj(b, m, &format!("{p}.mlp.down_proj"), c.mlp_bias)
}

/// LlamaDecoderLayer: input_layernorm → attention → residual; post_attention_layernorm → MLP →
/// residual. Phi3DecoderLayer: dropout before each residual add. Gemma 2/3's (sandwich norms):
/// input_layernorm → attention → post_attention_layernorm → residual; pre_feedforward_layernorm
/// → MLP → post_feedforward_layernorm → residual.
// x: (B, T, C) -> (B, T, C)
fn decoder_layer(
    b: &mut Builder,
    x: TensorId,
    i: usize,
    c: &LlamaConfig,
    s: &Shared,
) -> BResult<TensorId> {
    let p = format!("model.layers.{i}");
    let norm = |b: &mut Builder, x: TensorId, name: &str| {
        rms_norm(b, x, &format!("{p}.{name}"), c.rms_norm_eps, c.norm_offset)
    };
    let resid = |b: &mut Builder, y: TensorId| match c.resid_dropout {
        Some(p) => b.dropout(y, p),
        None => Ok(y),
    };
    let h = norm(b, x, "input_layernorm")?;
    let a = self_attention(b, h, i, c, s)?;
    let a = resid(b, a)?;
    let a = if c.sandwich_norms { norm(b, a, "post_attention_layernorm")? } else { a };
    let x = b.g.add(x, a)?;
    let before_mlp =
        if c.sandwich_norms { "pre_feedforward_layernorm" } else { "post_attention_layernorm" };
    let h = norm(b, x, before_mlp)?;
    let m = mlp(b, h, &p, c)?;
    let m = resid(b, m)?;
    let m = if c.sandwich_norms { norm(b, m, "post_feedforward_layernorm")? } else { m };
    Ok(b.g.add(x, m)?)
}

/// LlamaModel: embed_tokens, the rotary tables, the layers, norm.
// returns (B, T, C)
fn llama_model(b: &mut Builder, c: &LlamaConfig, opts: &GraphOptions) -> BResult<TensorId> {
    let (bs, t) = (opts.batch_size, opts.seq_len);
    let ids = b.g.input_ids(INPUT_IDS, &[bs, t])?;
    let table = b.p(EMBED);
    let mut x = match c.padding_idx() {
        Some(_) => padded_lookup(b, table, ids, &mut None, opts)?,
        None => b.g.embedding(table, ids)?,
    };
    if let Some(scale) = c.embed_scale {
        // Gemma: × √hidden, the factor in the activations' dtype as HF casts it.
        x = b.g.scale(x, opts.dtype.round(scale))?;
    }
    let cos = b.g.input_float(ROPE_COS, &[t, c.rotary_dim])?; // (T, R), R ≤ D
    let sin = b.g.input_float(ROPE_SIN, &[t, c.rotary_dim])?;
    let local_rope = match c.local_rope() {
        Some(_) => Some((
            b.g.input_float(ROPE_COS_LOCAL, &[t, c.rotary_dim])?,
            b.g.input_float(ROPE_SIN_LOCAL, &[t, c.rotary_dim])?,
        )),
        None => None,
    };
    let window = c.biting_window(t).is_some();
    let (full_mask, sliding_mask, causal) = if c.eager_attention && b.attention_mask().is_some() {
        let full = b.g.input_float(EAGER_MASK, &[bs, 1, t, t])?;
        let sliding =
            if window { Some(b.g.input_float(EAGER_SLIDING_MASK, &[bs, 1, t, t])?) } else { None };
        (Some(full), sliding, false)
    } else {
        let sliding =
            if window { Some(b.g.input_float(SLIDING_WINDOW_MASK, &[bs, 1, t, t])?) } else { None };
        (b.attention_mask(), sliding, true)
    };
    let s = Shared { rope: (cos, sin), local_rope, full_mask, sliding_mask, causal };
    for i in 0..c.num_hidden_layers {
        x = decoder_layer(b, x, i, c, &s)?;
    }
    rms_norm(b, x, "model.norm", c.rms_norm_eps, c.norm_offset)
}

fn check_len(c: &LlamaConfig, cfg: &ModelConfig, t: usize) -> BResult<()> {
    if t < 2 && cfg.arch.head() == crate::family::Head::CausalLm {
        return Err(ModelError::Data(format!(
            "{} needs a sequence length of at least 2 (its loss pairs token t with t+1), got {t}",
            cfg.arch.hf_name()
        ))
        .into());
    }
    let _ = c;
    Ok(())
}

/// `…ForCausalLM`: the model, lm_head (no bias; embed_tokens when tied). Returns the logits
/// (B, T, V); the caller's loss reads the shifted labels (see `EngineModel::feed`).
pub(super) fn for_causal_lm(
    b: &mut Builder,
    c: &LlamaConfig,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    check_len(c, cfg, opts.seq_len)?;
    let x = llama_model(b, c, opts)?;
    let head = if c.tie_word_embeddings { EMBED } else { "lm_head.weight" };
    let logits = b.g.matmul(x, b.p(head), false, true)?; // (B, T, V)
    match c.final_logit_softcapping {
        Some(cap) => b.softcap(logits, cap), // Gemma 2
        None => Ok(logits),
    }
}

/// `…ForSequenceClassification` (GenericForSequenceClassification): the model, score (no bias)
/// at each row's last non-pad token (the fed one-hot selector, as GPT-2's builder). Returns the
/// logits (B, num_labels).
pub(super) fn for_sequence_classification(
    b: &mut Builder,
    c: &LlamaConfig,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    let bs = opts.batch_size;
    if c.pad_token_id.is_none() && bs != 1 {
        return Err(ModelError::BadConfig(format!(
            "{} without a pad_token_id cannot find the last token of padded rows (HF refuses batches > 1): set pad_token_id in config.json",
            cfg.arch.hf_name()
        ))
        .into());
    }
    check_len(c, cfg, opts.seq_len)?;
    let x = llama_model(b, c, opts)?;
    let sel = b.g.input_float(LAST_TOKEN, &[bs, 1, opts.seq_len])?;
    let pooled = b.g.matmul(sel, x, false, false)?; // (B, 1, C)
    let pooled = b.g.reshape(pooled, &[bs, c.hidden_size])?;
    Ok(b.g.matmul(pooled, b.p("score.weight"), false, true)?)
}
