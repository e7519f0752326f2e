//! DistilBERT as engine graphs: the same functions as `torch.rs` beside it (transformers'
//! modeling_distilbert.py; BERT's encoder layer under DistilBERT's names, `bert::encoder_layer`).

use ortbench_engine::graph::TensorId;

use super::{DistilBertConfig, INFO, LAYER_NORM_EPS};
use crate::config::ModelConfig;
use crate::family::bert::{encoder_layer, first_token, mlm_head, padded_lookup};
use crate::family::Head;
use crate::graph::{BResult, Builder, GraphOptions, INPUT_IDS, POSITION_IDS};

/// `Embeddings`: word (with its padding_idx) + position embeddings → LayerNorm → dropout.
// returns (B, T, C)
fn embeddings(b: &mut Builder, c: &DistilBertConfig, opts: &GraphOptions) -> BResult<TensorId> {
    let (bs, t) = (opts.batch_size, opts.seq_len);
    let ids = b.g.input_ids(INPUT_IDS, &[bs, t])?; // (B, T)
    let positions = b.g.input_ids(POSITION_IDS, &[t])?; // (T)
    let word_table = b.p(INFO.word_embedding);
    let word = match c.padding_idx() {
        Some(_) => padded_lookup(b, word_table, ids, &mut None, opts)?,
        None => b.g.embedding(word_table, ids)?,
    }; // (B, T, C)
    let pos = b.g.embedding(b.p("distilbert.embeddings.position_embeddings.weight"), positions)?; // (T, C)
    let x = b.g.add(word, pos)?; // (B, T, C), positions broadcast over B
    let x = b.layer_norm(x, "distilbert.embeddings.LayerNorm", LAYER_NORM_EPS)?;
    b.dropout(x, c.dropout)
}

/// The head's logits over `DistilBertModel` (embeddings, `n_layers` TransformerBlocks):
/// - `DistilBertForMaskedLM`: vocab_transform → activation → vocab_layer_norm →
///   vocab_projector (tied to the word embedding unless untied; its own bias), (B, T, V);
/// - `DistilBertForSequenceClassification`: token 0 → pre_classifier → ReLU → dropout
///   (`seq_classif_dropout`) → classifier, (B, num_labels);
/// - `DistilBertForTokenClassification`: dropout (`dropout`) → classifier, (B, T, num_labels).
pub(super) fn logits(
    b: &mut Builder,
    c: &DistilBertConfig,
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> BResult<TensorId> {
    let mut h = embeddings(b, c, opts)?; // (B, T, C)
    let layer = c.encoder_layer();
    for i in 0..c.n_layers {
        h = encoder_layer(b, h, &format!("distilbert.transformer.layer.{i}"), &layer)?;
    }
    match cfg.arch.head() {
        Head::MaskedLm => mlm_head(b, h, &c.mlm_head()), // (B, T, V)
        Head::SequenceClassification => {
            let x = first_token(b, h)?; // (B, C)
            let x = b.linear(x, "pre_classifier")?;
            let x = b.activation(x, crate::config::Activation::Relu)?;
            let x = b.dropout(x, c.seq_classif_dropout)?;
            b.linear(x, "classifier") // (B, num_labels)
        }
        Head::TokenClassification => {
            let x = b.dropout(h, c.dropout)?;
            b.linear(x, "classifier") // (B, T, num_labels)
        }
        Head::CausalLm => unreachable!("DistilBERT lists no causal-lm head"),
    }
}
