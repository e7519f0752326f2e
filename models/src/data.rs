//! Training batches: deterministic synthetic data from a seed, or rows of a safetensors file.
//!
//! Batch k is a pure function of (source, k), so every config and every rank of a run sees the
//! same global batches whatever order it asks for them in.

use std::path::Path;

use safetensors::tensor::Dtype;
use safetensors::SafeTensors;

use crate::config::{ModelConfig, ProblemType};
use crate::family::Head;
use crate::rng::Rng;
use crate::ModelError;

/// Labels that the loss ignores (PyTorch's CrossEntropyLoss default ignore_index).
pub const IGNORE_INDEX: i64 = -100;

/// BERT's special tokens in the bert-base-uncased vocabulary.
const CLS: i64 = 101;
const SEP: i64 = 102;
const MASK: i64 = 103;
/// Ids below this are special/unused in the uncased vocabulary: synthetic text avoids them.
const FIRST_WORD: i64 = 999;

/// What the model is trained to predict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// BERT MLM: 15% of tokens selected, labels −100 elsewhere.
    MaskedLm,
    /// GPT-2: labels = input ids; the model shifts them.
    CausalLm,
    /// One label in [0, num_labels) per token, −100 where none (padding, special tokens).
    TokenClassification { num_labels: usize },
    /// A sequence classifier: one label in [0, num_labels) per row (single-label), num_labels
    /// 0/1 targets per row (multi-label) or one float target per row (regression).
    SequenceClassification { num_labels: usize, problem: ProblemType },
}

impl Task {
    pub fn for_config(cfg: &ModelConfig) -> Task {
        match cfg.arch.head() {
            Head::MaskedLm => Task::MaskedLm,
            Head::CausalLm => Task::CausalLm,
            Head::TokenClassification => Task::TokenClassification { num_labels: cfg.num_labels() },
            Head::SequenceClassification => Task::SequenceClassification {
                num_labels: cfg.num_labels(),
                problem: cfg.problem_type().expect("checked when the config was parsed"),
            },
        }
    }

    /// The name recorded in results (`--task`'s values).
    pub fn name(&self) -> &'static str {
        match self {
            Task::MaskedLm => "masked-lm",
            Task::CausalLm => "causal-lm",
            Task::TokenClassification { .. } => "token-classification",
            Task::SequenceClassification { problem: ProblemType::SingleLabel, .. } => {
                "sequence-classification"
            }
            Task::SequenceClassification { problem: ProblemType::MultiLabel, .. } => {
                "multi-label-classification"
            }
            Task::SequenceClassification { problem: ProblemType::Regression, .. } => "regression",
        }
    }

    /// Int labels per row: T for language models, 1 (single-label), num_labels (multi-label),
    /// 0 (regression: float targets instead).
    pub fn labels_per_row(&self, seq_len: usize) -> usize {
        match *self {
            Task::MaskedLm | Task::CausalLm | Task::TokenClassification { .. } => seq_len,
            Task::SequenceClassification { problem: ProblemType::SingleLabel, .. } => 1,
            Task::SequenceClassification { problem: ProblemType::MultiLabel, num_labels } => {
                num_labels
            }
            Task::SequenceClassification { problem: ProblemType::Regression, .. } => 0,
        }
    }
}

/// One batch, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub batch_size: usize,
    pub seq_len: usize,
    /// (B, T)
    pub input_ids: Vec<i64>,
    /// (B, T) for language modelling, (B,) for single-label classification, (B, num_labels)
    /// 0/1 for multi-label; empty for regression.
    pub labels: Vec<i64>,
    /// Regression targets, (B,); None for every other task.
    pub targets: Option<Vec<f32>>,
    /// (B, T) HF's `attention_mask`: 1 for tokens, 0 for padding; None when nothing is padded.
    pub attention_mask: Option<Vec<i64>>,
}

impl Batch {
    /// Rows `rows` of this batch (a rank's slice of a global batch).
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Batch {
        let t = self.seq_len;
        let per_label = self.labels.len() / self.batch_size;
        Batch {
            batch_size: rows.len(),
            seq_len: t,
            input_ids: self.input_ids[rows.start * t..rows.end * t].to_vec(),
            labels: self.labels[rows.start * per_label..rows.end * per_label].to_vec(),
            targets: self.targets.as_ref().map(|v| v[rows.clone()].to_vec()),
            attention_mask: self
                .attention_mask
                .as_ref()
                .map(|m| m[rows.start * t..rows.end * t].to_vec()),
        }
    }

