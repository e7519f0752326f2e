//! The Llama family as transformers/models/{llama,mistral,qwen2,qwen3,smollm3,phi3,gemma,gemma2,
//! gemma3}/modeling_*.py write it (HF 5.23, sdpa attention: `integrations/sdpa_attention.py`;
//! masks as `masking_utils` builds them for sdpa). Gemma 2's soft-capped attention is HF's
//! `eager_attention_forward` (its default: sdpa has no soft-capping) on eager's float masks.

use tch::{Kind, Tensor};

use super::{LayerType, LlamaConfig, Rope, RopeScaling, EMBED};
use crate::config::{Activation, ModelConfig};
use crate::torch::heads::{CausalLm, Decoder, LastTokenClassifier};
use crate::torch::layers::padding_mask;
use crate::torch::{TorchLoss, Vars};

/// nn.Linear with an optional bias.
struct Proj {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Proj {
    fn new(v: &Vars, prefix: &str, bias: bool) -> Self {
        Proj {
            weight: v.get(&format!("{prefix}.weight")),
            bias: bias.then(|| v.get(&format!("{prefix}.bias"))),
        }
    }
    fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.weight, self.bias.as_ref())
    }
}

/// LlamaRMSNorm: in f32, `weight * hidden_states.to(input_dtype)`; GemmaRMSNorm (`offset`):
/// `(x̂ * (1 + weight.float())).type_as(x)`, the product in f32.
struct RmsNorm {
    weight: Tensor,
    eps: f64,
    offset: bool,
}

impl RmsNorm {
    fn new(v: &Vars, prefix: &str, c: &LlamaConfig) -> Self {
        let weight = v.get(&format!("{prefix}.weight"));
        RmsNorm { weight, eps: c.rms_norm_eps, offset: c.norm_offset }
    }
    fn forward(&self, x: &Tensor) -> Tensor {
        let input_dtype = x.kind();
        let h = x.to_kind(Kind::Float);
        let variance = h.pow_tensor_scalar(2).mean_dim(-1, true, None);
        let h = &h * (variance + self.eps).rsqrt();
        if self.offset {
            return (h * (self.weight.to_kind(Kind::Float) + 1.0)).to_kind(input_dtype);
        }
        &self.weight * h.to_kind(input_dtype)
    }
}

