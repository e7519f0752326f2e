//! The analytic matmul FLOP count of a forward pass, from a few sizes each family states
//! (`FamilyModel::flop_count`): MFU's numerator.

use super::Head;

/// What the forward FLOP count of a model depends on: `layers` blocks of attention + MLP over
/// `hidden`-wide tokens, then the head. 2·m·n·k per matmul:
///
/// - attention projections: Q and O (2 · 2·T·H·q), K and V (2 · 2·T·H·kv), with q = q_heads ·
///   head_dim and kv = kv_heads · head_dim (kv < q with grouped-query attention);
/// - scores Q·Kᵀ and the weighted sum with V: 2 · 2·T²·q, the full T×T even for a causal
///   model, as eager attention computes it;
/// - MLP: `mlp_gemms` · 2·T·H·I (2: up and down; 3: a gated MLP's gate, up and down);
/// - head: `head_dense` H×H layers then the output projection (to `vocab` for language
///   models, `num_labels` for classifiers), over every position — a sequence classifier's
///   over its one pooled token per row.
///
/// Embedding look-ups, norms, softmax, activations, dropout and the optimizer are not counted
/// (they are O(T·H), not O(T·H²)); with them the count is about 1 % higher for bert-base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlopCount {
    pub layers: usize,
    pub hidden: usize,
    pub intermediate: usize,
    /// GEMMs of the MLP, each H×I: 2 (up, down) or 3 (gated: gate, up, down).
    pub mlp_gemms: usize,
    pub q_heads: usize,
    /// K/V heads: `q_heads` for multi-head attention, fewer for grouped-query attention.
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    /// The head on top of the stack: its output width and which positions it reads.
    pub head: Head,
    /// A classifier's output width (unread for language-model heads).
    pub num_labels: usize,
    /// H×H dense layers of the head before its output projection (BERT's MLM transform,
    /// BERT's pooler; 0 for a bare projection).
    pub head_dense: usize,
}

impl FlopCount {
    /// Matmul FLOPs of one forward pass over a sample of `seq` tokens. Training is 3× this
    /// (the backward computes two matmuls per forward matmul: input and weight gradients).
    pub fn forward_per_sample(&self, seq: usize) -> f64 {
        let f = |n: usize| n as f64;
        let (t, h, i) = (f(seq), f(self.hidden), f(self.intermediate));
        let (q, kv) = (f(self.q_heads * self.head_dim), f(self.kv_heads * self.head_dim));
        let projections = 2.0 * 2.0 * t * h * q + 2.0 * 2.0 * t * h * kv;
        let scores = 2.0 * 2.0 * t * t * q;
        let mlp = f(self.mlp_gemms) * 2.0 * t * h * i;
        let (out, rows) = match self.head {
            Head::MaskedLm | Head::CausalLm => (f(self.vocab), t),
            Head::TokenClassification => (f(self.num_labels), t),
            Head::SequenceClassification => (f(self.num_labels), 1.0),
        };
        let head = 2.0 * rows * (f(self.head_dense) * h * h + h * out);
        f(self.layers) * (projections + scores + mlp) + head
    }

    /// [`forward_per_sample`](Self::forward_per_sample) per token of the sample.
    pub fn forward_per_token(&self, seq: usize) -> f64 {
        self.forward_per_sample(seq) / seq as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::builtin_config;
    use crate::ModelConfig;

    fn with_head(name: &str, arch: &str, labels: usize) -> ModelConfig {
        let mut raw = builtin_config(name).unwrap().raw;
        raw["architectures"] = serde_json::json!([arch]);
        raw["num_labels"] = serde_json::json!(labels);
        raw["pad_token_id"] = serde_json::json!(0);
        ModelConfig::from_value(raw, "test").unwrap()
    }

    /// The forward FLOPs per token at T = 128 that bench's `train_flops_per_sample` gave (÷ 3,
    /// ÷ 128) before the count moved into the families (commit 3ff0c65), exactly: every term
    /// is an integer below 2^53, so the sums are exact in any order.
    #[test]
    fn per_token_flops_are_the_former_formula_s() {
        let cases = [
            (builtin_config("bert-base-uncased").unwrap(), 222_649_344.0),
            (builtin_config("gpt2").unwrap(), 251_782_656.0),
            (builtin_config("bert-large-uncased").unwrap(), 681_168_896.0),
            (builtin_config("gpt2-medium").unwrap(), 719_489_024.0),
            (with_head("bert-base-uncased", "BertForSequenceClassification", 3), 174_597_156.0),
            (with_head("bert-base-uncased", "BertForTokenClassification", 5), 174_595_584.0),
            (with_head("gpt2", "GPT2ForSequenceClassification", 3), 174_587_940.0),
        ];
        for (cfg, want) in cases {
            let got = cfg.flop_count().forward_per_token(128);
            assert_eq!(got, want, "{}", cfg.arch.hf_name());
        }
        // And per sample at T = 512 (bert-base: 363 732 664 320 training FLOPs = 3 × this).
        let bert = builtin_config("bert-base-uncased").unwrap();
        assert_eq!(bert.flop_count().forward_per_sample(512), 121_244_221_440.0);
    }

    /// A gated MLP adds one H×I GEMM per layer; K/V heads narrower than Q remove their share of
    /// the K and V projections, and nothing else changes (scores run over the query heads).
    #[test]
    fn gated_mlp_and_grouped_kv_change_the_count_as_the_formula_says() {
        let gpt2 = builtin_config("gpt2").unwrap().flop_count();
        let t = 128;
        let (l, h, i, d) = (12.0, 768.0, 3072.0, 64.0);
        let base = gpt2.forward_per_token(t);
        let gated = FlopCount { mlp_gemms: 3, ..gpt2 };
        assert_eq!(gated.forward_per_token(t) - base, l * 2.0 * h * i);
        let grouped = FlopCount { kv_heads: 3, ..gpt2 };
        assert_eq!(base - grouped.forward_per_token(t), l * 2.0 * 2.0 * h * (12.0 - 3.0) * d);
        let both = FlopCount { mlp_gemms: 3, kv_heads: 3, ..gpt2 };
        assert_eq!(both.forward_per_token(t), base + l * 2.0 * h * i - l * 2.0 * 2.0 * h * 9.0 * d);
    }
}