    /// Whether any position of the batch is padding (HF skips the mask when none is).
    pub fn has_padding(&self) -> bool {
        self.attention_mask.as_ref().is_some_and(|m| m.contains(&0))
    }
}

impl Task {
    /// Labelled positions of `batch` that the loss averages over: MLM labels ≠ −100, causal
    /// LM labels ≠ −100 after the shift (positions 1..T), one per row for classification.
    pub fn label_count(&self, batch: &Batch) -> usize {
        match self {
            Task::MaskedLm | Task::TokenClassification { .. } => {
                batch.labels.iter().filter(|&&l| l != IGNORE_INDEX).count()
            }
            Task::CausalLm => batch
                .labels
                .chunks(batch.seq_len)
                .map(|row| row[1..].iter().filter(|&&l| l != IGNORE_INDEX).count())
                .sum(),
            Task::SequenceClassification { num_labels, problem: ProblemType::MultiLabel } => {
                batch.batch_size * num_labels
            }
            Task::SequenceClassification { .. } => batch.batch_size,
        }
    }
}

#[derive(Clone, Debug)]
enum Rows {
    Synthetic {
        seed: u64,
    },
    File {
        ids: Vec<i64>,
        labels: Option<Vec<i64>>,
        targets: Option<Vec<f32>>,
        mask: Option<Vec<i64>>,
        special: Option<Vec<i64>>,
        n_rows: usize,
    },
}

/// A source of batches for one model.
#[derive(Clone, Debug)]
pub struct DataSource {
    rows: Rows,
    task: Task,
    vocab: usize,
    pub batch_size: usize,
    pub seq_len: usize,
    seed: u64,
    /// The [MASK] id the MLM collator writes: the tokenizer's when the data file says
    /// (`mask_token_id` in its metadata, as `text::Tokenized::save` writes it), else
    /// bert-base-uncased's 103.
    mask_id: Option<i64>,
}

impl DataSource {
    /// Synthetic batches from `seed`.
    pub fn synthetic(
        cfg: &ModelConfig,
        batch_size: usize,
        seq_len: usize,
        seed: u64,
    ) -> Result<Self, ModelError> {
        check_sizes(cfg, batch_size, seq_len)?;
        Ok(DataSource {
            rows: Rows::Synthetic { seed },
            task: Task::for_config(cfg),
            vocab: cfg.vocab_size(),
            batch_size,
            seq_len,
            seed,
            mask_id: None,
        })
    }

