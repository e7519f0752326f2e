//! The op set of the IR: small and explicit. Each op's operands are the node's `inputs` (in the
//! order documented here) and its results are the node's `outputs`; the enum carries only
//! attributes. Backward ops exist only where a gradient cannot be written with forward ops.

pub use crate::ops::gelu::GeluApprox;
pub use crate::ops::pointwise::{BinaryFn, UnaryFn};

/// Cross-entropy's default ignore index, as PyTorch's and HF's labels (-100 = padding).
pub const IGNORE_INDEX: i64 = -100;

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// () → a tensor filled with `value` (the loss seed 1.0; zero gradients of unused outputs).
    Fill { value: f32 },
    /// (table (V, C), ids (…)) → (…, C)
    Embedding,
    /// (a (…, M, K), b (…, K, N) or (K, N)) → (…, M, N); a is (…, K, M) when `ta`, b is
    /// (…, N, K) / (N, K) when `tb`.
    MatMul { ta: bool, tb: bool },
    /// (x (…, C), bias (C)) → (…, C)
    BiasAdd,
    /// (a, b) → a + b, b's shape a suffix of a's (broadcast over a's leading dims).
    Add,
    /// (x) → s·x
    Scale { s: f32 },
    /// (x) → gelu(x)
    Gelu { approx: GeluApprox },
    /// (x) → tanh(x)
    Tanh,
    /// (x) → f(x), a pointwise function of `ops::pointwise` (SiLU, …).
    Unary { f: UnaryFn },
    /// (a, b) → f(a, b), b's shape a suffix of a's (broadcast over a's leading dims): a
    /// pointwise function of `ops::pointwise` (multiply, …).
    Binary { f: BinaryFn },
    /// (x (…, C), w (C), b (C)) → (y (…, C), mean (…), rstd (…)); mean and rstd are saved for
    /// the backward and are not differentiable.
    LayerNorm { eps: f32 },
    /// (x (…, C), w (C)) → (y (…, C), rstd (…)); HF `LlamaRMSNorm` computed in f32:
    /// rstd = 1/√(mean(x²) + eps), y = w·(x·rstd). rstd is saved for the backward and is not
    /// differentiable.
    RmsNorm { eps: f32 },
    /// (x (…, T, D), cos (T, D), sin (T, D)) → y (…, T, D) = x·cos + rotate_half(x)·sin with
    /// rotate_half(x) = cat(−x[D/2:], x[:D/2]) (HF's `apply_rotary_pos_emb`); `inverse` negates
    /// sin, which is the backward of the forward (cos and sin have equal halves, as HF's
    /// emb = cat(freqs, freqs)). cos and sin are fed inputs without gradient.
    Rotary { inverse: bool },
    /// (x (…, N) [, mask broadcastable to x]) → softmax(x·scale + mask) over the last dim;
    /// `causal` masks j > i over the last two dims.
    Softmax { scale: f32, causal: bool },
    /// (x) → x·keep/(1-p), keep from the counter-based RNG at (step seed, offset + index).
    Dropout { p: f32, offset: u64 },
    /// (x) → the same data under the output's shape.
    Reshape,
    /// (x) → x.permute(perm), materialised.
    Permute { perm: Vec<usize> },
    /// (x (…, Σ sizes)) → one output `(…, sizes[i])` per size.
    Split { sizes: Vec<usize> },
    /// (x_0 (…, n_0), x_1 (…, n_1), …) → (…, Σ n_i)
    Concat,
    /// (q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) [, mask broadcastable to
    /// (B, H, Tq, Tk)]) → (out (B, H, Tq, Dv), probs (B, H, Tq, Tk)); probs are the
    /// pre-dropout softmax, saved for the backward, not differentiable. Hkv divides H
    /// (grouped-query / multi-query attention): query head h reads kv head h / (H/Hkv), HF's
    /// `repeat_kv` order, without the repeated K/V being materialised.
    Attention { scale: f32, causal: bool, dropout_p: f32, offset: u64 },
    /// (logits (…, V), labels (…) i64) → () the mean over labels != ignore_index.
    ///
    /// This op *is* the softmax + cross-entropy fusion: the forward is a log-sum-exp per row
    /// (no probabilities stored), the backward recomputes softmax from the logits once and
    /// writes softmax − onehot (see `passes` for why there is no separate pass).
    CrossEntropy { ignore_index: i64 },

    // ---- fused forward ops (emitted by `passes`) ----
    /// (x (…, K), w (N, K) when `tb` else (K, N), bias (N)) → y (…, N) = [gelu](x·op(w) + bias);
    /// with `gelu` a second output pre (…, N) = x·op(w) + bias, saved for the backward (not
    /// differentiable). `nn.Linear` (+ activation) as one GEMM with a bias/GELU epilogue
    /// (cuBLASLt's `CUBLASLT_EPILOGUE_GELU_AUX_BIAS`, ORT's `FusedMatMul` + `BiasGelu`).
    Linear { tb: bool, gelu: Option<GeluApprox> },
    /// (a (…, C), b (…, C), w (C), bias (C)) → (sum (…, C) = a + b, y (…, C) = LayerNorm(sum),
    /// mean (…), rstd (…)); sum and y are differentiable, mean/rstd are saved statistics. The
    /// residual add + LayerNorm of every transformer block in one pass over the rows (ORT's
    /// `SkipLayerNormalization`, Apex's `FusedAddLayerNorm`).
    AddLayerNorm { eps: f32 },
    /// (a (…, C), b (…, C), w (C)) → (sum (…, C) = a + b, y (…, C) = RmsNorm(sum), rstd (…));
    /// sum and y are differentiable, rstd is the saved statistic. The residual add + RMSNorm of
    /// every Llama block in one pass over the rows (ORT's `SkipSimplifiedLayerNormalization`).
    AddRmsNorm { eps: f32 },
    /// (x (…, C), w (V, C), labels (…) i64 [, bias (V)]) → () the mean cross-entropy of the
    /// logits x·wᵀ + bias over labels != ignore_index, without the (…, V) logits ever being
    /// stored: the kernels compute them a chunk of rows at a time (the pass
    /// `fuse_linear_cross_entropy` makes it from an LM head's matmul [+ bias add] and its
    /// cross-entropy). Liger-Kernel's `LigerFusedLinearCrossEntropy`, Apple's Cut Cross-Entropy.
    LinearCrossEntropy { ignore_index: i64 },

    // ---- backward-only ops (emitted by autodiff) ----
    /// (ids (…), dy (…, C)) → dtable (V, C): scatter-add of rows.
    EmbeddingBackward,
    /// (x (…, S…)) → (S…): sum over the leading dims (bias and broadcast-add gradients).
    ReduceSumLeading,
    /// (x, dy) → dx
    GeluBackward { approx: GeluApprox },
    /// (y, dy) → dx, from the forward output.
    TanhBackward,
    /// (x, dy) → dx = dy·f'(x), from the forward input.
    UnaryBackward { f: UnaryFn },
    /// (dy, x, w, mean, rstd) → (dx, dw, db)
    LayerNormBackward,
    /// (dy, x, w, rstd) → (dx, dw)
    RmsNormBackward,
    /// (y, dy) → dx, gradient w.r.t. the unscaled input.
    SoftmaxBackward { scale: f32 },
    /// (dout, q, k, v, probs, out[, mask]) → (dq, dk, dv); the GPU kernels read `out` and the
    /// mask, the CPU kernels the probabilities.
    AttentionBackward { scale: f32, causal: bool, dropout_p: f32, offset: u64 },
    /// (dloss (), logits (…, V), labels (…)) → dlogits (…, V)
    CrossEntropyBackward { ignore_index: i64 },
    /// (dloss (), x (…, C), w (V, C), labels (…) [, bias (V)]) → (loss (), dx (…, C),
    /// dw (V, C) [, dbias (V)]): [`Op::LinearCrossEntropy`]'s gradients, each chunk's logits
    /// recomputed and turned into dloss/count·(softmax − onehot) in place, then dx += g·w and
    /// dw += gᵀ·x (accumulated in f32). It outputs the loss too (the same sweep computes it):
    /// the training pass `fuse_linear_cross_entropy_backward` drops the forward node and
    /// lets this one sweep give both — the unfused graph's three head GEMMs, not four.
    LinearCrossEntropyBackward { ignore_index: i64 },
}