/// HF's rope parameter functions (`compute_default_rope_parameters`, `_compute_llama3_…`,
/// `_compute_linear_scaling_…`, `_compute_dynamic_ntk_…` at a sequence of `t`,
/// `_compute_yarn_…`): inv_freq (D/2,) f32, op by op as HF writes them.
fn inv_freq(c: &LlamaConfig, rope: &Rope, t: i64, device: tch::Device) -> Tensor {
    // int(head_dim * partial_rotary_factor)
    let dim = c.rotary_dim as i64;
    let exps = Tensor::arange_start_step(0, dim, 2, (Kind::Int64, device)).to_kind(Kind::Float)
        / dim as f64;
    let inv = Tensor::pow_scalar(rope.theta, &exps).reciprocal();
    match rope.scaling.clone() {
        RopeScaling::Default => inv,
        RopeScaling::Linear { factor } => inv / factor,
        RopeScaling::Dynamic { factor, max_position_embeddings: max } => {
            // seq_len = torch.maximum(seq_len, max_position_embeddings), an int64 tensor.
            let seq = Tensor::from(t.max(max as i64)).to_device(device);
            let d = dim as f64;
            let base = ((seq * factor / max) - (factor - 1.0)).pow_tensor_scalar(d / (d - 2.0))
                * rope.theta;
            base.pow(&exps).reciprocal()
        }
        RopeScaling::Yarn {
            factor,
            beta_fast,
            beta_slow,
            truncate,
            original_max_position_embeddings: old,
            ..
        } => {
            let d = dim as f64;
            let corr = |rot: f64| {
                (d * (old / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * rope.theta.ln())
            };
            let (mut low, mut high) = (corr(beta_fast), corr(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
            if low == high {
                high += 0.001;
            }
            let pos_freqs = Tensor::pow_scalar(rope.theta, &exps);
            let extrapolation = pos_freqs.reciprocal();
            let interpolation = (&pos_freqs * factor).reciprocal();
            let ramp = ((Tensor::arange(dim / 2, (Kind::Float, device)) - low) / (high - low))
                .clamp(0.0, 1.0);
            let extrapolation_factor = -ramp + 1.0;
            interpolation * (-&extrapolation_factor + 1.0) + extrapolation * extrapolation_factor
        }
        RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings: old,
            ..
        } => {
            // longrope_frequency_update: the long factors once the sequence passes the original length.
            let ext = if t as f64 > old { long_factor } else { short_factor };
            let ext: Vec<f32> = ext.iter().map(|&x| x as f32).collect();
            let ext = Tensor::from_slice(&ext).to_device(device);
            (ext * Tensor::pow_scalar(rope.theta, &exps)).reciprocal()
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old,
        } => {
            let low_freq_wavelen = old / low_freq_factor;
            let high_freq_wavelen = old / high_freq_factor;
            let wavelen = inv.reciprocal() * (2.0 * std::f64::consts::PI);
            // torch.where(cond, a, b) is a.where_self(cond, b) in tch.
            let inv_freq_llama = (&inv / factor).where_self(&wavelen.gt(low_freq_wavelen), &inv);
            let smooth_factor = (wavelen.reciprocal() * old - low_freq_factor)
                / (high_freq_factor - low_freq_factor);
            let smoothed = (-&smooth_factor + 1.0) * &inv_freq_llama / factor
                + &smooth_factor * &inv_freq_llama;
            let is_medium = wavelen
                .lt(high_freq_wavelen)
                .logical_not()
                .logical_and(&wavelen.gt(low_freq_wavelen).logical_not());
            smoothed.where_self(&is_medium, &inv_freq_llama)
        }
    }
}

/// LlamaRotaryEmbedding.forward (Gemma 3's per layer type): cos, sin (1, T, D) of
/// cat(freqs, freqs), freqs = position_ids · inv_freq in f32, times attention_scaling (yarn's
/// attention factor, else 1).
fn rotary_tables(c: &LlamaConfig, rope: &Rope, t: i64, like: &Tensor) -> (Tensor, Tensor) {
    let inv = inv_freq(c, rope, t, like.device());
    let pos = Tensor::arange(t, (Kind::Int64, like.device())).unsqueeze(0); // (1, T)
    let freqs = pos.unsqueeze(-1).to_kind(Kind::Float) * inv; // (1, T, D/2)
    let emb = Tensor::cat(&[&freqs, &freqs], -1);
    // A python float times an f32 tensor: the factor is applied in f32.
    let scale = f64::from(rope.attention_scaling());
    ((emb.cos() * scale).to_kind(like.kind()), (emb.sin() * scale).to_kind(like.kind()))
}

fn rotate_half(x: &Tensor) -> Tensor {
    let d = x.size()[x.dim() - 1];
    let x1 = x.narrow(-1, 0, d / 2);
    let x2 = x.narrow(-1, d / 2, d - d / 2);
    Tensor::cat(&[&(-x2), &x1], -1)
}

/// apply_rotary_pos_emb for one tensor (cos/sin unsqueezed at dim 1); with fewer rotary
/// dimensions than the head (Phi-3's partial rotary), the first R turned and the rest passed
/// through, as Phi-3's version writes it.
// x: (B, H, T, D), cos/sin: (1, T, R)
fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let (cos, sin) = (cos.unsqueeze(1), sin.unsqueeze(1));
    let (d, r) = (x.size()[3], cos.size()[3]);
    if r == d {
        return x * &cos + rotate_half(x) * &sin;
    }
    let (x_rot, x_pass) = (x.narrow(-1, 0, r), x.narrow(-1, r, d - r));
    Tensor::cat(&[&x_rot * &cos + rotate_half(&x_rot) * &sin, x_pass], -1)
}

/// repeat_kv: (B, KV, T, D) → (B, KV·n_rep, T, D).
fn repeat_kv(x: &Tensor, n_rep: i64) -> Tensor {
    if n_rep == 1 {
        return x.shallow_clone();
    }
    let (b, kv, t, d) = x.size4().expect("(B, KV, T, D)");
    x.unsqueeze(2).expand([b, kv, n_rep, t, d], false).reshape([b, kv * n_rep, t, d])
}

/// The attention's input projections: q, k, v (Llama) or Phi-3's `qkv_proj`.
enum Qkv {
    Separate { q: Proj, k: Proj, v: Proj },
    Fused { qkv: Proj, q: i64, kv: i64 },
}

impl Qkv {
    // x: (B, T, C) -> (B, T, H·D), (B, T, K·D), (B, T, K·D)
    fn forward(&self, x: &Tensor) -> (Tensor, Tensor, Tensor) {
        match self {
            Qkv::Separate { q, k, v } => (q.forward(x), k.forward(x), v.forward(x)),
            Qkv::Fused { qkv, q, kv } => {
                // Phi3Attention: qkv[..., :q], qkv[..., q:q + kv], qkv[..., q + kv:].
                let y = qkv.forward(x);
                (y.narrow(-1, 0, *q), y.narrow(-1, *q, *kv), y.narrow(-1, q + kv, *kv))
            }
        }
    }
}

/// The MLP's gate and up projections: separate (Llama) or Phi-3's `gate_up_proj`.
enum GateUp {
    Separate { gate: Proj, up: Proj },
    Fused(Proj),
}

impl GateUp {
    // x: (B, T, C) -> gate, up: (B, T, I)
    fn forward(&self, x: &Tensor) -> (Tensor, Tensor) {
        match self {
            GateUp::Separate { gate, up } => (gate.forward(x), up.forward(x)),
            GateUp::Fused(p) => {
                let y = p.forward(x).chunk(2, -1);
                (y[0].shallow_clone(), y[1].shallow_clone())
            }
        }
    }
}

struct DecoderLayer {
    qkv: Qkv,
    o_proj: Proj,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    gate_up: GateUp,
    down_proj: Proj,
    /// Phi-3's resid_pdrop before each residual add.
    resid_dropout: Option<f64>,
    /// SiLU, or Gemma's tanh GELU.
    act: Activation,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    /// Gemma 2/3's pre_feedforward_layernorm and post_feedforward_layernorm (sandwich norms).
    feedforward_norms: Option<(RmsNorm, RmsNorm)>,
    sliding: bool,
    /// SmolLM3's `use_rope` (false on its NoPE layers).
    rope: bool,
}

/// What every layer shares: sizes and the step's position embeddings and masks.
struct Ctx<'a> {
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    dropout: f64,
    /// The scores' scale: head_dim^-½, Gemma 2/3's query_pre_attn_scalar^-½.
    scale: f64,
    /// Gemma 2: HF's eager attention (with its soft-capping, when set) in place of sdpa.
    eager: bool,
    softcap: Option<f64>,
    cos: &'a Tensor,
    sin: &'a Tensor,
    /// Gemma 3's sliding layers' (cos, sin).
    local: Option<(&'a Tensor, &'a Tensor)>,
    /// HF's boolean sdpa masks (true = attend) of full and sliding layers, None where HF
    /// passes none (sdpa's is_causal instead).
    full_mask: Option<&'a Tensor>,
    sliding_mask: Option<&'a Tensor>,
}

