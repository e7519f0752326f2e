//! The torch.nn building blocks HF's modules use, over tensors taken from the VarStore.

use tch::{Kind, Tensor};

use super::Vars;
use crate::config::Activation;

/// torch.nn.Linear: y = x·Wᵀ + b, W: (out, in).
pub struct Linear {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl Linear {
    pub fn new(v: &Vars, prefix: &str) -> Self {
        Linear { weight: v.get(&format!("{prefix}.weight")), bias: v.get(&format!("{prefix}.bias")) }
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
        Conv1D { weight: v.get(&format!("{prefix}.weight")), bias: v.get(&format!("{prefix}.bias")) }
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
        LayerNorm { weight: v.get(&format!("{prefix}.weight")), bias: v.get(&format!("{prefix}.bias")), eps }
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
            let inner = (x + x.pow_tensor_scalar(3.0) * 0.044715) * (2.0f64 / std::f64::consts::PI).sqrt();
            x * 0.5 * (inner.tanh() + 1.0)
        }
        Activation::GeluTanh => x.gelu("tanh"),
    }
}

/// torch.nn.functional.scaled_dot_product_attention, HF's default `sdpa` attention.
// q, k, v: (B, H, T, D) -> (B, H, T, D)
pub fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, dropout_p: f64, causal: bool) -> Tensor {
    Tensor::scaled_dot_product_attention::<Tensor>(q, k, v, None, dropout_p, causal, None, false)
}

/// nn.CrossEntropyLoss (mean over labels ≠ −100) on fp32 logits, as HF upcasts them.
// logits: (N, V), labels: (N,)
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Tensor {
    logits.to_kind(Kind::Float).cross_entropy_loss::<Tensor>(labels, None, tch::Reduction::Mean, -100, 0.0)
}
