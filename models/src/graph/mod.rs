//! The engine graphs of the models: each family's builder (`family/<family>/graph.rs`) writes its
//! HF architecture as an `ortbench-engine` graph that computes the same function as its tch
//! baseline (same op order, same loss, same gradients — `tests/tests/engine_parity.rs` checks
//! it) on the `Builder` here; this module adds the loss, runs the passes and autodiff, and
//! feeds the graph's inputs (`feed`: each step's inputs from a batch).
//!
//! Parameters are declared first, in [`param_specs`] order under their HF names, so the engine's
//! flat parameter buffer is the plain concatenation of a [`Weights`]' tensors
//! ([`EngineModel::flatten`] / [`EngineModel::unflatten`]) and gradients land in the same layout.
//! A model feature the engine cannot express is a [`ModelError::Unsupported`] at build time,
//! never a silent fallback.
//!
//! ```no_run
//! # use ortbench_models::{graph::{build_training_graph, GraphOptions}, spec::builtin_config, DataSource, Weights};
//! # fn main() -> Result<(), ortbench_models::ModelError> {
//! let cfg = builtin_config("tiny-gpt2")?;
//! let model = build_training_graph(&cfg, &GraphOptions::new(4, 32))?;
//! let params = model.flatten(&Weights::init(&cfg, 0))?;
//! let mut grads = vec![0.0f32; params.len()];
//! let batch = DataSource::synthetic(&cfg, 4, 32, 0)?.batch(0);
//! let loss = model.ref_train_step(&params, &batch, /* dropout seed */ 0, &mut grads)?;
//! # let _ = loss; Ok(()) }
//! ```

mod feed;
pub mod trainer;

use std::collections::HashMap;

use ortbench_engine::graph::{GeluApprox, Graph, GraphError, TensorId};
use ortbench_engine::ops::pointwise::UnaryFn;
use ortbench_engine::passes::{self, PassConfig, PassReport};
use ortbench_engine::{autodiff, DType, RefExecutor};

use crate::config::ProblemType;
use crate::config::{Activation, ModelConfig};
use crate::data::{Batch, Task};
use crate::family::{Architecture, Pads};
use crate::params::param_specs;
use crate::weights::{NamedTensor, Weights};
use crate::ModelError;
use feed::FeedInfo;
pub use feed::{positions_after_pad, Feed, FeedData};

/// Token ids, (B, T) i64.
pub const INPUT_IDS: &str = "input_ids";
/// Labels as the loss consumes them, i64: (B, T) for language models — for a causal LM already
/// shifted by [`EngineModel::feed`] — and (B,) for sequence classification.
pub const LABELS: &str = "labels";
/// 0..T, (T) i64: HF's default `position_ids` (absolute positions).
pub const POSITION_IDS: &str = "position_ids";
/// RoBERTa's positions (`create_position_ids_from_input_ids`), (B, T) i64: the pad id
/// ([`Pads::embedding`]) at pad tokens, pad id + the running count of non-pad tokens elsewhere.
pub const POSITION_IDS_AFTER_PAD: &str = "position_ids_after_pad";
/// Segment ids (BERT's), (B, T) i64; zeros, as HF's default when none are given.
pub const TOKEN_TYPE_IDS: &str = "token_type_ids";
/// A word embedding with a `padding_idx` ([`Pads::embedding`]): 1.0 where the token is not
/// padding, (B, T, 1, 1) f32.
pub const NOT_PAD_MASK: &str = "input_ids_not_pad";
/// A word embedding with a `padding_idx` ([`Pads::embedding`]): 1.0 where the token is
/// padding, (B, T, 1, 1) f32.
pub const PAD_MASK: &str = "input_ids_is_pad";
/// Graphs built [`GraphOptions::with_attention_mask`]: HF's `attention_mask` as the additive
/// key-padding mask attention adds to its scores, (B, 1, 1, T) in the graph's dtype: 0 at
/// tokens, −∞ at padding — what torch's sdpa makes of HF's boolean mask. A query whose every
/// key is masked (a left pad under the causal mask) outputs zeros, as sdpa does.
pub const ATTENTION_MASK: &str = "attention_mask";
/// Regression classifiers: the float targets, (B, 1) in the graph's dtype.
pub const TARGETS: &str = "regression_targets";
/// A last-token-pooling classifier (GPT2ForSequenceClassification): 1.0 at each row's pooled
/// token (the last that is not [`Pads::pooling`], HF's rule), (B, 1, T) in the graph's dtype.
pub const LAST_TOKEN: &str = "last_token_selector";
/// A rotary embedding's cos table, (T, D) in the graph's dtype: HF's `cos(cat(freqs, freqs))`
/// at positions 0..T, computed on the host in f32 (`FamilyModel::fixed_inputs`).
pub const ROPE_COS: &str = "rope_cos";
/// The sin table beside [`ROPE_COS`].
pub const ROPE_SIN: &str = "rope_sin";
/// Gemma 3's sliding layers' rotary cos table (their own rope, the local base), beside
/// [`ROPE_COS`] of its full layers.
pub const ROPE_COS_LOCAL: &str = "rope_cos_local";
/// The sin table beside [`ROPE_COS_LOCAL`].
pub const ROPE_SIN_LOCAL: &str = "rope_sin_local";
/// A sliding-window layer's additive mask, (B, 1, T, T) in the graph's dtype: 0 where key j
/// may be read by query i (j ≤ i, j > i − window, and j is not padding), −∞ elsewhere — HF's
/// `create_sliding_window_causal_mask`. Built only when the window bites (T > window).
pub const SLIDING_WINDOW_MASK: &str = "sliding_window_mask";
/// Models HF runs with eager attention (Gemma 2, whose class has no sdpa), padded: the additive
/// mask of its full layers, (B, 1, T, T), 0 where key j may be read by query i (j ≤ i, j not
/// padding) and [`EAGER_MASK_MIN`] elsewhere, the causal part included — HF's eager float mask.
/// Unlike −∞, a finite minimum leaves a query with no key to read (a left pad) attending to
/// every key alike, as HF's eager softmax does; the causal LM's loss reads that query's output
/// (the last left pad predicts the first token).
pub const EAGER_MASK: &str = "eager_attention_mask";
/// [`EAGER_MASK`] of the sliding layers: also j > i − window.
pub const EAGER_SLIDING_MASK: &str = "eager_sliding_window_mask";
/// The masked entries of the eager masks: bfloat16's finfo.min (HF's is the dtype's; any
/// minimum this far below the scores gives the same probabilities in f32 and bf16).
pub const EAGER_MASK_MIN: f32 = -3.389_531_4e38;