impl DecoderLayer {
    fn new(c: &LlamaConfig, v: &Vars, i: usize) -> Self {
        let p = format!("model.layers.{i}");
        let norm =
            |name: &str| c.qk_norm.then(|| RmsNorm::new(v, &format!("{p}.self_attn.{name}"), c));
        let (q, kv) = (
            (c.num_attention_heads * c.head_dim) as i64,
            (c.num_key_value_heads * c.head_dim) as i64,
        );
        let proj = |name: &str, bias: bool| Proj::new(v, &format!("{p}.{name}"), bias);
        let (qkv, gate_up) = if c.fused_projections {
            (
                Qkv::Fused { qkv: proj("self_attn.qkv_proj", false), q, kv },
                GateUp::Fused(proj("mlp.gate_up_proj", false)),
            )
        } else {
            (
                Qkv::Separate {
                    q: proj("self_attn.q_proj", c.qkv_bias),
                    k: proj("self_attn.k_proj", c.qkv_bias),
                    v: proj("self_attn.v_proj", c.qkv_bias),
                },
                GateUp::Separate {
                    gate: proj("mlp.gate_proj", c.mlp_bias),
                    up: proj("mlp.up_proj", c.mlp_bias),
                },
            )
        };
        DecoderLayer {
            qkv,
            o_proj: proj("self_attn.o_proj", c.o_bias),
            q_norm: norm("q_norm"),
            k_norm: norm("k_norm"),
            gate_up,
            down_proj: proj("mlp.down_proj", c.mlp_bias),
            resid_dropout: c.resid_dropout,
            input_layernorm: RmsNorm::new(v, &format!("{p}.input_layernorm"), c),
            post_attention_layernorm: RmsNorm::new(v, &format!("{p}.post_attention_layernorm"), c),
            feedforward_norms: c.sandwich_norms.then(|| {
                let norm = |name: &str| RmsNorm::new(v, &format!("{p}.{name}"), c);
                (norm("pre_feedforward_layernorm"), norm("post_feedforward_layernorm"))
            }),
            act: c.mlp_act,
            sliding: c.layer_types[i] == LayerType::Sliding,
            rope: c.rope_layers[i],
        }
    }

