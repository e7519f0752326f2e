//! GPT-2 as transformers/models/gpt2/modeling_gpt2.py writes it (sdpa attention path).

use tch::{Kind, Tensor};

use super::{Gpt2Config, INFO};
use crate::config::{Activation, ModelConfig};
use crate::torch::heads::{CausalLm, Decoder, LastTokenClassifier};
use crate::torch::layers::{activation, padding_mask, sdpa, Conv1D, LayerNorm};
use crate::torch::{TorchLoss, Vars};

/// GPT2Block: ln_1 → GPT2Attention → residual, ln_2 → GPT2MLP → residual.
struct Gpt2Block {
    ln_1: LayerNorm,
    c_attn: Conv1D,
    c_proj: Conv1D,
    ln_2: LayerNorm,
    c_fc: Conv1D,
    mlp_proj: Conv1D,
    heads: i64,
    act: Activation,
    attn_pdrop: f64,
    resid_pdrop: f64,
}

impl Gpt2Block {
    // x: (B, T, C), mask: (B, 1, T, T) bool (causal and padding) -> (B, T, C)
    fn forward(&self, x: &Tensor, mask: Option<&Tensor>, train: bool) -> Tensor {
        let (b, t, c) = x.size3().expect("(B, T, C)");
        let d = c / self.heads;
        let qkv = self.c_attn.forward(&self.ln_1.forward(x)).split(c, 2);
        let heads = |y: &Tensor| y.view([b, t, self.heads, d]).transpose(1, 2);
        let (q, k, v) = (heads(&qkv[0]), heads(&qkv[1]), heads(&qkv[2]));
        let p = if train { self.attn_pdrop } else { 0.0 };
        // HF: is_causal=True when there is no padding mask and T > 1; with padding, the
        // combined boolean mask and is_causal=False.
        let ctx =
            sdpa(&q, &k, &v, mask, p, mask.is_none() && t > 1).transpose(1, 2).reshape([b, t, c]);
        let x = x + self.c_proj.forward(&ctx).dropout(self.resid_pdrop, train);
        let h = activation(self.act, true, &self.c_fc.forward(&self.ln_2.forward(&x)));
        &x + self.mlp_proj.forward(&h).dropout(self.resid_pdrop, train)
    }
}

/// GPT2Model: wte + wpe, dropout, the blocks, ln_f.
struct Gpt2Model {
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Gpt2Block>,
    ln_f: LayerNorm,
    embd_pdrop: f64,
}

impl Gpt2Model {
    fn new(c: &Gpt2Config, cfg: &ModelConfig, v: &Vars) -> Self {
        let eps = c.layer_norm_epsilon;
        let blocks = (0..c.n_layer)
            .map(|i| {
                let p = format!("transformer.h.{i}");
                Gpt2Block {
                    ln_1: LayerNorm::new(v, &format!("{p}.ln_1"), eps),
                    c_attn: Conv1D::new(v, &format!("{p}.attn.c_attn")),
                    c_proj: Conv1D::new(v, &format!("{p}.attn.c_proj")),
                    ln_2: LayerNorm::new(v, &format!("{p}.ln_2"), eps),
                    c_fc: Conv1D::new(v, &format!("{p}.mlp.c_fc")),
                    mlp_proj: Conv1D::new(v, &format!("{p}.mlp.c_proj")),
                    heads: c.n_head as i64,
                    act: cfg.activation(),
                    attn_pdrop: c.attn_pdrop,
                    resid_pdrop: c.resid_pdrop,
                }
            })
            .collect();
        Gpt2Model {
            wte: v.get(INFO.word_embedding),
            wpe: v.get("transformer.wpe.weight"),
            blocks,
            ln_f: LayerNorm::new(v, "transformer.ln_f", eps),
            embd_pdrop: c.embd_pdrop,
        }
    }
}

impl Decoder for Gpt2Model {
    // input_ids: (B, T), attention_mask: (B, T) 0/1 -> (B, T, C)
    fn forward(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>, train: bool) -> Tensor {
        let (_, t) = input_ids.size2().expect("(B, T) ids");
        let mask = attention_mask.map(|m| padding_mask(m, true));
        let pos = Tensor::arange(t, (Kind::Int64, input_ids.device())).unsqueeze(0);
        let mut x = (Tensor::embedding(&self.wte, input_ids, -1, false, false)
            + Tensor::embedding(&self.wpe, &pos, -1, false, false))
        .dropout(self.embd_pdrop, train);
        for block in &self.blocks {
            x = block.forward(&x, mask.as_ref(), train);
        }
        self.ln_f.forward(&x)
    }
}

/// GPT2LMHeadModel: lm_head tied to wte unless the config unties it (`crate::torch::heads`).
pub(super) fn causal_lm(c: &Gpt2Config, cfg: &ModelConfig, v: &Vars) -> Box<dyn TorchLoss> {
    let head = if c.tie_word_embeddings { INFO.word_embedding } else { INFO.untied_head };
    Box::new(CausalLm::new(Gpt2Model::new(c, cfg, v), v, head))
}

/// GPT2ForSequenceClassification (`crate::torch::heads`).
pub(super) fn classifier(c: &Gpt2Config, cfg: &ModelConfig, v: &Vars) -> Box<dyn TorchLoss> {
    Box::new(LastTokenClassifier::new(Gpt2Model::new(c, cfg, v), cfg, v, c.pad_token_id))
}