    /// Rows of `path`: `input_ids` (int64, [N, T]), optionally `labels` (int64 [N, T] for
    /// language models; a classifier's: int64 \[N\] single-label, 0/1 \[N, num_labels\] int64 or
    /// float multi-label, float \[N\] regression) and `attention_mask` (int64 0/1, \[N, T\]: HF's padding
    /// mask; every row needs a token). Batches take rows in order, cycling to row 0. `T` must
    /// equal `seq_len` when given; otherwise it sets it. Any other tensor is an error: what a
    /// user puts in the file is used or refused, never silently dropped.
    pub fn from_file(
        cfg: &ModelConfig,
        path: &Path,
        batch_size: usize,
        seq_len: Option<usize>,
        seed: u64,
    ) -> Result<Self, ModelError> {
        let err = |m: String| ModelError::Data(format!("--data {}: {m}", path.display()));
        let bytes = std::fs::read(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let st = SafeTensors::deserialize(&bytes)
            .map_err(|e| err(format!("not a safetensors file: {e}")))?;
        let read_i64 = |name: &str| read_i64(&st, name, &err);
        let (shape, ids) =
            read_i64("input_ids")?.ok_or_else(|| err("no 'input_ids' tensor".into()))?;
        // Every tensor in the file must be one the run uses: `token_type_ids` (or anything
        // else) silently dropped would train on something else than the user's data.
        let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
        names.sort();
        // `special_tokens_mask` (what the MLM collator never selects, as HF's) is read by
        // masked-lm only.
        let mlm = Task::for_config(cfg) == Task::MaskedLm;
        let read: &[&str] = if mlm {
            &["input_ids", "labels", "attention_mask", "special_tokens_mask"]
        } else {
            &["input_ids", "labels", "attention_mask"]
        };
        if let Some(extra) = names.iter().find(|n| !read.contains(&n.as_str())) {
            return Err(err(format!(
                "tensor '{extra}' would be ignored: {} reads only {}; remove it from the file",
                cfg.arch.hf_name(),
                read.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
            )));
        }
        if shape.len() != 2 || shape[0] == 0 || shape[1] == 0 {
            return Err(err(format!(
                "'input_ids' must have shape [N, T] with N, T > 0, found {shape:?}"
            )));
        }
        let (n_rows, t) = (shape[0], shape[1]);
        if let Some(s) = seq_len {
            if s != t {
                return Err(err(format!(
                    "rows have length T = {t} but --seq-len is {s} (omit --seq-len to use {t})"
                )));
            }
        }
        check_sizes(cfg, batch_size, t)?;
        let vocab = cfg.vocab_size() as i64;
        if let Some(bad) = ids.iter().find(|&&i| i < 0 || i >= vocab) {
            return Err(err(format!("input id {bad} is outside the vocabulary [0, {vocab})")));
        }
        let mask = file_mask(read_i64("attention_mask")?, &shape, &err)?;
        let special = match read_i64("special_tokens_mask")? {
            None => None,
            Some((sshape, s)) if sshape == shape && s.iter().all(|&v| v == 0 || v == 1) => Some(s),
            Some(_) => {
                return Err(err(format!(
                    "'special_tokens_mask' must be 0/1 with the shape of 'input_ids' {shape:?}"
                )))
            }
        };
        let task = Task::for_config(cfg);
        let (labels, targets) = match st.tensor("labels") {
            Ok(view) => file_labels(cfg, task, &view, [n_rows, t], &read_i64, &err)?,
            Err(_) => (None, None),
        };
        let (_, meta) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| err(format!("not a safetensors file: {e}")))?;
        let mask_id = match meta.metadata().as_ref().and_then(|m| m.get("mask_token_id")) {
            None => None,
            Some(v) => match v.parse::<i64>() {
                Ok(id) if (0..vocab).contains(&id) => Some(id),
                _ => {
                    return Err(err(format!(
                        "metadata mask_token_id '{v}' is not an id of the vocabulary"
                    )))
                }
            },
        };
        Ok(DataSource {
            rows: Rows::File { ids, labels, targets, mask, special, n_rows },
            task,
            vocab: cfg.vocab_size(),
            batch_size,
            seq_len: t,
            seed,
            mask_id,
        })
    }

    pub fn task(&self) -> Task {
        self.task
    }

    /// Whether batches carry an `attention_mask` (the engine graph then takes one).
    pub fn has_attention_mask(&self) -> bool {
        matches!(&self.rows, Rows::File { mask: Some(_), .. })
    }

    /// Rows of the file (None for synthetic data, which is endless).
    pub fn n_rows(&self) -> Option<usize> {
        match &self.rows {
            Rows::File { n_rows, .. } => Some(*n_rows),
            Rows::Synthetic { .. } => None,
        }
    }

    /// The file's last `eval_rows` rows as a second source (an evaluation split, batches of
    /// `eval_batch`), and this source without them.
    pub fn split_off(
        &self,
        eval_rows: usize,
        eval_batch: usize,
    ) -> Result<(DataSource, DataSource), ModelError> {
        let Rows::File { ids, labels, targets, mask, special, n_rows } = &self.rows else {
            return Err(ModelError::Data("an evaluation split needs rows from a file".into()));
        };
        if eval_rows == 0 || eval_rows >= *n_rows {
            return Err(ModelError::Data(format!(
                "cannot split {eval_rows} evaluation rows off {n_rows}"
            )));
        }
        let t = self.seq_len;
        let keep = n_rows - eval_rows;
        let per_label = self.task.labels_per_row(t);
        let part = |lo: usize, hi: usize| Rows::File {
            ids: ids[lo * t..hi * t].to_vec(),
            labels: labels.as_ref().map(|l| l[lo * per_label..hi * per_label].to_vec()),
            targets: targets.as_ref().map(|v| v[lo..hi].to_vec()),
            mask: mask.as_ref().map(|m| m[lo * t..hi * t].to_vec()),
            special: special.as_ref().map(|s| s[lo * t..hi * t].to_vec()),
            n_rows: hi - lo,
        };
        let train = DataSource { rows: part(0, keep), ..self.clone() };
        let eval = DataSource { rows: part(keep, *n_rows), batch_size: eval_batch, ..self.clone() };
        Ok((train, eval))
    }