/// What to build: the static sizes of a step, the storage dtype of activations and the graph
/// passes to run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GraphOptions {
    pub batch_size: usize,
    pub seq_len: usize,
    /// Storage dtype of parameters' copies and activations (the flat master buffer is f32).
    pub dtype: DType,
    /// The engine passes [`build_training_graph`] runs (default: [`PassConfig::all`]; the
    /// harness takes `ORTBENCH_PASSES` through [`PassConfig::from_env`]).
    pub passes: PassConfig,
    /// Whether the graph takes an [`ATTENTION_MASK`] (padded batches). Without one, a batch
    /// with padding is refused by [`EngineModel::feed`].
    pub attention_mask: bool,
}

impl GraphOptions {
    /// f32 graph for (batch_size, seq_len) steps, every default pass on.
    pub fn new(batch_size: usize, seq_len: usize) -> Self {
        GraphOptions {
            batch_size,
            seq_len,
            dtype: DType::F32,
            passes: PassConfig::all(),
            attention_mask: false,
        }
    }

    pub fn with_attention_mask(mut self, on: bool) -> Self {
        self.attention_mask = on;
        self
    }

    pub fn with_dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    pub fn with_passes(mut self, passes: PassConfig) -> Self {
        self.passes = passes;
        self
    }
}

/// Where one HF parameter lives in the flat parameter (and gradient) buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSlot {
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
    pub len: usize,
}