    // x: (B, T, C) -> (B, T, C)
    fn forward(&self, x: &Tensor, ctx: &Ctx, train: bool) -> Tensor {
        let h = self.input_layernorm.forward(x);
        let resid = |y: Tensor| match self.resid_dropout {
            Some(p) => y.dropout(p, train),
            None => y,
        };
        let a = resid(self.attention(&h, ctx, train));
        let (x, h) = match &self.feedforward_norms {
            // Gemma 2/3: post_attention_layernorm on the attention's output.
            Some((pre, _)) => {
                let x = x + self.post_attention_layernorm.forward(&a);
                let h = pre.forward(&x);
                (x, h)
            }
            None => {
                let x = x + a;
                let h = self.post_attention_layernorm.forward(&x);
                (x, h)
            }
        };
        let (gate, up) = self.gate_up.forward(&h);
        // Phi3MLP: up · act(gate); LlamaMLP: act(gate) · up — the same product.
        let gate = match self.act {
            Activation::GeluTanh => gate.gelu("tanh"),
            _ => gate.silu(),
        };
        let m = resid(self.down_proj.forward(&(gate * up)));
        match &self.feedforward_norms {
            Some((_, post)) => &x + post.forward(&m),
            None => &x + m,
        }
    }

    /// q/k/v, [q/k norms], rotary, attention (sdpa, or Gemma 2's eager, soft-capped form),
    /// o_proj.
    // h: (B, T, C) -> (B, T, C)
    fn attention(&self, h: &Tensor, ctx: &Ctx, train: bool) -> Tensor {
        let (b, t, _) = h.size3().expect("(B, T, C)");
        let d = ctx.head_dim;
        // view(B, T, -1, D) [q_norm / k_norm] .transpose(1, 2)
        let heads = |y: Tensor, norm: &Option<RmsNorm>| {
            let y = y.view([b, t, -1, d]);
            let y = match norm {
                Some(n) => n.forward(&y),
                None => y,
            };
            y.transpose(1, 2)
        };
        let (q, k, v) = self.qkv.forward(h);
        let (q, k, v) = (heads(q, &self.q_norm), heads(k, &self.k_norm), heads(v, &None));
        let (cos, sin) = match ctx.local {
            Some(local) if self.sliding => local,
            _ => (ctx.cos, ctx.sin),
        };
        let (q, k) = if self.rope {
            (apply_rotary(&q, cos, sin), apply_rotary(&k, cos, sin))
        } else {
            (q, k)
        };
        let mask = if self.sliding { ctx.sliding_mask } else { ctx.full_mask };
        let p = if train { ctx.dropout } else { 0.0 };
        let n_rep = ctx.heads / ctx.kv_heads;
        let ctx_out = if ctx.eager {
            eager(&q, &k, &v, mask, (ctx.scale, ctx.softcap, n_rep), p, train)
        } else {
            // sdpa_attention_forward: enable_gqa when there is no mask (and D ≤ 256), else
            // repeat_kv.
            let gqa = n_rep > 1 && mask.is_none() && d <= 256;
            let (k, v) = if n_rep > 1 && !gqa {
                (repeat_kv(&k, n_rep), repeat_kv(&v, n_rep))
            } else {
                (k, v)
            };
            let is_causal = t > 1 && mask.is_none();
            Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                mask,
                p,
                is_causal,
                Some(ctx.scale),
                gqa,
            )
        }; // (B, H, T, D)
        let a = ctx_out.transpose(1, 2).contiguous().reshape([b, t, -1]).contiguous();
        self.o_proj.forward(&a)
    }
}

/// Gemma 2's `eager_attention_forward`: repeat_kv, q·kᵀ·scaling, [/ cap, tanh, · cap], + the
/// eager float mask (HF's boolean mask as 0 / finfo.min; the causal one when there is none),
/// softmax in f32, dropout, ·v.
// q: (B, H, T, D), k, v: (B, K, T, D) -> (B, H, T, D)
fn eager(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    (scaling, softcap, n_rep): (f64, Option<f64>, i64),
    p: f64,
    train: bool,
) -> Tensor {
    let (k, v) = (repeat_kv(k, n_rep), repeat_kv(v, n_rep));
    let w = q.matmul(&k.transpose(2, 3)) * scaling;
    let w = match softcap {
        Some(cap) => (w / cap).tanh() * cap,
        None => w,
    };
    let t = q.size()[2];
    let allowed = match mask {
        Some(m) => m.shallow_clone(),
        None => Tensor::ones([t, t], (Kind::Bool, q.device())).tril(0).view([1, 1, t, t]),
    };
    let min = match q.kind() {
        Kind::Half => -65504.0,
        Kind::BFloat16 => -3.3895313892515355e38,
        _ => f64::from(f32::MIN),
    };
    let additive = Tensor::zeros(allowed.size(), (q.kind(), q.device()))
        .masked_fill(&allowed.logical_not(), min);
    let w = (w + additive).softmax(-1, Kind::Float).to_kind(q.kind());
    w.dropout(p, train).matmul(&v)
}

