//! A step's inputs: everything a model's graph reads besides its parameters, computed from a
//! batch — ids, labels (a causal LM's shifted), positions, token types, the padding and
//! attention masks, the pooled-token selector — as HF's forward derives them.

use ortbench_engine::graph::Graph;
use ortbench_engine::Inputs;

use super::{
    ATTENTION_MASK, EAGER_MASK, EAGER_MASK_MIN, EAGER_SLIDING_MASK, INPUT_IDS, LABELS, LAST_TOKEN,
    NOT_PAD_MASK, PAD_MASK, POSITION_IDS, POSITION_IDS_AFTER_PAD, SLIDING_WINDOW_MASK, TARGETS,
    TOKEN_TYPE_IDS,
};
use crate::config::ProblemType;
use crate::data::{Batch, Task};
use crate::family::{Architecture, Head, Pads};
use crate::ModelError;

/// The data of one input.
#[derive(Clone, Debug, PartialEq)]
pub enum FeedData {
    Ids(Vec<i64>),
    Floats(Vec<f32>),
}

/// Owned inputs of one step, by the graph's input names.
#[derive(Clone, Debug, PartialEq)]
pub struct Feed {
    pub entries: Vec<(String, FeedData)>,
}

impl Feed {
    /// The executor's view of these inputs.
    pub fn inputs(&self) -> Inputs<'_> {
        self.entries.iter().fold(Inputs::new(), |acc, (name, d)| match d {
            FeedData::Ids(v) => acc.ids(name, v),
            FeedData::Floats(v) => acc.floats(name, v),
        })
    }
}