impl Op {
    /// The op's name as printed in graphs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Fill { .. } => "fill",
            Op::Embedding => "embedding",
            Op::MatMul { .. } => "matmul",
            Op::BiasAdd => "bias_add",
            Op::Add => "add",
            Op::Scale { .. } => "scale",
            Op::Gelu { .. } => "gelu",
            Op::Tanh => "tanh",
            Op::Unary { f } => f.name(),
            Op::Binary { f } => f.name(),
            Op::LayerNorm { .. } => "layernorm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Rotary { .. } => "rotary",
            Op::Softmax { .. } => "softmax",
            Op::Dropout { .. } => "dropout",
            Op::Reshape => "reshape",
            Op::Permute { .. } => "permute",
            Op::Split { .. } => "split",
            Op::Concat => "concat",
            Op::Attention { .. } => "attention",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::LinearCrossEntropy { .. } => "linear_cross_entropy",
            Op::Linear { .. } => "linear",
            Op::AddLayerNorm { .. } => "add_layernorm",
            Op::AddRmsNorm { .. } => "add_rms_norm",
            Op::EmbeddingBackward => "embedding_backward",
            Op::ReduceSumLeading => "reduce_sum_leading",
            Op::GeluBackward { .. } => "gelu_backward",
            Op::TanhBackward => "tanh_backward",
            Op::UnaryBackward { f } => f.backward_name(),
            Op::LayerNormBackward => "layernorm_backward",
            Op::RmsNormBackward => "rms_norm_backward",
            Op::SoftmaxBackward { .. } => "softmax_backward",
            Op::AttentionBackward { .. } => "attention_backward",
            Op::CrossEntropyBackward { .. } => "cross_entropy_backward",
            Op::LinearCrossEntropyBackward { .. } => "linear_cross_entropy_backward",
        }
    }

    /// Attributes as printed after the operands: `ta=false tb=true`.
    pub fn attrs(&self) -> String {
        match self {
            Op::Fill { value } => format!("value={value}"),
            Op::MatMul { ta, tb } => format!("ta={ta} tb={tb}"),
            Op::Scale { s } => format!("s={s}"),
            Op::Gelu { approx } | Op::GeluBackward { approx } => {
                format!("approx={}", approx.name())
            }
            Op::LayerNorm { eps }
            | Op::AddLayerNorm { eps }
            | Op::RmsNorm { eps }
            | Op::AddRmsNorm { eps } => {
                format!("eps={eps:e}")
            }
            Op::Rotary { inverse } => format!("inverse={inverse}"),
            Op::Linear { tb, gelu } => match gelu {
                Some(a) => format!("tb={tb} gelu={}", a.name()),
                None => format!("tb={tb}"),
            },
            Op::Softmax { scale, causal } => format!("scale={scale} causal={causal}"),
            Op::SoftmaxBackward { scale } => format!("scale={scale}"),
            Op::Dropout { p, offset } => format!("p={p} offset={offset}"),
            Op::Permute { perm } => format!("perm={perm:?}"),
            Op::Split { sizes } => format!("sizes={sizes:?}"),
            Op::Attention { scale, causal, dropout_p, offset }
            | Op::AttentionBackward { scale, causal, dropout_p, offset } => {
                format!("scale={scale} causal={causal} p={dropout_p} offset={offset}")
            }
            Op::CrossEntropy { ignore_index }
            | Op::CrossEntropyBackward { ignore_index }
            | Op::LinearCrossEntropy { ignore_index }
            | Op::LinearCrossEntropyBackward { ignore_index } => {
                format!("ignore_index={ignore_index}")
            }
            Op::Embedding
            | Op::BiasAdd
            | Op::Add
            | Op::Tanh
            | Op::Reshape
            | Op::Concat
            | Op::EmbeddingBackward
            | Op::ReduceSumLeading
            | Op::TanhBackward
            | Op::LayerNormBackward
            | Op::RmsNormBackward
            // The function is the op's name.
            | Op::Unary { .. }
            | Op::Binary { .. }
            | Op::UnaryBackward { .. } => String::new(),
        }
    }

    /// Backward-only ops have no gradient rule (no double backward).
    pub fn is_backward(&self) -> bool {
        matches!(
            self,
            Op::EmbeddingBackward
                | Op::ReduceSumLeading
                | Op::GeluBackward { .. }
                | Op::TanhBackward
                | Op::UnaryBackward { .. }
                | Op::LayerNormBackward
                | Op::RmsNormBackward
                | Op::SoftmaxBackward { .. }
                | Op::AttentionBackward { .. }
                | Op::CrossEntropyBackward { .. }
                | Op::LinearCrossEntropyBackward { .. }
        )
    }
}