/// LlamaModel: embed_tokens (padding_idx = pad_token_id), rotary tables, masks, layers, norm.
struct LlamaModel {
    embed_tokens: Tensor,
    padding_idx: i64,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    config: LlamaConfig,
}

impl LlamaModel {
    fn new(c: &LlamaConfig, v: &Vars) -> Self {
        LlamaModel {
            embed_tokens: v.get(EMBED),
            padding_idx: c.padding_idx().unwrap_or(-1),
            layers: (0..c.num_hidden_layers).map(|i| DecoderLayer::new(c, v, i)).collect(),
            norm: RmsNorm::new(v, "model.norm", c),
            config: c.clone(),
        }
    }
}

impl Decoder for LlamaModel {
    // input_ids: (B, T), attention_mask: (B, T) 0/1 -> (B, T, C)
    fn forward(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>, train: bool) -> Tensor {
        let c = &self.config;
        let (_, t) = input_ids.size2().expect("(B, T) ids");
        let x = Tensor::embedding(&self.embed_tokens, input_ids, self.padding_idx, false, false);
        // Gemma: × torch.tensor(√hidden) in the weights' dtype.
        let x = match c.embed_scale {
            Some(s) => x * Tensor::from(s).to_kind(self.embed_tokens.kind()),
            None => x,
        };
        // create_causal_mask: None without padding (sdpa's is_causal), else causal ∧ key.
        let full = attention_mask.map(|m| padding_mask(m, true));
        // create_sliding_window_causal_mask: the mask also when the window bites (kv ≥ window),
        // with kv_idx > q_idx − window.
        let sliding = match c.sliding_window {
            Some(w) if attention_mask.is_some() || t >= w as i64 => {
                let dev = input_ids.device();
                let q = Tensor::arange(t, (Kind::Int64, dev)).view([t, 1]);
                let kv = Tensor::arange(t, (Kind::Int64, dev)).view([1, t]);
                let window = kv.gt_tensor(&(q - w as i64)).view([1, 1, t, t]);
                let base = match &full {
                    Some(m) => m.shallow_clone(),
                    None => Tensor::ones([t, t], (Kind::Bool, dev)).tril(0).view([1, 1, t, t]),
                };
                Some(base.logical_and(&window))
            }
            _ => None,
        };
        let (cos, sin) = rotary_tables(c, &c.rope, t, &x);
        let local = c.local_rope().map(|rope| rotary_tables(c, rope, t, &x));
        let ctx = Ctx {
            heads: c.num_attention_heads as i64,
            kv_heads: c.num_key_value_heads as i64,
            head_dim: c.head_dim as i64,
            dropout: c.attention_dropout,
            // Gemma: query_pre_attn_scalar**-0.5; the others: head_dim**-0.5.
            scale: c.query_pre_attn_scalar.unwrap_or(c.head_dim as f64).powf(-0.5),
            eager: c.eager_attention,
            softcap: c.attn_logit_softcapping,
            cos: &cos,
            sin: &sin,
            local: local.as_ref().map(|(c, s)| (c, s)),
            full_mask: full.as_ref(),
            sliding_mask: sliding.as_ref(),
        };
        let mut x = x;
        for layer in &self.layers {
            x = layer.forward(&x, &ctx, train);
        }
        self.norm.forward(&x)
    }
}

/// LlamaForCausalLM, and Mistral/Qwen2/Qwen3's: lm_head tied to embed_tokens when
/// `tie_word_embeddings` (`crate::torch::heads`).
pub(super) fn causal_lm(c: &LlamaConfig, v: &Vars) -> Box<dyn TorchLoss> {
    let head = if c.tie_word_embeddings { EMBED } else { "lm_head.weight" };
    let lm = CausalLm::new(LlamaModel::new(c, v), v, head);
    Box::new(match c.final_logit_softcapping {
        Some(cap) => lm.with_logit_softcapping(cap),
        None => lm,
    })
}

/// LlamaForSequenceClassification, and Mistral/Qwen2/Qwen3's (`crate::torch::heads`).
pub(super) fn classifier(c: &LlamaConfig, cfg: &ModelConfig, v: &Vars) -> Box<dyn TorchLoss> {
    Box::new(LastTokenClassifier::new(LlamaModel::new(c, v), cfg, v, c.pad_token_id))
}