    /// The global batch of step `step` (0-based): rows step·B .. (step+1)·B of the file,
    /// cycling.
    pub fn batch(&self, step: usize) -> Batch {
        let b = self.batch_size;
        let rows: Vec<usize> = match self.n_rows() {
            Some(n) => (0..b).map(|i| (step * b + i) % n).collect(),
            None => Vec::new(),
        };
        self.batch_of_rows(&rows, step)
    }

    /// A batch of the file's `rows` (any order: `ortbench train` shuffles per epoch); `step`
    /// seeds what is drawn per batch (MLM masking, synthetic labels). Synthetic sources ignore
    /// `rows` and make step `step`'s batch.
    pub fn batch_of_rows(&self, rows: &[usize], step: usize) -> Batch {
        let (b, t) =
            (if self.n_rows().is_some() { rows.len() } else { self.batch_size }, self.seq_len);
        let mut rng = Rng::for_stream(self.seed, &format!("batch-{step}"));
        let mut given_targets: Option<Vec<f32>> = None;
        let mut special_mask: Option<Vec<i64>> = None;
        let (input_ids, given_labels, attention_mask) = match &self.rows {
            Rows::Synthetic { seed } => {
                let mut r = Rng::for_stream(*seed, &format!("tokens-{step}"));
                let lo = if self.vocab as i64 > FIRST_WORD + 100 && self.task != Task::CausalLm {
                    FIRST_WORD
                } else {
                    0
                };
                let ids: Vec<i64> = (0..b * t).map(|_| r.range(lo, self.vocab as i64)).collect();
                (ids, None, None)
            }
            Rows::File { ids, labels, targets, mask, special, .. } => {
                let per_label = self.task.labels_per_row(t);
                let row = |i: usize| rows[i];
                let take = |all: &Vec<i64>, per: usize| -> Vec<i64> {
                    (0..b)
                        .flat_map(|i| all[row(i) * per..(row(i) + 1) * per].iter().copied())
                        .collect()
                };
                given_targets = targets.as_ref().map(|v| (0..b).map(|i| v[row(i)]).collect());
                special_mask = special.as_ref().map(|s| take(s, t));
                (
                    take(ids, t),
                    labels.as_ref().map(|l| take(l, per_label)),
                    mask.as_ref().map(|m| take(m, t)),
                )
            }
        };
        let synthetic = matches!(self.rows, Rows::Synthetic { .. });
        let mut targets = None;
        let labels = match (self.task, given_labels) {
            (_, Some(labels)) => labels,
            (Task::SequenceClassification { problem: ProblemType::Regression, .. }, None) => {
                targets = Some(
                    given_targets.unwrap_or_else(|| (0..b).map(|_| rng.normal() as f32).collect()),
                );
                Vec::new()
            }
            (
                Task::SequenceClassification { problem: ProblemType::MultiLabel, num_labels },
                None,
            ) => (0..b * num_labels).map(|_| rng.range(0, 2)).collect(),
            // HF's DataCollatorForLanguageModeling(mlm=False): labels are the inputs, padding
            // −100 (it goes by pad_token_id; the mask says the same without one).
            (Task::CausalLm, None) => match &attention_mask {
                Some(m) => input_ids
                    .iter()
                    .zip(m)
                    .map(|(&i, &m)| if m == 0 { IGNORE_INDEX } else { i })
                    .collect(),
                None => input_ids.clone(),
            },
            (Task::SequenceClassification { num_labels, .. }, None) => {
                (0..b).map(|_| rng.range(0, num_labels as i64)).collect()
            }
            // Random tags, −100 at padding (synthetic batches have none).
            (Task::TokenClassification { num_labels }, None) => (0..b * t)
                .map(|i| {
                    let tag = rng.range(0, num_labels as i64);
                    if attention_mask.as_ref().is_some_and(|m| m[i] == 0) {
                        IGNORE_INDEX
                    } else {
                        tag
                    }
                })
                .collect(),
            (Task::MaskedLm, None) => {
                // Never selected: padding and, when the file says, special tokens.
                let never: Option<Vec<i64>> = match (&attention_mask, &special_mask) {
                    (m, Some(s)) => Some(
                        s.iter()
                            .zip(0..)
                            .map(|(&s, i)| {
                                i64::from(s == 0 && m.as_ref().is_none_or(|m| m[i] == 1))
                            })
                            .collect(),
                    ),
                    (m, None) => m.clone(),
                };
                let (ids, labels) = mask_tokens(
                    input_ids,
                    never.as_deref(),
                    b,
                    t,
                    self.vocab,
                    self.mask_id,
                    synthetic,
                    &mut rng,
                );
                return Batch {
                    batch_size: b,
                    seq_len: t,
                    input_ids: ids,
                    labels,
                    targets: None,
                    attention_mask,
                };
            }
        };
        Batch { batch_size: b, seq_len: t, input_ids, labels, targets, attention_mask }
    }
}

