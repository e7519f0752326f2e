//! The torch.nn building blocks HF's modules use, over tensors taken from the VarStore.

use tch::{Kind, Tensor};

use super::Vars;
use crate::config::{Activation, ProblemType};

/// torch.nn.Linear: y = x·Wᵀ + b, W: (out, in).
pub struct Linear {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl Linear {
    pub fn new(v: &Vars, prefix: &str) -> Self {
        Linear {
            weight: v.get(&format!("{prefix}.weight")),
            bias: v.get(&format!("{prefix}.bias")),
        }
    }
    pub fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.weight, Some(&self.bias))
    }
}

/// transformers.pytorch_utils.Conv1D (GPT-2): y = x·W + b with W: (in, out), via addmm.
pub struct Conv1D {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl Conv1D {
    pub fn new(v: &Vars, prefix: &str) -> Self {
        Conv1D {
            weight: v.get(&format!("{prefix}.weight")),
            bias: v.get(&format!("{prefix}.bias")),
        }
    }
    // x: (B, T, in) -> (B, T, out)
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let mut out_shape = x.size();
        let nf = self.weight.size()[1];
        *out_shape.last_mut().expect("rank >= 1") = nf;
        let x2 = x.view([-1, x.size()[x.dim() - 1]]);
        self.bias.addmm(&x2, &self.weight).view(out_shape.as_slice())
    }
}

/// torch.nn.LayerNorm over the last dimension.
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LayerNorm {
    pub fn new(v: &Vars, prefix: &str, eps: f64) -> Self {
        LayerNorm {
            weight: v.get(&format!("{prefix}.weight")),
            bias: v.get(&format!("{prefix}.bias")),
            eps,
        }
    }
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let n = self.weight.size()[0];
        x.layer_norm([n], Some(&self.weight), Some(&self.bias), self.eps, true)
    }
}

/// HF's ACT2FN: `gelu` is nn.functional.gelu; `gelu_new` is NewGELUActivation, written out
/// op by op exactly as HF writes it (that is what a GPT-2 user runs).
pub fn activation(act: Activation, gelu_new_literal: bool, x: &Tensor) -> Tensor {
    match act {
        Activation::GeluErf => x.gelu("none"),
        Activation::GeluTanh if gelu_new_literal => {
            // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
            let inner =
                (x + x.pow_tensor_scalar(3.0) * 0.044715) * (2.0f64 / std::f64::consts::PI).sqrt();
            x * 0.5 * (inner.tanh() + 1.0)
        }
        Activation::GeluTanh => x.gelu("tanh"),
        Activation::Silu => x.silu(),
        Activation::Relu => x.relu(),
    }
}

/// torch.nn.functional.scaled_dot_product_attention, HF's default `sdpa` attention; `mask` is
/// the boolean mask HF's `masking_utils.sdpa_mask` builds (true = attend), None when no
/// position is padding (HF then skips it, so sdpa may take its fastest kernel).
// q, k, v: (B, H, T, D), mask: broadcastable to (B, H, T, T) bool -> (B, H, T, D)
pub fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    dropout_p: f64,
    causal: bool,
) -> Tensor {
    Tensor::scaled_dot_product_attention(q, k, v, mask, dropout_p, causal, None, false)
}

/// HF's padding mask for sdpa from `attention_mask` (B, T) 0/1: (B, 1, 1, T) bool, true at
/// tokens (`create_bidirectional_mask`); with `causal`, (B, 1, T, T) = key is a token and
/// key ≤ query (`create_causal_mask`).
// attention_mask: (B, T) i64 -> (B, 1, 1|T, T) bool
pub fn padding_mask(attention_mask: &Tensor, causal: bool) -> Tensor {
    let (b, t) = attention_mask.size2().expect("(B, T) attention_mask");
    let keys = attention_mask.ne(0).view([b, 1, 1, t]);
    if causal {
        let tril =
            Tensor::ones([t, t], (Kind::Bool, attention_mask.device())).tril(0).view([1, 1, t, t]);
        keys.logical_and(&tril)
    } else {
        keys
    }
}

/// HF's pooling of a last-token classifier (GPT-2, Llama, Mistral, Qwen): each row's logits at
/// its rightmost token that is not `pad_token_id` (position 0 when all are); the last position
/// without a pad token.
// logits: (B, T, L), input_ids: (B, T) -> (B, L)
pub fn last_token(logits: &Tensor, input_ids: &Tensor, pad_token_id: Option<i64>) -> Tensor {
    let (b, t) = input_ids.size2().expect("(B, T) ids");
    let last = match pad_token_id {
        Some(pad) => {
            let positions = Tensor::arange(t, (Kind::Int64, input_ids.device()));
            (positions * input_ids.ne(pad).to_kind(Kind::Int64)).argmax(-1, false)
        }
        None => Tensor::full([b], t - 1, (Kind::Int64, input_ids.device())),
    };
    let rows = Tensor::arange(b, (Kind::Int64, input_ids.device()));
    logits.index(&[Some(rows), Some(last)])
}