/// A model as an engine training graph.
#[derive(Clone, Debug)]
pub struct EngineModel {
    pub arch: Architecture,
    pub batch_size: usize,
    pub seq_len: usize,
    /// The forward graph as the builder wrote it (HF's eager form: unfused attention, matmul +
    /// bias add, dropout sites at p = 0), before any pass.
    pub unoptimized: Graph,
    /// The forward graph after the forward passes: what autodiff differentiated.
    pub forward: Graph,
    /// The training graph: optimised forward, loss, backward, then the training passes.
    pub graph: Graph,
    /// The scalar loss (the same tensor id in `forward` and `graph`; passes renumber tensors,
    /// so not in `unoptimized`).
    pub loss: TensorId,
    /// What the passes of `GraphOptions::passes` did (forward passes, then training passes).
    pub pass_report: PassReport,
    /// Every `param_specs(cfg)` entry, in that order, with its (offset, len) in the flat buffer.
    pub params: Vec<ParamSlot>,
    /// The pad ids the derived inputs use, as the family says.
    pub pads: Pads,
    /// What the loss trains (and so which labels `feed` takes).
    pub task: Task,
    vocab_size: usize,
    num_labels: usize,
    /// The family's sliding window (its mask is fed when the graph takes one).
    sliding_window: Option<usize>,
    /// Inputs that depend on the config and sizes only (rotary tables), fed as they are.
    fixed: std::sync::Arc<Vec<(&'static str, Vec<f32>)>>,
}

/// The forward graph of `cfg` for steps of `opts` as the builder writes it (HF's eager form,
/// no pass run; its loss is set) and its scalar loss.
pub fn build_forward_graph(
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> Result<(Graph, TensorId), ModelError> {
    let (mut b, logits) = build_logits(cfg, opts)?;
    let loss = add_loss(&mut b, cfg, opts, logits).map_err(|e| build_err(cfg, e))?;
    let mut g = b.g;
    g.set_loss(loss).map_err(|e| graph_err(cfg, e))?;
    Ok((g, loss))
}

/// The inference graph of `cfg`: HF's eager forward up to the head's logits — (B, T, V) for
/// language models, (B, num_labels) for classifiers — with no labels and no loss, and its
/// logits tensor. No pass is run (run it on the reference executor, or export it).
pub fn build_inference_graph(
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> Result<(Graph, TensorId), ModelError> {
    let (b, logits) = build_logits(cfg, opts)?;
    Ok((b.g, logits))
}

fn build_logits(cfg: &ModelConfig, opts: &GraphOptions) -> Result<(Builder, TensorId), ModelError> {
    check_sizes(cfg, opts)?;
    let mut b = Builder::new(cfg, opts.dtype).map_err(|e| graph_err(cfg, e))?;
    if opts.attention_mask {
        let m =
            b.g.input_float(ATTENTION_MASK, &[opts.batch_size, 1, 1, opts.seq_len])
                .map_err(|e| graph_err(cfg, e))?;
        b.attention_mask = Some(m);
    }
    let logits =
        cfg.family.model().build_logits(&mut b, cfg, opts).map_err(|e| build_err(cfg, e))?;
    Ok((b, logits))
}

/// HF's loss on `logits`: mean cross-entropy over labels ≠ −100 for language models (a causal
/// LM's labels arrive shifted: see [`EngineModel::feed`]) and token classification; the
/// problem type's loss for sequence classifiers.
fn add_loss(
    b: &mut Builder,
    cfg: &ModelConfig,
    opts: &GraphOptions,
    logits: TensorId,
) -> BResult<TensorId> {
    let (bs, t) = (opts.batch_size, opts.seq_len);
    if cfg.arch.is_classifier() {
        let problem = cfg.problem_type().map_err(ModelError::BadConfig)?;
        return b.classification_loss(logits, problem, bs);
    }
    let labels = b.g.input_ids(LABELS, &[bs, t])?; // (B, T)
    Ok(b.g.cross_entropy(logits, labels)?)
}

fn build_err(cfg: &ModelConfig, e: BuildError) -> ModelError {
    match e {
        BuildError::Graph(e) => graph_err(cfg, e),
        BuildError::Model(e) => e,
    }
}

/// The training graph of `cfg` (forward + loss + backward) for steps of `opts`.
pub fn build_training_graph(
    cfg: &ModelConfig,
    opts: &GraphOptions,
) -> Result<EngineModel, ModelError> {
    let (unoptimized, _) = build_forward_graph(cfg, opts)?;
    let (forward, mut pass_report) =
        passes::run_forward(&unoptimized, &opts.passes).map_err(|e| graph_err(cfg, e))?;
    let loss = forward.loss().expect("the builder sets the loss and passes keep it");
    let train = autodiff::backward(&forward, loss).map_err(|e| graph_err(cfg, e))?;
    let (graph, training_report) =
        passes::run_training(&train, &opts.passes).map_err(|e| graph_err(cfg, e))?;
    pass_report.extend(training_report);
    let loss = graph.loss().expect("a training graph has its loss");
    let params = graph
        .params()
        .iter()
        .map(|p| ParamSlot {
            name: p.name.clone(),
            shape: p.shape.clone(),
            offset: p.offset,
            len: p.len,
        })
        .collect();
    let task = Task::for_config(cfg);
    let num_labels = if cfg.arch.is_classifier() { cfg.num_labels() } else { 0 };
    Ok(EngineModel {
        arch: cfg.arch,
        batch_size: opts.batch_size,
        seq_len: opts.seq_len,
        unoptimized,
        forward,
        graph,
        loss,
        pass_report,
        params,
        pads: cfg.family.model().pads(),
        task,
        vocab_size: cfg.vocab_size(),
        num_labels,
        sliding_window: cfg.family.model().sliding_window(),
        fixed: std::sync::Arc::new(cfg.family.model().fixed_inputs(opts.seq_len)),
    })
}

impl EngineModel {
    /// Length of the flat parameter (and gradient) buffer: Ψ plus the zero pads that align
    /// every parameter ([`ortbench_engine::graph::PARAM_ALIGN_ELEMS`]).
    pub fn flat_len(&self) -> usize {
        self.graph.num_param_elems()
    }

    /// Parameters (Ψ), the pads excluded.
    pub fn num_params(&self) -> usize {
        self.graph.param_count()
    }

    /// The flat parameter buffer of `weights`: their tensors at the graph's offets in
    /// `param_specs` order, zero in the pads (looked up by name, so any order of
    /// `weights.tensors` works).
    pub fn flatten(&self, weights: &Weights) -> Result<Vec<f32>, ModelError> {
        let mut flat = vec![0.0; self.flat_len()];
        for (i, slot) in self.params.iter().enumerate() {
            let t = match weights.tensors.get(i) {
                Some(t) if t.name == slot.name => t,
                _ => weights.get(&slot.name).ok_or_else(|| {
                    ModelError::Weights(format!("weights have no '{}'", slot.name))
                })?,
            };
            if t.shape != slot.shape || t.data.len() != slot.len {
                return Err(ModelError::Weights(format!(
                    "'{}' has shape {:?} ({} values), the model needs {:?}",
                    slot.name,
                    t.shape,
                    t.data.len(),
                    slot.shape
                )));
            }
            flat[slot.offset..slot.offset + slot.len].copy_from_slice(&t.data);
        }
        Ok(flat)
    }

    /// Named tensors (HF names, `param_specs` order) from a flat parameter or gradient buffer.
    pub fn unflatten(&self, flat: &[f32]) -> Result<Weights, ModelError> {
        if flat.len() != self.flat_len() {
            return Err(ModelError::Weights(format!(
                "the flat buffer has {} values, the model's has {}",
                flat.len(),
                self.flat_len()
            )));
        }
        let tensors = self
            .params
            .iter()
            .map(|s| NamedTensor {
                name: s.name.clone(),
                shape: s.shape.clone(),
                data: flat[s.offset..s.offset + s.len].to_vec(),
            })
            .collect();
        Ok(Weights { tensors })
    }

    /// Every graph input for `batch`: ids, labels (a causal LM's shifted here), positions, token
    /// types and the padding masks.
    pub fn feed(&self, batch: &Batch) -> Result<Feed, ModelError> {
        self.feed_info().feed(&self.graph, batch)
    }

    fn feed_info(&self) -> FeedInfo {
        FeedInfo {
            arch: self.arch,
            batch_size: self.batch_size,
            seq_len: self.seq_len,
            pads: self.pads,
            task: self.task,
            vocab_size: self.vocab_size,
            sliding_window: self.sliding_window,
            fixed: self.fixed.clone(),
        }
    }

    /// Number of classes of a sequence classifier (0 for language models).
    pub fn num_labels(&self) -> usize {
        self.num_labels
    }

    /// One forward + backward on the engine's reference executor: writes every parameter's
    /// gradient into `grads` (flat layout) and returns the loss. `seed` seeds dropout.
    pub fn ref_train_step(
        &self,
        params: &[f32],
        batch: &Batch,
        seed: u64,
        grads: &mut [f32],
    ) -> Result<f32, ModelError> {
        let feed = self.feed(batch)?;
        RefExecutor::new(&self.graph)
            .train_step(params, &feed.inputs(), seed, grads)
            .map_err(|e| ModelError::Training(format!("engine step: {e}")))
    }
}

/// A model's inference graph (HF's eager forward up to the logits, no loss: see
/// [`build_inference_graph`]) on the reference executor: what evaluation and export use. The
/// parameters are the training model's flat buffer (the same `param_specs` layout).
pub struct InferenceModel {
    pub graph: Graph,
    /// (B, T, V) for language models, (B, num_labels) for classifiers.
    pub logits: TensorId,
    info: FeedInfo,
}

impl InferenceModel {
    /// The inference graph of `cfg` for batches of `opts` (dropout as the config says: set it
    /// to 0 for evaluation, as `model.eval()`).
    pub fn new(cfg: &ModelConfig, opts: &GraphOptions) -> Result<Self, ModelError> {
        let (graph, logits) = build_inference_graph(cfg, opts)?;
        let info = FeedInfo {
            arch: cfg.arch,
            batch_size: opts.batch_size,
            seq_len: opts.seq_len,
            pads: cfg.family.model().pads(),
            task: Task::for_config(cfg),
            vocab_size: cfg.vocab_size(),
            sliding_window: cfg.family.model().sliding_window(),
            fixed: std::sync::Arc::new(cfg.family.model().fixed_inputs(opts.seq_len)),
        };
        Ok(InferenceModel { graph, logits, info })
    }

    /// The graph's inputs for `batch` (its labels are not read).
    pub fn feed(&self, batch: &Batch) -> Result<Feed, ModelError> {
        self.info.feed(&self.graph, batch)
    }

    /// The logits of `batch` under `params`, row-major in the logits' shape.
    pub fn logits(&self, params: &[f32], batch: &Batch) -> Result<Vec<f32>, ModelError> {
        let feed = self.feed(batch)?;
        let values = RefExecutor::new(&self.graph)
            .run(params, &feed.inputs(), 0)
            .map_err(|e| ModelError::Training(format!("engine forward: {e}")))?;
        Ok(values.get(self.logits).expect("the logits are computed").to_vec())
    }
}

fn check_sizes(cfg: &ModelConfig, opts: &GraphOptions) -> Result<(), ModelError> {
    let (b, t) = (opts.batch_size, opts.seq_len);
    if b == 0 || t == 0 {
        return Err(ModelError::Data(format!(
            "batch size and sequence length must be positive, got {b}×{t}"
        )));
    }
    if let Some(limit) = cfg.position_limit().filter(|&l| t > l) {
        return Err(ModelError::Data(format!(
            "sequence length {t} is beyond the model's {limit} positions"
        )));
    }
    Ok(())
}

fn graph_err(cfg: &ModelConfig, e: GraphError) -> ModelError {
    ModelError::Unsupported(format!("the engine cannot build {}: {e}", cfg.arch.hf_name()))
}

/// A build failure: the engine rejected a graph, or the config asks for what we do not build.
pub(crate) enum BuildError {
    Graph(GraphError),
    Model(ModelError),
}

impl From<GraphError> for BuildError {
    fn from(e: GraphError) -> Self {
        BuildError::Graph(e)
    }
}

impl From<ModelError> for BuildError {
    fn from(e: ModelError) -> Self {
        BuildError::Model(e)
    }
}

pub(crate) type BResult<T> = std::result::Result<T, BuildError>;

/// The graph under construction and its parameters by HF name.
pub(crate) struct Builder {
    pub g: Graph,
    params: HashMap<String, TensorId>,
    /// The additive key-padding mask (B, 1, 1, T) every attention adds, when the graph has one.
    attention_mask: Option<TensorId>,
}

impl Builder {
    /// Declares every parameter of `cfg` in `param_specs` order: the flat buffer's layout.
    fn new(cfg: &ModelConfig, dtype: DType) -> Result<Self, GraphError> {
        let mut g = Graph::with_dtype(dtype);
        let mut params = HashMap::new();
        for spec in param_specs(cfg) {
            let t = g.param(&spec.name, &spec.shape)?;
            params.insert(spec.name, t);
        }
        Ok(Builder { g, params, attention_mask: None })
    }

    /// The additive key-padding mask (B, 1, 1, T), when the graph has one.
    pub fn attention_mask(&self) -> Option<TensorId> {
        self.attention_mask
    }

    /// The parameter `name` (a missing one is a bug of this module: the specs declare all).
    pub fn p(&self, name: &str) -> TensorId {
        *self.params.get(name).unwrap_or_else(|| panic!("param_specs declares no '{name}'"))
    }

    /// HF `nn.Linear` `{prefix}.weight` (out, in), `{prefix}.bias` (out): x·Wᵀ + b.
    // x: (…, in) -> (…, out)
    pub fn linear(&mut self, x: TensorId, prefix: &str) -> BResult<TensorId> {
        let (w, b) = (self.p(&format!("{prefix}.weight")), self.p(&format!("{prefix}.bias")));
        Ok(self.g.linear(x, w, Some(b))?)
    }

    /// GPT-2's `Conv1D`: weight stored (in, out), y = x·W + b.
    // x: (…, in) -> (…, out)
    pub fn conv1d(&mut self, x: TensorId, prefix: &str) -> BResult<TensorId> {
        let (w, b) = (self.p(&format!("{prefix}.weight")), self.p(&format!("{prefix}.bias")));
        let y = self.g.matmul(x, w, false, false)?;
        Ok(self.g.bias_add(y, b)?)
    }

    /// `nn.LayerNorm` over the last dim with `{prefix}.weight` and `{prefix}.bias`.
    // x: (…, C) -> (…, C)
    pub fn layer_norm(&mut self, x: TensorId, prefix: &str, eps: f64) -> BResult<TensorId> {
        let (w, b) = (self.p(&format!("{prefix}.weight")), self.p(&format!("{prefix}.bias")));
        Ok(self.g.layer_norm(x, w, b, eps as f32)?)
    }

    /// `nn.Dropout(p)`, a node even at p = 0 as HF keeps the module (`eliminate_dropout`
    /// removes it; a p = 0 site draws no RNG counters).
    pub fn dropout(&mut self, x: TensorId, p: f64) -> BResult<TensorId> {
        Ok(self.g.dropout(x, p as f32)?)
    }

    /// HF's eager attention (`eager_attention_forward` of modeling_bert / modeling_gpt2):
    /// `softmax(q·kᵀ / √D + mask [causal]) → dropout → ·v`, written op by op (the padding mask,
    /// when the graph has one, as the softmax's additive mask; HF combines it with the causal
    /// one); `fuse_attention` makes it one [`Op::Attention`](ortbench_engine::graph::Op::Attention).
    // q, k, v: (B, H, T, D) -> (B, H, T, D)
    pub fn eager_attention(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        causal: bool,
        dropout_p: f64,
    ) -> BResult<TensorId> {
        let scale = 1.0 / (self.g.shape(q)[3] as f32).sqrt();
        self.eager_attention_scaled(q, k, v, causal, (scale, None), dropout_p, self.attention_mask)
    }

    /// [`eager_attention`](Self::eager_attention) with the scores' `scale` (HF's `scaling`), an
    /// optional tanh soft-cap on them (Gemma 2's `softcap`, before the mask) and the additive
    /// `mask` (broadcast to (B, H, T, T)) in place of 1/√D and the graph's padding mask: a
    /// sliding-window layer's mask, Gemma's query_pre_attn_scalar^-½. `fuse_attention` makes a
    /// soft-capped chain one attention op too (its `softcap`).
    // q, k, v: (B, H, T, D) -> (B, H, T, D)
    #[allow(clippy::too_many_arguments)]
    pub fn eager_attention_scaled(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        causal: bool,
        (scale, softcap): (f32, Option<f64>),
        dropout_p: f64,
        mask: Option<TensorId>,
    ) -> BResult<TensorId> {
        let kt = self.g.transpose(k, 2, 3)?; // (B, H, D, T)
        let scores = self.g.matmul(q, kt, false, false)?; // (B, H, T, T)
        let scores = self.g.scale(scores, scale)?;
        let scores = match softcap {
            Some(cap) => self.softcap(scores, cap)?,
            None => scores,
        };
        let probs = self.g.softmax(scores, 1.0, causal, mask)?;
        let probs = self.dropout(probs, dropout_p)?;
        Ok(self.g.matmul(probs, v, false, false)?)
    }

    /// Tanh soft-capping as HF writes it (Gemma 2's scores and logits): cap · tanh(x / cap).
    pub fn softcap(&mut self, x: TensorId, cap: f64) -> BResult<TensorId> {
        let x = self.g.scale(x, (1.0 / cap) as f32)?;
        let x = self.g.tanh(x)?;
        Ok(self.g.scale(x, cap as f32)?)
    }

    /// The loss of a sequence classifier's `logits` (B, L) as HF's `…ForSequenceClassification`
    /// computes it for `problem`, written with the engine's ops:
    /// - single-label: cross-entropy against (B,) labels, mean over rows;
    /// - multi-label: BCEWithLogits against (B, L) 0/1 labels, mean over B·L — each logit x as the
    ///   two-class logits (0, x), whose cross-entropy with label y ∈ {0, 1} is exactly
    ///   log(1 + e^x) − y·x (the fused log-sum-exp keeps it stable);
    /// - regression (L = 1): MSE against (B, 1) float targets, mean over rows — d = x − y, then
    ///   dᵀd (a K = B matmul) / B.
    // logits: (B, L) -> ()
    pub fn classification_loss(
        &mut self,
        logits: TensorId,
        problem: ProblemType,
        bs: usize,
    ) -> BResult<TensorId> {
        let l = self.g.shape(logits)[1];
        Ok(match problem {
            ProblemType::SingleLabel => {
                let labels = self.g.input_ids(LABELS, &[bs])?; // (B)
                self.g.cross_entropy(logits, labels)?
            }
            ProblemType::MultiLabel => {
                let x = self.g.reshape(logits, &[bs, l, 1])?; // (B, L, 1)
                let zero = self.g.fill(&[bs, l, 1], 0.0);
                let pair = self.g.concat(&[zero, x])?; // (B, L, 2)
                let labels = self.g.input_ids(LABELS, &[bs, l])?; // (B, L)
                self.g.cross_entropy(pair, labels)?
            }
            ProblemType::Regression => {
                let y = self.g.input_float(TARGETS, &[bs, 1])?; // (B, 1)
                let neg = self.g.scale(y, -1.0)?;
                let d = self.g.add(logits, neg)?; // (B, 1)
                let sq = self.g.matmul(d, d, true, false)?; // (1, 1) = Σ d²
                let mean = self.g.scale(sq, 1.0 / bs as f32)?;
                self.g.reshape(mean, &[])?
            }
        })
    }

    /// HF's `ACT2FN[name]`.
    pub fn activation(&mut self, x: TensorId, act: Activation) -> BResult<TensorId> {
        let approx = match act {
            Activation::GeluErf => GeluApprox::Erf,
            Activation::GeluTanh => GeluApprox::Tanh,
            Activation::Silu => return Ok(self.g.apply(UnaryFn::Silu, x)?),
            Activation::Relu => return Ok(self.g.apply(UnaryFn::Relu, x)?),
        };
        Ok(self.g.gelu(x, approx)?)
    }

    /// The view + transpose of HF's attention: (B, T, H·D) → (B, H, T, D).
    pub fn split_heads(&mut self, x: TensorId, heads: usize) -> BResult<TensorId> {
        let s = self.g.shape(x).to_vec();
        let (b, t, c) = (s[0], s[1], s[2]);
        let x = self.g.reshape(x, &[b, t, heads, c / heads])?;
        Ok(self.g.permute(x, &[0, 2, 1, 3])?)
    }

    /// The inverse: (B, H, T, D) → (B, T, H·D).
    pub fn merge_heads(&mut self, x: TensorId) -> BResult<TensorId> {
        let s = self.g.shape(x).to_vec();
        let (b, h, t, d) = (s[0], s[1], s[2], s[3]);
        let x = self.g.permute(x, &[0, 2, 1, 3])?;
        Ok(self.g.reshape(x, &[b, t, h * d])?)
    }

    /// The same values as `x`, with no gradient flowing back (torch's `.detach()`).
    ///
    /// The engine has no stop-gradient op; a LayerNorm's row-mean output is not differentiable,
    /// and the mean of a size-1 row is the value itself, exactly (sum of one term, times 1). So:
    /// reshape to (…, 1), LayerNorm, take the mean. Its `y` (all zeros) is unused.
    // x: (…) -> (…)
    pub fn stop_gradient(&mut self, x: TensorId) -> BResult<TensorId> {
        let shape = self.g.shape(x).to_vec();
        let mut col = shape.clone();
        col.push(1);
        let x1 = self.g.reshape(x, &col)?;
        let (one, zero) = (self.g.fill(&[1], 1.0), self.g.fill(&[1], 0.0));
        // eps = 1 keeps rstd finite for the zero variance of a size-1 row.
        self.g.layer_norm(x1, one, zero, 1.0)?;
        let node = self.g.nodes().last().expect("layer_norm added a node");
        debug_assert_eq!(self.g.shape(node.outputs[1]), &shape[..]);
        Ok(node.outputs[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DataSource;
    use crate::family::Family;
    use crate::spec::builtin_config;
    use ortbench_engine::graph::Op;

    fn tiny_classifier(pad: Option<i64>) -> ModelConfig {
        let mut raw = builtin_config("tiny-bert").unwrap().raw;
        raw["architectures"] = serde_json::json!(["BertForSequenceClassification"]);
        raw["num_labels"] = serde_json::json!(3);
        raw["pad_token_id"] = serde_json::json!(pad);
        let mut cfg = ModelConfig::from_value(raw, "test").unwrap();
        cfg.set_dropout(0.0);
        cfg
    }

    #[test]
    fn every_builtin_config_builds_with_the_param_specs_layout() {
        use ortbench_engine::graph::PARAM_ALIGN_ELEMS;
        for name in crate::spec::BUILTIN_NAMES {
            let cfg = builtin_config(name).unwrap();
            let m = build_training_graph(&cfg, &GraphOptions::new(2, 8)).unwrap();
            let specs = param_specs(&cfg);
            assert_eq!(m.params.len(), specs.len(), "{name}");
            // In order, each at the first aligned offset after the previous one.
            let mut end = 0;
            for (slot, spec) in m.params.iter().zip(&specs) {
                assert_eq!((&slot.name, &slot.shape), (&spec.name, &spec.shape), "{name}");
                assert_eq!(
                    slot.offset % PARAM_ALIGN_ELEMS,
                    0,
                    "{name}: {} is not aligned",
                    slot.name
                );
                assert!(
                    slot.offset >= end && slot.offset - end < PARAM_ALIGN_ELEMS,
                    "{name}: {} leaves a gap",
                    slot.name
                );
                end = slot.offset + slot.len;
            }
            assert_eq!(end, m.flat_len(), "{name}");
            assert_eq!(m.num_params(), crate::params::param_count(&cfg), "{name}");
            // The decay runs tile the flat buffer, pads included, as the optimizer requires.
            let segs = trainer::decay_segments(&cfg, &m);
            assert_eq!(
                (segs[0].start, segs.iter().map(|s| s.len).sum::<usize>()),
                (0, m.flat_len()),
                "{name}"
            );
            assert!(
                segs.windows(2)
                    .all(|w| w[0].start + w[0].len == w[1].start && w[0].decay != w[1].decay),
                "{name}: {segs:?}"
            );
            // Every parameter gets a gradient (the pooler-less MLM uses all it declares).
            for (i, p) in m.graph.params().iter().enumerate() {
                assert!(m.graph.param_grad(i).is_some(), "{name}: {} gets no gradient", p.name);
            }
        }
    }

    #[test]
    fn flatten_and_unflatten_round_trip() {
        // 999 tokens: the MLM head's bias (999 values) leaves the next parameter unaligned, so
        // the flat buffer has a pad (the tiny configs' own shapes are all multiples of 8).
        let mut cfg = builtin_config("tiny-bert").unwrap();
        if let Family::Bert(c) = &mut cfg.family {
            c.vocab_size = 999;
        }
        let m = build_training_graph(&cfg, &GraphOptions::new(1, 4)).unwrap();
        let w = Weights::init(&cfg, 3);
        let flat = m.flatten(&w).unwrap();
        assert_eq!(flat.len(), m.flat_len());
        assert!(m.flat_len() > m.num_params(), "a vocabulary of 999 needs a pad");
        assert_eq!(m.unflatten(&flat).unwrap().tensors, w.tensors);
        // The pads are zero, and Weights::flat lays the buffer out the same way.
        for pad in m.graph.param_pads() {
            assert!(flat[pad].iter().all(|v| *v == 0.0));
        }
        assert_eq!(w.flat(&cfg).unwrap(), flat);
        // Order-independent: reversed tensors flatten the same.
        let mut rev = w.clone();
        rev.tensors.reverse();
        assert_eq!(m.flatten(&rev).unwrap(), flat);
        let mut bad = w.clone();
        bad.tensors[1].shape = vec![1];
        let e = m.flatten(&bad).unwrap_err().to_string();
        assert!(e.contains(&w.tensors[1].name), "{e}");
        assert!(m.unflatten(&flat[1..]).is_err());
    }

    /// HF's create_position_ids_from_input_ids(torch.tensor([[0, 5, 1, 7, 1], [1, 1, 4, 9, 8]]), 1):
    /// [[2, 3, 1, 4, 1], [1, 1, 2, 3, 4]] — a pad inside the text keeps the count.
    #[test]
    fn positions_after_pad_are_hf_robertas() {
        let got = positions_after_pad(&[0, 5, 1, 7, 1, 1, 1, 4, 9, 8], 5, 1);
        assert_eq!(got, vec![2, 3, 1, 4, 1, 1, 1, 2, 3, 4]);
    }

    #[test]
    fn feed_shifts_gpt2_labels_and_masks_bert_padding() {
        let cfg = builtin_config("tiny-gpt2").unwrap();
        let m = build_training_graph(&cfg, &GraphOptions::new(2, 3)).unwrap();
        let batch = Batch {
            batch_size: 2,
            seq_len: 3,
            input_ids: vec![1, 2, 3, 4, 5, 6],
            labels: vec![1, 2, 3, 4, 5, 6],
            targets: None,
            attention_mask: None,
        };
        let feed = m.feed(&batch).unwrap();
        let get = |f: &Feed, n: &str| {
            f.entries.iter().find(|(k, _)| k == n).map(|(_, d)| d.clone()).unwrap()
        };
        assert_eq!(get(&feed, LABELS), FeedData::Ids(vec![2, 3, -100, 5, 6, -100]));
        assert_eq!(get(&feed, POSITION_IDS), FeedData::Ids(vec![0, 1, 2]));
        let wrong = Batch { seq_len: 2, input_ids: vec![1; 4], labels: vec![1; 4], ..batch };
        assert!(m.feed(&wrong).unwrap_err().to_string().contains("built for batches of 2×3"));

        let cfg = tiny_classifier(Some(0));
        let m = build_training_graph(&cfg, &GraphOptions::new(1, 3)).unwrap();
        let batch = Batch {
            batch_size: 1,
            seq_len: 3,
            input_ids: vec![5, 0, 7],
            labels: vec![2],
            targets: None,
            attention_mask: None,
        };
        let feed = m.feed(&batch).unwrap();
        assert_eq!(get(&feed, NOT_PAD_MASK), FeedData::Floats(vec![1.0, 0.0, 1.0]));
        assert_eq!(get(&feed, PAD_MASK), FeedData::Floats(vec![0.0, 1.0, 0.0]));
        assert_eq!(get(&feed, TOKEN_TYPE_IDS), FeedData::Ids(vec![0; 3]));
        let out_of_vocab = Batch { input_ids: vec![5, 1000, 7], ..batch };
        assert!(m.feed(&out_of_vocab).unwrap_err().to_string().contains("outside the vocabulary"));
    }

    /// The padding_idx construction changes no value and only the padding row's gradient:
    /// against the same model without a pad token, the loss and every other gradient are
    /// bit-identical, and the padding row's gradient is exactly zero (nonzero without it).
    #[test]
    fn padding_row_gets_no_gradient_and_nothing_else_changes() {
        let (b, t) = (2, 8);
        let (with_pad, without) = (tiny_classifier(Some(0)), tiny_classifier(None));
        let mut batch = DataSource::synthetic(&with_pad, b, t, 1).unwrap().batch(0);
        batch.input_ids[3] = 0;
        batch.input_ids[t + 5] = 0;
        let w = Weights::init(&without, 0);
        let run = |cfg: &ModelConfig| {
            let m = build_training_graph(cfg, &GraphOptions::new(b, t)).unwrap();
            let params = m.flatten(&w).unwrap();
            let mut grads = vec![f32::NAN; params.len()];
            let loss = m.ref_train_step(&params, &batch, 0, &mut grads).unwrap();
            (loss, m.unflatten(&grads).unwrap())
        };
        let ((l_pad, g_pad), (l_raw, g_raw)) = (run(&with_pad), run(&without));
        assert_eq!(l_pad.to_bits(), l_raw.to_bits());
        let c = with_pad.hidden_size();
        for (p, r) in g_pad.tensors.iter().zip(&g_raw.tensors) {
            if p.name == "bert.embeddings.word_embeddings.weight" {
                assert!(p.data[..c].iter().all(|&v| v == 0.0), "padding row has a gradient");
                assert!(
                    r.data[..c].iter().any(|&v| v != 0.0),
                    "without padding_idx row 0 must get one"
                );
                assert_eq!(p.data[c..], r.data[c..]);
            } else {
                assert_eq!(p.data, r.data, "{}", p.name);
            }
        }
    }

    /// The inference graph's logits give the training graph's loss (cross-entropy computed here
    /// in f64 from them, within 1e-6 relative), for a padded classifier and the MLM.
    #[test]
    fn inference_logits_give_the_training_loss() {
        for cfg in [tiny_classifier(Some(0)), builtin_config("tiny-bert").unwrap()] {
            let mut cfg = cfg;
            cfg.set_dropout(0.0);
            let (b, t) = (3, 8);
            let opts = GraphOptions::new(b, t).with_attention_mask(true);
            let mut batch = DataSource::synthetic(&cfg, b, t, 4).unwrap().batch(0);
            let mut mask = vec![1i64; b * t];
            mask[t - 3..t].fill(0);
            batch.attention_mask = Some(mask);
            let train = build_training_graph(&cfg, &opts).unwrap();
            let params = train.flatten(&Weights::init(&cfg, 2)).unwrap();
            let mut g = vec![0.0; params.len()];
            let loss = train.ref_train_step(&params, &batch, 0, &mut g).unwrap() as f64;
            let inf = InferenceModel::new(&cfg, &opts).unwrap();
            let logits = inf.logits(&params, &batch).unwrap();
            let n = inf.graph.shape(inf.logits).last().copied().unwrap();
            let (mut sum, mut count) = (0.0f64, 0usize);
            for (row, &label) in logits.chunks_exact(n).zip(&batch.labels) {
                if label == crate::IGNORE_INDEX {
                    continue;
                }
                let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
                sum += lse - row[label as usize] as f64;
                count += 1;
            }
            let want = sum / count as f64;
            assert!((want - loss).abs() / loss < 1e-6, "{}: {want} vs {loss}", cfg.arch.hf_name());
        }
    }

    #[test]
    fn unsupported_and_bad_sizes_are_clear_errors() {
        let mut raw = tiny_classifier(Some(0)).raw;
        raw["problem_type"] = serde_json::json!("ordinal");
        let e = ModelConfig::from_value(raw.clone(), "test").unwrap_err();
        assert!(
            matches!(e, ModelError::BadConfig(_))
                && e.to_string().contains("problem_type 'ordinal'"),
            "{e}"
        );
        raw["problem_type"] = serde_json::json!("regression");
        let e = ModelConfig::from_value(raw, "test").unwrap_err().to_string();
        assert!(e.contains("regression with num_labels = 3"), "{e}");
        let mut raw = builtin_config("tiny-gpt2").unwrap().raw;
        raw["architectures"] = serde_json::json!(["GPT2ForSequenceClassification"]);
        let cfg = ModelConfig::from_value(raw, "test").unwrap();
        let e = build_training_graph(&cfg, &GraphOptions::new(2, 8)).unwrap_err().to_string();
        assert!(e.contains("without a pad_token_id"), "{e}");
        let gpt2 = builtin_config("tiny-gpt2").unwrap();
        let e = build_training_graph(&gpt2, &GraphOptions::new(2, 65)).unwrap_err().to_string();
        assert!(e.contains("beyond the model's 64 positions"), "{e}");
        let e = build_training_graph(&gpt2, &GraphOptions::new(2, 1)).unwrap_err().to_string();
        assert!(e.contains("at least 2"), "{e}");
    }

    #[test]
    fn dropout_sites_exist_only_when_p_is_positive() {
        let count = |cfg: &ModelConfig| {
            let g = build_training_graph(cfg, &GraphOptions::new(1, 4)).unwrap().forward;
            let drop = g.nodes().iter().filter(|n| matches!(n.op, Op::Dropout(_))).count();
            let attn = g
                .nodes()
                .iter()
                .filter(|n| matches!(n.op, Op::Attention(ortbench_engine::graph::op::Attention { dropout_p, .. }) if dropout_p > 0.0))
                .count();
            (drop, attn)
        };
        let mut gpt2 = builtin_config("tiny-gpt2").unwrap();
        // embd + 2 resid per block; attention dropout in each block.
        assert_eq!(count(&gpt2), (1 + 2 * 2, 2));
        gpt2.set_dropout(0.0);
        assert_eq!(count(&gpt2), (0, 0));
        let bert = builtin_config("tiny-bert").unwrap();
        assert_eq!(count(&bert), (1 + 2 * 2, 2));
    }

    /// The builders write HF's eager form and the passes make the fused graph: with every
    /// default pass the tiny models' training graphs have one fused attention per layer, fused
    /// linears and add+LayerNorms, no p = 0 dropout; with none they keep the eager ops; and both
    /// compute the same loss and gradients (reference executor, f32: loss within 1e-5
    /// relative, each gradient within 1e-5·max|g| + 1e-7·G, G the largest gradient — summation
    /// order differs, e.g. the fused attention's softmax).
    #[test]
    fn passes_fuse_the_eager_graphs_and_keep_the_numbers() {
        for name in ["tiny-bert", "tiny-gpt2"] {
            for dropout in [None, Some(0.0)] {
                let mut cfg = builtin_config(name).unwrap();
                if let Some(p) = dropout {
                    cfg.set_dropout(p);
                }
                let build = |passes| {
                    build_training_graph(&cfg, &GraphOptions::new(2, 8).with_passes(passes))
                        .unwrap()
                };
                let (opt, raw) = (build(PassConfig::all()), build(PassConfig::none()));
                let (co, cr) = (passes::op_counts(&opt.graph), passes::op_counts(&raw.graph));
                println!(
                    "{name} dropout {dropout:?}: {}\nall passes {co:?}\nno passes  {cr:?}",
                    opt.pass_report
                );
                let layers = cfg.num_layers();
                assert_eq!(co["attention"], layers, "{name}");
                assert_eq!((cr.get("attention"), cr["softmax"]), (None, layers), "{name}");
                assert!(
                    co["linear"] >= 4 * layers && co["add_layernorm"] >= 2 * layers - 1,
                    "{name}: {co:?}"
                );
                // The LM head and its loss: one node giving the loss and the gradients, and
                // no (…, V) logits tensor left in the training graph.
                assert_eq!(
                    (co.get("linear_cross_entropy_backward"), co.get("cross_entropy")),
                    (Some(&1), None),
                    "{name}: {co:?}"
                );
                let v = cfg.vocab_size();
                let widest = opt.graph.tensors().iter().filter(|t| t.shape.last() == Some(&v));
                assert!(widest.clone().all(|t| t.shape.len() <= 2), "{name}: logits left");
                let p_dropouts = opt
                    .graph
                    .nodes()
                    .iter()
                    .filter(|n| matches!(n.op, Op::Dropout(ortbench_engine::graph::op::Dropout { p, .. }) if p == 0.0))
                    .count();
                assert_eq!(p_dropouts, 0, "{name}");
                assert_eq!(opt.params, raw.params);
                let w = Weights::init(&cfg, 1);
                let params = opt.flatten(&w).unwrap();
                let batch = DataSource::synthetic(&cfg, 2, 8, 3).unwrap().batch(0);
                let step = |m: &EngineModel| {
                    let mut g = vec![f32::NAN; params.len()];
                    (m.ref_train_step(&params, &batch, 9, &mut g).unwrap(), g)
                };
                let ((lo, go), (lr, gr)) = (step(&opt), step(&raw));
                assert!((lo - lr).abs() <= 1e-5 * lr.abs(), "{name}: loss {lo} vs {lr}");
                let big = gr.iter().fold(0f32, |m, v| m.max(v.abs()));
                for s in &opt.params {
                    let (a, b) = (&go[s.offset..s.offset + s.len], &gr[s.offset..s.offset + s.len]);
                    let max_g = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let max_d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                    assert!(
                        max_d <= 1e-5 * max_g + 1e-7 * big,
                        "{name}: {} differs by {max_d:e} (max {max_g:e})",
                        s.name
                    );
                }
            }
        }
    }
}