/// HF's DataCollatorForLanguageModeling (mlm_probability 0.15): of the selected tokens 80%
/// become [MASK], 10% a random token, 10% stay; labels are the originals there, −100 elsewhere.
/// Synthetic rows also get [CLS] … [SEP] like tokenized text, and those are never selected;
/// nor is any position where `mask` is 0 (padding, and special tokens when the data marks them:
/// HF's collator excludes both through `special_tokens_mask`).
#[allow(
    clippy::too_many_arguments,
    reason = "DataCollatorForLanguageModeling's inputs and probabilities, each used once"
)]
fn mask_tokens(
    mut ids: Vec<i64>,
    mask: Option<&[i64]>,
    b: usize,
    t: usize,
    vocab: usize,
    mask_id: Option<i64>,
    add_special: bool,
    rng: &mut Rng,
) -> (Vec<i64>, Vec<i64>) {
    let is_pad = |i: usize| mask.is_some_and(|m| m[i] == 0);
    let special = add_special && vocab as i64 > MASK && t >= 3;
    let mask_id = mask_id.unwrap_or(if vocab as i64 > MASK { MASK } else { vocab as i64 - 1 });
    let mut labels = vec![IGNORE_INDEX; b * t];
    for row in 0..b {
        for pos in 0..t {
            let i = row * t + pos;
            if special && (pos == 0 || pos == t - 1) {
                ids[i] = if pos == 0 { CLS } else { SEP };
                continue;
            }
            if rng.uniform() < 0.15 && !is_pad(i) {
                select(&mut ids, &mut labels, i, mask_id, vocab, rng);
            }
        }
        // A row with no selected token has no loss term: at batch 1 its mean loss is 0/0
        // (NaN). Unlike HF's collator (where a whole batch without one is merely unlikely),
        // every row here gets at least one, drawn uniformly among its ordinary positions.
        let (lo, hi) = if special { (1, t - 1) } else { (0, t) };
        let tokens: Vec<usize> = (lo..hi).filter(|&pos| !is_pad(row * t + pos)).collect();
        if !tokens.is_empty() && labels[row * t..(row + 1) * t].iter().all(|&l| l == IGNORE_INDEX) {
            let pos = tokens[rng.range(0, tokens.len() as i64) as usize];
            select(&mut ids, &mut labels, row * t + pos, mask_id, vocab, rng);
        }
    }
    (ids, labels)
}

/// Selects token `i` for the MLM loss: its label is the original, and the input becomes
/// [MASK] (80 %), a random token (10 %) or stays (10 %).
fn select(
    ids: &mut [i64],
    labels: &mut [i64],
    i: usize,
    mask_id: i64,
    vocab: usize,
    rng: &mut Rng,
) {
    labels[i] = ids[i];
    let u = rng.uniform();
    if u < 0.8 {
        ids[i] = mask_id;
    } else if u < 0.9 {
        ids[i] = rng.range(0, vocab as i64);
    }
}

fn check_sizes(cfg: &ModelConfig, batch_size: usize, seq_len: usize) -> Result<(), ModelError> {
    if batch_size == 0 {
        return Err(ModelError::Data("--batch-size must be at least 1".into()));
    }
    if seq_len < 2 {
        return Err(ModelError::Data("--seq-len must be at least 2".into()));
    }
    if let Some(limit) = cfg.position_limit().filter(|&l| seq_len > l) {
        return Err(ModelError::Data(format!(
            "--seq-len {seq_len} is beyond the model's {limit} positions"
        )));
    }
    Ok(())
}

/// A tensor's shape and values.
type Int64Tensor = (Vec<usize>, Vec<i64>);

/// The int64 tensor `name` of a data file, None when the file has none.
fn read_i64(
    st: &SafeTensors<'_>,
    name: &str,
    err: &dyn Fn(String) -> ModelError,
) -> Result<Option<Int64Tensor>, ModelError> {
    let Ok(view) = st.tensor(name) else { return Ok(None) };
    if view.dtype() != Dtype::I64 {
        return Err(err(format!("'{name}' must be int64, found {:?}", view.dtype())));
    }
    let data = view
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    Ok(Some((view.shape().to_vec(), data)))
}