/// The loss of HF's `…ForSequenceClassification` for `problem`: CrossEntropyLoss over
/// (B, L) logits and (B,) labels; BCEWithLogitsLoss against (B, L) 0/1 labels as floats; MSELoss
/// of the squeezed (B, 1) logits against (B,) float targets.
// logits: (B, L), labels: (B,) or (B·L,) i64, targets: (B,) f32 -> scalar
pub fn classification_loss(
    logits: &Tensor,
    labels: &Tensor,
    targets: Option<&Tensor>,
    problem: ProblemType,
) -> Tensor {
    let (b, l) = logits.size2().expect("(B, L) logits");
    match problem {
        ProblemType::SingleLabel => cross_entropy(&logits.view([-1, l]), &labels.view([-1])),
        ProblemType::MultiLabel => logits.binary_cross_entropy_with_logits::<Tensor>(
            &labels.view([b, l]).to_kind(logits.kind()),
            None,
            None,
            tch::Reduction::Mean,
        ),
        ProblemType::Regression => {
            let y = targets.expect("regression batches carry targets").to_kind(logits.kind());
            logits.squeeze().mse_loss(&y.squeeze(), tch::Reduction::Mean)
        }
    }
}

/// nn.CrossEntropyLoss (mean over labels ≠ −100) on fp32 logits, as HF upcasts them.
// logits: (N, V), labels: (N,)
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Tensor {
    logits.to_kind(Kind::Float).cross_entropy_loss::<Tensor>(
        labels,
        None,
        tch::Reduction::Mean,
        -100,
        0.0,
    )
}

/// transformers.loss.loss_utils.ForCausalLMLoss (5.x), mean reduction (HF's `outputs.loss`
/// when no `num_items_in_batch` is passed): the logits are not sliced (HF ≤ 4.45 copied
/// `logits[..., :-1, :]`); the labels are padded with −100 on the right and shifted left
/// (`shift_labels = pad(labels, (0, 1), value=-100)[..., 1:]`), so that position t is scored
/// against token t+1 and the last position against nothing; cross-entropy runs over every
/// position on `logits.float()` (a no-op for fp32 logits).
// logits: (B, T, V), labels: (B, T) -> scalar
pub fn causal_lm_loss(logits: &Tensor, labels: &Tensor) -> Tensor {
    let v = logits.size()[logits.dim() - 1];
    let shift_labels = labels.pad([0, 1], "constant", -100.0).slice(-1, 1, None, 1).contiguous();
    cross_entropy(&logits.view([-1, v]), &shift_labels.view([-1]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch::probe_ops;
    use tch::Device;

    /// HF 5.x's label shift computes the loss HF ≤ 4.45's logit slice computed, without
    /// copying the logits: no copying op (clone, contiguous, copy_, _to_copy) touches a
    /// tensor the size of the shifted logits, while the old formula does (which shows that
    /// the probe sees such copies).
    #[test]
    fn causal_lm_loss_shifts_labels_not_logits() {
        tch::manual_seed(3);
        let (b, t, v) = (3i64, 9i64, 50i64);
        let logits = Tensor::randn([b, t, v], (Kind::Float, Device::Cpu));
        let labels = Tensor::randint(v, [b, t], (Kind::Int64, Device::Cpu));
        let _ = labels.get(1).get(4).fill_(-100);
        let _ = labels.get(2).get(0).fill_(-100); // position 0 is never a target
        let old = || {
            let shift_logits = logits.narrow(1, 0, t - 1).contiguous().view([-1, v]);
            let shift_labels = labels.narrow(1, 1, t - 1).contiguous().view([-1]);
            cross_entropy(&shift_logits, &shift_labels)
        };
        let (new_loss, new_ops) = probe_ops(|| causal_lm_loss(&logits, &labels)).unwrap();
        let (old_loss, old_ops) = probe_ops(old).unwrap();
        let (a, o) = (new_loss.double_value(&[]), old_loss.double_value(&[]));
        println!("label shift {a:.9} vs logit slice {o:.9}");
        // The same terms, summed over B·T rows instead of B·(T−1): fp32 summation order only.
        assert!((a - o).abs() / o.abs() < 1e-6, "{a} vs {o}");
        let copies = |ops: &[crate::torch::OpCall]| {
            ops.iter()
                .filter(|op| {
                    ["aten::clone", "aten::contiguous", "aten::copy_", "aten::_to_copy"]
                        .contains(&op.name.as_str())
                })
                .filter(|op| op.max_input_numel >= b * (t - 1) * v)
                .count()
        };
        assert_eq!(copies(&new_ops), 0, "{new_ops:?}");
        assert!(
            copies(&old_ops) > 0,
            "the probe must see the old formula's logits copy: {old_ops:?}"
        );
    }
}