/// What feeding a graph of a model needs to know beyond the graph.
#[derive(Clone, Debug)]
pub(super) struct FeedInfo {
    pub(super) arch: Architecture,
    pub(super) batch_size: usize,
    pub(super) seq_len: usize,
    pub(super) pads: Pads,
    pub(super) task: Task,
    pub(super) vocab_size: usize,
    pub(super) sliding_window: Option<usize>,
    pub(super) fixed: std::sync::Arc<Vec<(&'static str, Vec<f32>)>>,
}

/// The additive (B, 1, T, T) mask of causal attention over the last `window` positions (T: no
/// window) and the batch's non-pad keys: 0 where query i may read key j (i − window < j ≤ i,
/// j not padding), `masked` elsewhere.
fn causal_mask(batch: &Batch, t: usize, window: usize, masked: f32) -> Vec<f32> {
    let (b, mask) = (batch.batch_size, batch.attention_mask.as_deref());
    let mut m = vec![masked; b * t * t];
    for row in 0..b {
        for i in 0..t {
            for j in (i + 1).saturating_sub(window)..=i {
                if mask.is_none_or(|m| m[row * t + j] != 0) {
                    m[(row * t + i) * t + j] = 0.0;
                }
            }
        }
    }
    m
}

/// HF's `create_position_ids_from_input_ids` (modeling_roberta.py): per row, `pad` at pad
/// tokens and `pad` + the number of non-pad tokens up to and including this one elsewhere.
// ids: (B·T) -> (B·T)
pub fn positions_after_pad(ids: &[i64], t: usize, pad: i64) -> Vec<i64> {
    let mut out = Vec::with_capacity(ids.len());
    for row in ids.chunks_exact(t) {
        let mut count = 0;
        for &id in row {
            count += i64::from(id != pad);
            out.push(if id == pad { pad } else { pad + count });
        }
    }
    out
}

impl FeedInfo {
    /// Every input of `graph` for `batch`: ids, labels (a causal LM's shifted here) when the
    /// graph has a loss, positions, token types, the padding masks, the pooled-token selector.
    pub(super) fn feed(&self, graph: &Graph, batch: &Batch) -> Result<Feed, ModelError> {
        let (b, t) = (self.batch_size, self.seq_len);
        if batch.batch_size != b || batch.seq_len != t || batch.input_ids.len() != b * t {
            return Err(ModelError::Data(format!(
                "the engine graph was built for batches of {b}×{t}, got {}×{} ({} ids): rebuild it for this size",
                batch.batch_size,
                batch.seq_len,
                batch.input_ids.len()
            )));
        }
        let has = |name: &str| graph.inputs().iter().any(|&i| graph.input_name(i) == Some(name));
        if batch.has_padding() && !has(ATTENTION_MASK) {
            return Err(ModelError::Data(
                "the batch has padding (an attention_mask with zeros) but the engine graph was built without an attention mask: build it with GraphOptions::with_attention_mask".into(),
            ));
        }
        let want_labels = b * self.task.labels_per_row(t);
        let with_loss = has(LABELS) || has(TARGETS);
        if with_loss && batch.labels.len() != want_labels {
            return Err(ModelError::Data(format!(
                "{} ({}) needs {want_labels} labels per batch, got {}",
                self.arch.hf_name(),
                self.task.name(),
                batch.labels.len()
            )));
        }
        let regression = matches!(
            self.task,
            Task::SequenceClassification { problem: ProblemType::Regression, .. }
        );
        if with_loss && regression != batch.targets.as_ref().is_some_and(|v| v.len() == b) {
            return Err(ModelError::Data(format!(
                "{} needs {b} float targets per batch exactly when it is a regression",
                self.arch.hf_name()
            )));
        }
        let v = self.vocab_size as i64;
        if let Some(bad) = batch.input_ids.iter().find(|&&i| i < 0 || i >= v) {
            return Err(ModelError::Data(format!(
                "input id {bad} is outside the vocabulary [0, {v})"
            )));
        }
        let mut entries = Vec::new();
        for &tid in graph.inputs() {
            let name = graph.input_name(tid).expect("graph inputs are named");
            let data = match name {
                INPUT_IDS => FeedData::Ids(batch.input_ids.clone()),
                LABELS => FeedData::Ids(self.labels(batch)),
                POSITION_IDS => FeedData::Ids((0..t as i64).collect()),
                TOKEN_TYPE_IDS => FeedData::Ids(vec![0; b * t]),
                POSITION_IDS_AFTER_PAD => {
                    let pad = self.pads.embedding.expect("positions after pad need a padding_idx");
                    FeedData::Ids(positions_after_pad(&batch.input_ids, t, pad))
                }
                NOT_PAD_MASK | PAD_MASK => {
                    let pad = self.pads.embedding.expect("pad masks exist only with a padding_idx");
                    let want = name == PAD_MASK;
                    FeedData::Floats(
                        batch
                            .input_ids
                            .iter()
                            .map(|&i| if (i == pad) == want { 1.0 } else { 0.0 })
                            .collect(),
                    )
                }
                TARGETS => FeedData::Floats(batch.targets.clone().expect("checked above")),
                LAST_TOKEN => {
                    // HF: the rightmost token that is not pad_token_id (position 0 when all
                    // are); the last position when there is no pad token (batch 1 only).
                    let mut sel = vec![0.0; b * t];
                    for (row, ids) in batch.input_ids.chunks_exact(t).enumerate() {
                        let last = match self.pads.pooling {
                            Some(pad) => ids.iter().rposition(|&i| i != pad).unwrap_or(0),
                            None => t - 1,
                        };
                        sel[row * t + last] = 1.0;
                    }
                    FeedData::Floats(sel)
                }
                ATTENTION_MASK => {
                    let mask = batch.attention_mask.as_deref();
                    FeedData::Floats(
                        (0..b * t)
                            .map(|i| {
                                if mask.is_some_and(|m| m[i] == 0) {
                                    f32::NEG_INFINITY
                                } else {
                                    0.0
                                }
                            })
                            .collect(),
                    )
                }
                EAGER_MASK => FeedData::Floats(causal_mask(batch, t, t, EAGER_MASK_MIN)),
                EAGER_SLIDING_MASK | SLIDING_WINDOW_MASK => {
                    let w = self.sliding_window.expect("a window mask exists only with a window");
                    let masked =
                        if name == EAGER_SLIDING_MASK { EAGER_MASK_MIN } else { f32::NEG_INFINITY };
                    FeedData::Floats(causal_mask(batch, t, w, masked))
                }
                other => match self.fixed.iter().find(|(n, _)| *n == other) {
                    Some((_, values)) => FeedData::Floats(values.clone()),
                    None => unreachable!("the builders declare no input '{other}'"),
                },
            };
            entries.push((name.to_string(), data));
        }
        Ok(Feed { entries })
    }

    /// Labels as the graph's loss reads them. A causal LM: HF shifts inside the model
    /// (logits[:, :-1] against labels[:, 1:]); here position t gets label t+1 and the last
    /// position −100, which is the same mean over the same pairs.
    fn labels(&self, batch: &Batch) -> Vec<i64> {
        match self.arch.head() {
            Head::CausalLm => {
                let t = self.seq_len;
                let mut out = vec![crate::IGNORE_INDEX; batch.labels.len()];
                for (dst, src) in out.chunks_exact_mut(t).zip(batch.labels.chunks_exact(t)) {
                    dst[..t - 1].copy_from_slice(&src[1..]);
                }
                out
            }
            _ => batch.labels.clone(),
        }
    }
}