/// A data file's `attention_mask`, checked against the ids' `shape`: 0/1, a token in every row.
fn file_mask(
    read: Option<Int64Tensor>,
    shape: &[usize],
    err: &dyn Fn(String) -> ModelError,
) -> Result<Option<Vec<i64>>, ModelError> {
    let t = shape[1];
    Ok(match read {
        None => None,
        Some((mshape, mask)) => {
            if mshape != shape {
                return Err(err(format!("'attention_mask' must have the shape of 'input_ids' {shape:?}, found {mshape:?}")));
            }
            if let Some(bad) = mask.iter().find(|&&m| m != 0 && m != 1) {
                return Err(err(format!(
                    "'attention_mask' must hold 0 (padding) or 1 (token), found {bad}"
                )));
            }
            if let Some(row) = mask.chunks_exact(t).position(|r| !r.contains(&1)) {
                return Err(err(format!("row {row} is all padding (its attention_mask has no 1)")));
            }
            Some(mask)
        }
    })
}

/// A data file's integer labels, or a regression's float targets.
type FileLabels = (Option<Vec<i64>>, Option<Vec<f32>>);

/// A data file's `labels` (integer labels, or a regression's float targets) for `task`, checked
/// against the rows' `[n_rows, t]`.
fn file_labels(
    cfg: &ModelConfig,
    task: Task,
    view: &safetensors::tensor::TensorView<'_>,
    [n_rows, t]: [usize; 2],
    read_i64: &dyn Fn(&str) -> Result<Option<Int64Tensor>, ModelError>,
    err: &dyn Fn(String) -> ModelError,
) -> Result<FileLabels, ModelError> {
    let vocab = cfg.vocab_size() as i64;
    let (mut labels, mut targets) = (None, None);
    let want: Vec<usize> = match task {
        Task::SequenceClassification { num_labels, problem: ProblemType::MultiLabel } => {
            vec![n_rows, num_labels]
        }
        Task::SequenceClassification { .. } => vec![n_rows],
        _ => vec![n_rows, t],
    };
    if view.shape() != want {
        let hint = match task {
            Task::SequenceClassification { problem: ProblemType::SingleLabel, .. } if view.shape().len() == 2 => {
                " (multi-label targets need problem_type \"multi_label_classification\" in config.json)"
            }
            _ => "",
        };
        return Err(err(format!(
            "'labels' must have shape {want:?} for {}, found {:?}{hint}",
            task.name(),
            view.shape()
        )));
    }
    let floats: Option<Vec<f64>> = match view.dtype() {
        Dtype::F32 => Some(
            view.data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64)
                .collect(),
        ),
        Dtype::F64 => Some(
            view.data()
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        ),
        _ => None,
    };
    match (task, floats) {
        (Task::SequenceClassification { problem: ProblemType::Regression, .. }, Some(v)) => {
            if let Some(bad) = v.iter().find(|x| !x.is_finite()) {
                return Err(err(format!("regression target {bad} is not finite")));
            }
            targets = Some(v.iter().map(|&x| x as f32).collect());
        }
        (Task::SequenceClassification { problem: ProblemType::Regression, .. }, None) => {
            return Err(err(format!(
                "regression 'labels' must be float32 or float64, found {:?}",
                view.dtype()
            )));
        }
        // Multi-label: HF's float 0/1 targets (soft targets are not supported).
        (Task::SequenceClassification { problem: ProblemType::MultiLabel, .. }, Some(v)) => {
            if let Some(bad) = v.iter().find(|&&x| x != 0.0 && x != 1.0) {
                return Err(err(format!("multi-label targets must be 0 or 1, found {bad}")));
            }
            labels = Some(v.iter().map(|&x| x as i64).collect());
        }
        (_, Some(_)) => {
            return Err(err(format!(
                "'labels' must be int64 for {}, found {:?}",
                task.name(),
                view.dtype()
            )))
        }
        (_, None) => {
            let (_, v) = read_i64("labels")?.expect("the tensor exists");
            let ok = |l: i64| match task {
                Task::SequenceClassification { problem: ProblemType::MultiLabel, .. } => {
                    l == 0 || l == 1
                }
                Task::SequenceClassification { num_labels, .. } => {
                    (0..num_labels as i64).contains(&l)
                }
                Task::TokenClassification { num_labels } => {
                    l == IGNORE_INDEX || (0..num_labels as i64).contains(&l)
                }
                _ => l == IGNORE_INDEX || (0..vocab).contains(&l),
            };
            if let Some(bad) = v.iter().find(|&&l| !ok(l)) {
                return Err(err(format!(
                    "label {bad} is out of range for {} ({})",
                    cfg.arch.hf_name(),
                    task.name()
                )));
            }
            labels = Some(v);
        }
    }
    Ok((labels, targets))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::builtin_config;
    use safetensors::tensor::TensorView;

    #[test]
    fn synthetic_batches_are_deterministic_and_masked_like_hf() {
        let cfg = builtin_config("bert").unwrap();
        let d = DataSource::synthetic(&cfg, 8, 128, 5).unwrap();
        let a = d.batch(3);
        assert_eq!(a, d.batch(3));
        assert_ne!(a, d.batch(4));
        let selected = a.labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
        let frac = selected as f64 / (8.0 * 126.0);
        assert!((0.10..0.20).contains(&frac), "selected {frac}");
        let masked = a.input_ids.iter().filter(|&&i| i == MASK).count() as f64 / selected as f64;
        assert!((0.65..0.95).contains(&masked), "masked {masked}");
        assert_eq!(a.input_ids[0], CLS);
        assert_eq!(a.input_ids[127], SEP);
        for (i, &l) in a.labels.iter().enumerate() {
            if l != IGNORE_INDEX {
                assert!(l >= FIRST_WORD, "label at {i} is a real token");
            }
        }
    }

    #[test]
    fn every_mlm_row_has_a_selected_token() {
        // At b1 × s16, 14 ordinary positions: P(none of 14 selected) = 0.85^14 ≈ 10 %, so
        // among 200 batches about 20 would have had no label (a NaN loss) without the rule.
        let cfg = builtin_config("bert").unwrap();
        let d = DataSource::synthetic(&cfg, 1, 16, 3).unwrap();
        for step in 0..200 {
            let b = d.batch(step);
            let n = b.labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
            assert!(n >= 1, "step {step}: no selected token");
            assert_eq!(
                (b.labels[0], b.labels[15]),
                (IGNORE_INDEX, IGNORE_INDEX),
                "[CLS]/[SEP] never selected"
            );
        }
        let d = DataSource::synthetic(&cfg, 4, 3, 3).unwrap();
        for step in 0..50 {
            let b = d.batch(step);
            for row in 0..4 {
                assert_ne!(
                    b.labels[row * 3 + 1],
                    IGNORE_INDEX,
                    "the one ordinary position is selected"
                );
            }
        }
    }

    #[test]
    fn causal_lm_labels_are_inputs() {
        let cfg = builtin_config("tiny-gpt2").unwrap();
        let b = DataSource::synthetic(&cfg, 2, 16, 1).unwrap().batch(0);
        assert_eq!(b.labels, b.input_ids);
        assert!(b.input_ids.iter().all(|&i| (0..1000).contains(&i)));
    }

    fn write_ids(path: &Path, name: &str, dtype: Dtype, shape: &[usize], data: &[u8]) {
        let view = TensorView::new(dtype, shape.to_vec(), data).unwrap();
        safetensors::serialize_to_file(vec![(name.to_string(), view)], None, path).unwrap();
    }

    #[test]
    fn file_rows_cycle_in_order() {
        let cfg = builtin_config("tiny-gpt2").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.safetensors");
        let ids: Vec<i64> = (0..5 * 4).map(|i| i as i64).collect();
        let bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        write_ids(&path, "input_ids", Dtype::I64, &[5, 4], &bytes);
        let d = DataSource::from_file(&cfg, &path, 2, None, 0).unwrap();
        assert_eq!(d.seq_len, 4);
        assert_eq!(d.batch(0).input_ids, (0..8).collect::<Vec<i64>>());
        // step 2 takes rows 4, 0
        assert_eq!(d.batch(2).input_ids, vec![16, 17, 18, 19, 0, 1, 2, 3]);
        assert_eq!(d.batch(2).labels, d.batch(2).input_ids);
        let e = DataSource::from_file(&cfg, &path, 2, Some(8), 0).unwrap_err().to_string();
        assert!(e.contains("T = 4") && e.contains("--seq-len is 8"), "{e}");
    }

    fn write_tensors(path: &Path, tensors: &[(&str, &[usize], &[i64])]) {
        let bytes: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, _, d)| d.iter().flat_map(|v| v.to_le_bytes()).collect())
            .collect();
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .zip(&bytes)
            .map(|((n, shape, _), b)| {
                (n.to_string(), TensorView::new(Dtype::I64, shape.to_vec(), b).unwrap())
            })
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    /// A padded file: the mask reaches the batches; causal LM labels are −100 at padding; MLM
    /// never selects padding; an unused tensor or a bad mask is refused, naming it.
    #[test]
    fn attention_masks_are_read_and_unused_tensors_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.safetensors");
        let ids: Vec<i64> = (0..3 * 6).map(|i| 200 + i as i64).collect();
        let mask: Vec<i64> = [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]].concat();
        write_tensors(&path, &[("input_ids", &[3, 6], &ids), ("attention_mask", &[3, 6], &mask)]);
        let gpt2 = builtin_config("tiny-gpt2").unwrap();
        let d = DataSource::from_file(&gpt2, &path, 2, None, 0).unwrap();
        assert!(d.has_attention_mask());
        let b = d.batch(1); // rows 2, 0
        assert_eq!(b.attention_mask.as_deref(), Some(&[[1, 1, 0, 0, 0, 0], [1; 6]].concat()[..]));
        assert!(b.has_padding());
        assert_eq!(&b.labels[..6], &[212, 213, -100, -100, -100, -100]);
        assert_eq!(&b.labels[6..], &b.input_ids[6..]);
        assert_eq!(b.rows(0..1).attention_mask.unwrap(), vec![1, 1, 0, 0, 0, 0]);

        let bert = builtin_config("tiny-bert").unwrap();
        let d = DataSource::from_file(&bert, &path, 3, None, 0).unwrap();
        for step in 0..40 {
            let b = d.batch(step);
            for (i, (&l, &m)) in b.labels.iter().zip(&mask).enumerate() {
                assert!(m == 1 || l == IGNORE_INDEX, "step {step}: padding position {i} selected");
            }
            for row in 0..3 {
                assert!(
                    b.labels[row * 6..(row + 1) * 6].iter().any(|&l| l != IGNORE_INDEX),
                    "row {row} has a label"
                );
            }
        }

        let refuse = |tensors: &[(&str, &[usize], &[i64])], want: &str| {
            write_tensors(&path, tensors);
            let e = DataSource::from_file(&gpt2, &path, 1, None, 0).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        let types = vec![0i64; 18];
        refuse(
            &[("input_ids", &[3, 6], &ids), ("token_type_ids", &[3, 6], &types)],
            "tensor 'token_type_ids' would be ignored",
        );
        refuse(
            &[("input_ids", &[3, 6], &ids), ("attention_mask", &[3, 5], &mask[..15])],
            "shape of 'input_ids'",
        );
        let mut two = mask.clone();
        two[4] = 2;
        refuse(&[("input_ids", &[3, 6], &ids), ("attention_mask", &[3, 6], &two)], "found 2");
        let mut empty = mask.clone();
        empty[12..14].copy_from_slice(&[0, 0]);
        refuse(
            &[("input_ids", &[3, 6], &ids), ("attention_mask", &[3, 6], &empty)],
            "row 2 is all padding",
        );
    }

    #[test]
    fn bad_files_and_sizes_are_clear_errors() {
        let cfg = builtin_config("tiny-gpt2").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.safetensors");
        write_ids(&path, "input_ids", Dtype::F32, &[2, 4], &[0u8; 32]);
        let e = DataSource::from_file(&cfg, &path, 1, None, 0).unwrap_err().to_string();
        assert!(e.contains("must be int64"), "{e}");
        write_ids(&path, "input_ids", Dtype::I64, &[8], &[0u8; 64]);
        let e = DataSource::from_file(&cfg, &path, 1, None, 0).unwrap_err().to_string();
        assert!(e.contains("[N, T]"), "{e}");
        write_ids(&path, "tokens", Dtype::I64, &[2, 4], &[0u8; 64]);
        let e = DataSource::from_file(&cfg, &path, 1, None, 0).unwrap_err().to_string();
        assert!(e.contains("no 'input_ids'"), "{e}");
        let e = DataSource::synthetic(&cfg, 2, 65, 0).unwrap_err().to_string();
        assert!(e.contains("beyond the model's 64 positions"), "{e}");
        assert!(DataSource::synthetic(&cfg, 0, 8, 0).is_err());
    }
}
