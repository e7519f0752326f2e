//! Export of a model's inference graph as ONNX: what an HF user feeds in, the logits out.
//!
//! The exported model takes HF's inputs — `input_ids` and the 0/1 `attention_mask`, both
//! int64 `[batch, sequence]` with those two axes dynamic — and returns `logits`
//! (`[batch, sequence, vocab]` for the LM heads, `[batch, num_labels]` for the classifiers).
//! The graph is the engine's unoptimized inference graph ([`InferenceModel`], HF's eager
//! forward with dropout off, as `model.eval()`), translated node by node; the inputs the engine
//! is fed ([`FeedInfo::feed`](crate::graph)) are computed inside the ONNX graph from the two
//! user inputs, and the parameters become initializers under their HF names.
//!
//! Dynamic axes: engine graphs have static shapes, so the graph is built at five probe sizes
//! ([`PROBES`]); their node lists correspond one to one, and every size an op needs at run time
//! (Reshape targets, Split sizes, Fill shapes) is fitted across the probes as
//! `k + b·batch + t·sequence + bt·batch·sequence` with integer coefficients (four probes
//! determine it, the fifth checks it) and computed in the graph from `Shape(input_ids)`. A size
//! that is not of that form, an op with no mapping, or a dropout that is not the identity is an
//! error naming the node, never a silent wrong export.
//!
//! ```no_run
//! # use ortbench_models::{onnx::export_onnx, graph::{build_training_graph, GraphOptions}, spec::builtin_config, Weights};
//! # fn main() -> Result<(), ortbench_models::ModelError> {
//! let cfg = builtin_config("tiny-gpt2")?;
//! let params = build_training_graph(&cfg, &GraphOptions::new(1, 8))?.flatten(&Weights::init(&cfg, 0))?;
//! let report = export_onnx(&cfg, &params, "tiny-gpt2.onnx".as_ref())?;
//! println!("{report}");
//! # Ok(()) }
//! ```
//!
//! Opset 17 (the first with `LayerNormalization`), IR version 8 (the IR of opset 17, ONNX 1.12):
//! both run on every onnxruntime since 1.12. `scripts/onnx-check.py` runs an export on
//! onnxruntime; `models/tests/onnx.rs` checks its logits against the engine's.

mod proto;

use ortbench_engine::graph::op::{
    Binary, Dropout, Fill, Gelu, LayerNorm, MatMul, Permute, RmsNorm, Rotary, Scale, Softmax,
    Split, Unary,
};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use ortbench_engine::graph::{GeluApprox, Graph, Op, TensorId, TensorKind};
use ortbench_engine::ops::pointwise::{BinaryFn, UnaryFn};
use prost::Message;

use crate::config::ModelConfig;
use crate::family::Pads;
use crate::graph::{
    GraphOptions, InferenceModel, ATTENTION_MASK, INPUT_IDS, LAST_TOKEN, NOT_PAD_MASK, PAD_MASK,
    POSITION_IDS, POSITION_IDS_AFTER_PAD, TOKEN_TYPE_IDS,
};
use crate::ModelError;
use proto::tensor_shape_proto::{dimension, Dimension};
use proto::{
    type_proto, AttributeProto, AttributeType, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};

/// The ai.onnx operator set the export targets.
pub const OPSET: i64 = 17;
/// The IR version that goes with [`OPSET`] (onnx/docs/Versioning.md: opset 17 ↔ IR 8).
pub const IR_VERSION: i64 = 8;
/// The dynamic axes' names, as `torch.onnx.export(dynamic_axes=…)` users name them.
pub const BATCH: &str = "batch";
pub const SEQUENCE: &str = "sequence";
/// The user-facing inputs and the output.
pub const ATTENTION_MASK_INPUT: &str = "attention_mask";
pub const LOGITS: &str = "logits";

/// √(2/π) as engine/src/ops/gelu.rs rounds it (f64, then to the compute type).
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// The (batch, sequence) sizes the graph is built at to find how its sizes depend on the two
/// dynamic axes. The first four are a 2×2 design (batch 2|3 × sequence 5|7) that determines
/// the four coefficients; the fifth, off that grid, checks the fit.
pub const PROBES: [(usize, usize); 5] = [(2, 5), (3, 5), (2, 7), (3, 7), (4, 6)];

/// What an export wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct OnnxReport {
    pub path: PathBuf,
    /// Size of the .onnx file.
    pub bytes: usize,
    /// The HF architecture exported.
    pub architecture: String,
    /// ONNX nodes in the graph (the derived inputs included).
    pub onnx_nodes: usize,
    /// Parameters written as initializers, and their values.
    pub initializers: usize,
    pub param_values: usize,
    /// Engine nodes exported, by op (the dead ones — e.g. the unused `y` of the stop-gradient
    /// LayerNorm — are not exported).
    pub engine_ops: BTreeMap<String, usize>,
    /// The logits' shape as declared: `batch`, `sequence` or a fixed size per axis.
    pub logits_shape: Vec<String>,
}

impl fmt::Display for OnnxReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} as ONNX (opset {OPSET}, IR {IR_VERSION}), {} nodes from {} engine nodes, {} initializers ({} values), {} bytes; logits [{}]",
            self.path.display(),
            self.architecture,
            self.onnx_nodes,
            self.engine_ops.values().sum::<usize>(),
            self.initializers,
            self.param_values,
            self.bytes,
            self.logits_shape.join(", ")
        )
    }
}

/// Exports `cfg`'s inference graph with the flat parameters `params` (the training model's
/// `param_specs` layout, e.g. `EngineModel::flatten`) to `path` as an ONNX model; see the
/// module docs for its inputs and output. Dropout is off whatever `cfg` says (the export is
/// the model in eval mode). The file is written to a temporary name and renamed.
pub fn export_onnx(
    cfg: &ModelConfig,
    params: &[f32],
    path: &Path,
) -> Result<OnnxReport, ModelError> {
    let (bytes, mut report) = onnx_bytes(cfg, params)?;
    let tmp = path.with_extension("onnx.tmp");
    std::fs::write(&tmp, &bytes)
        .map_err(|e| ModelError::Weights(format!("cannot write {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| ModelError::Weights(format!("cannot write {}: {e}", path.display())))?;
    report.path = path.to_path_buf();
    Ok(report)
}

/// The serialized ONNX model of [`export_onnx`] (its report's `path` is empty).
pub fn onnx_bytes(cfg: &ModelConfig, params: &[f32]) -> Result<(Vec<u8>, OnnxReport), ModelError> {
    let (model, mut report) = onnx_model(cfg, params)?;
    // protobuf's 2 GiB message limit; models beyond it need ONNX's external data (not written).
    let len = model.encoded_len();
    if len > i32::MAX as usize {
        return Err(ModelError::Unsupported(format!(
            "the ONNX model of {} would be {len} bytes, over protobuf's 2 GiB limit; exporting weights as external data is not implemented",
            cfg.arch.hf_name()
        )));
    }
    report.bytes = len;
    Ok((model.encode_to_vec(), report))
}

fn onnx_model(cfg: &ModelConfig, params: &[f32]) -> Result<(ModelProto, OnnxReport), ModelError> {
    let mut cfg = cfg.clone();
    cfg.set_dropout(0.0);
    let arch = cfg.arch.hf_name();
    let unsupported =
        |msg: String| ModelError::Unsupported(format!("ONNX export of {arch}: {msg}"));
    let family = cfg.family.model();
    if !family.tables_slice_by_length() {
        return Err(unsupported(
            "dynamic and longrope rope scaling have no ONNX export yet: their frequencies depend on the sequence length, and the exported tables are sliced from the longest".into(),
        ));
    }
    if let Some(w) = family.sliding_window() {
        // The engine builds the window's mask only where it bites (T > window); the probes'
        // sequences are shorter, so an export would read keys beyond the window at run time.
        return Err(unsupported(format!(
            "sliding-window attention (window {w}) has no ONNX export yet: the exported graph would attend beyond the window at sequences longer than {w}"
        )));
    }
    // Tables that depend on the sequence length only (rotary cos/sin): computed once at the
    // model's every position, sliced to the run's T in the graph.
    let fixed = family.fixed_inputs(cfg.max_positions());
    let probes = Probes::build(&cfg)?;
    probes.check_structure().map_err(unsupported)?;
    let g = probes.graph();
    if params.len() != g.num_param_elems() {
        return Err(ModelError::Weights(format!(
            "the flat parameter buffer has {} values, {arch} has {}",
            params.len(),
            g.num_param_elems()
        )));
    }
    let pads = cfg.family.model().pads();
    let mut ex = Exporter::new(&probes, fixed, cfg.max_positions());
    ex.export(&pads).map_err(unsupported)?;
    let Exporter { out, engine_ops, .. } = ex;
    let mut initializer = out.inits;

    // Parameters under their HF names; one the live graph does not read (none in the four
    // architectures) is left out, as onnxruntime would drop it.
    let live_params: Vec<_> = g.params().iter().filter(|p| out.used.contains(&p.name)).collect();
    let param_values = live_params.iter().map(|p| p.len).sum();
    let initializers = live_params.len();
    for p in live_params {
        initializer.push(tensor_f32(&p.name, &p.shape, &params[p.offset..p.offset + p.len]));
    }

    let logits_dims =
        probes.dims(probes.logits).map_err(|e| unsupported(format!("logits: {e}")))?;
    let logits_shape: Vec<Dimension> = logits_dims
        .iter()
        .map(|d| match *d {
            d if d == Dim::BATCH => Ok(dim_param(BATCH)),
            d if d == Dim::SEQUENCE => Ok(dim_param(SEQUENCE)),
            d => match d.as_const() {
                Some(n) => {
                    Ok(Dimension { value: Some(dimension::Value::DimValue(n)), denotation: None })
                }
                None => Err(unsupported(format!(
                    "the logits have an axis of size {d}, neither fixed nor {BATCH} nor {SEQUENCE}"
                ))),
            },
        })
        .collect::<Result<_, _>>()?;
    let report = OnnxReport {
        path: PathBuf::new(),
        bytes: 0,
        architecture: arch.to_string(),
        onnx_nodes: out.nodes.len(),
        initializers,
        param_values,
        engine_ops: engine_ops.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        logits_shape: logits_shape
            .iter()
            .map(|d| match &d.value {
                Some(dimension::Value::DimParam(s)) => s.clone(),
                Some(dimension::Value::DimValue(n)) => n.to_string(),
                None => "?".into(),
            })
            .collect(),
    };
    let user_input =
        |name: &str| value_info(name, proto::INT64, vec![dim_param(BATCH), dim_param(SEQUENCE)]);
    let graph = GraphProto {
        node: out.nodes,
        name: Some(arch.to_string()),
        initializer,
        doc_string: Some(format!(
            "{arch}: the ortbench engine's inference graph (HF eager forward, eval mode)"
        )),
        input: vec![user_input(INPUT_IDS), user_input(ATTENTION_MASK_INPUT)],
        output: vec![value_info(LOGITS, proto::FLOAT, logits_shape)],
        value_info: vec![],
    };
    let model = ModelProto {
        ir_version: Some(IR_VERSION),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(OPSET),
        }],
        producer_name: Some("ortbench".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        domain: None,
        model_version: None,
        doc_string: None,
        graph: Some(graph),
        metadata_props: vec![StringStringEntryProto {
            key: Some("architecture".into()),
            value: Some(arch.into()),
        }],
    };
    Ok((model, report))
}

// ------------------------------------------------------------------------------- sizes

/// A size as a function of the dynamic axes: k + b·batch + t·sequence + bt·batch·sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Dim {
    k: i64,
    b: i64,
    t: i64,
    bt: i64,
}

impl Dim {
    const BATCH: Dim = Dim { k: 0, b: 1, t: 0, bt: 0 };
    const SEQUENCE: Dim = Dim { k: 0, b: 0, t: 1, bt: 0 };

    fn eval(self, b: usize, t: usize) -> i64 {
        let (b, t) = (b as i64, t as i64);
        self.k + self.b * b + self.t * t + self.bt * b * t
    }

    fn as_const(self) -> Option<i64> {
        (self.b == 0 && self.t == 0 && self.bt == 0).then_some(self.k)
    }

    /// The size whose values at [`PROBES`] are `v`, if it has the form (integer coefficients).
    fn fit(v: &[i64]) -> Option<Dim> {
        let [(b0, t0), (b1, _), (_, t1), ..] = PROBES;
        let (db, dt) = ((b1 - b0) as i64, (t1 - t0) as i64);
        let exact = |num: i64, den: i64| (num % den == 0).then_some(num / den);
        // The batch slope at each sequence length is b + bt·T; its change over T gives bt.
        let (s0, s1) = (exact(v[1] - v[0], db)?, exact(v[3] - v[2], db)?);
        let bt = exact(s1 - s0, dt)?;
        let b = s0 - bt * t0 as i64;
        let t = exact(v[2] - v[0], dt)? - bt * b0 as i64;
        let k = v[0] - b * b0 as i64 - t * t0 as i64 - bt * (b0 * t0) as i64;
        let d = Dim { k, b, t, bt };
        PROBES.iter().zip(v).all(|(&(pb, pt), &x)| d.eval(pb, pt) == x).then_some(d)
    }
}

impl fmt::Display for Dim {
    /// `64·sequence − 64`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let terms =
            [(self.bt, "batch·sequence"), (self.b, BATCH), (self.t, SEQUENCE), (self.k, "")];
        let mut first = true;
        for (c, v) in terms.into_iter().filter(|(c, _)| *c != 0) {
            let sign = match (first, c < 0) {
                (true, true) => "-",
                (true, false) => "",
                (false, true) => " − ",
                (false, false) => " + ",
            };
            let m = c.unsigned_abs();
            match (m, v.is_empty()) {
                (_, true) => write!(f, "{sign}{m}")?,
                (1, false) => write!(f, "{sign}{v}")?,
                (_, false) => write!(f, "{sign}{m}·{v}")?,
            }
            first = false;
        }
        if first {
            f.write_str("0")?;
        }
        Ok(())
    }
}

/// The inference graph at every probe size, and its logits (the same tensor in each).
struct Probes {
    graphs: Vec<Graph>,
    logits: TensorId,
}

impl Probes {
    fn build(cfg: &ModelConfig) -> Result<Self, ModelError> {
        let max_t = PROBES.iter().map(|p| p.1).max().unwrap_or(0);
        if cfg.max_positions() < max_t {
            return Err(ModelError::Unsupported(format!(
                "ONNX export of {} builds the graph at sequence lengths up to {max_t} to find its dynamic sizes, beyond the model's {} positions",
                cfg.arch.hf_name(),
                cfg.max_positions()
            )));
        }
        let models = PROBES
            .iter()
            .map(|&(b, t)| {
                InferenceModel::new(cfg, &GraphOptions::new(b, t).with_attention_mask(true))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let logits = models[0].logits;
        if models.iter().any(|m| m.logits != logits) {
            return Err(ModelError::Unsupported(format!(
                "ONNX export of {}: the graphs built at the probe sizes have different logits tensors",
                cfg.arch.hf_name()
            )));
        }
        Ok(Probes { graphs: models.into_iter().map(|m| m.graph).collect(), logits })
    }

    fn graph(&self) -> &Graph {
        &self.graphs[0]
    }

    /// The probes' graphs are one graph at different sizes: the same nodes over the same
    /// tensors with the same ranks and ops, only sizes differing.
    fn check_structure(&self) -> Result<(), String> {
        let g0 = self.graph();
        for (g, &(b, t)) in self.graphs.iter().zip(&PROBES).skip(1) {
            let at =
                format!("the graphs built at {}×{} and {b}×{t} differ", PROBES[0].0, PROBES[0].1);
            if g.nodes().len() != g0.nodes().len() || g.tensors().len() != g0.tensors().len() {
                return Err(format!("{at} in their node or tensor count"));
            }
            if g.params() != g0.params() || g.inputs() != g0.inputs() {
                return Err(format!("{at} in their parameters or inputs"));
            }
            for (i, (x, y)) in g0.tensors().iter().zip(g.tensors()).enumerate() {
                if x.shape.len() != y.shape.len() || x.elem != y.elem || x.kind != y.kind {
                    return Err(format!("{at} at tensor %{i}"));
                }
            }
            for (i, (x, y)) in g0.nodes().iter().zip(g.nodes()).enumerate() {
                let same_op = match (&x.op, &y.op) {
                    (Op::Split(Split { sizes: s0 }), Op::Split(Split { sizes: s1 })) => {
                        s0.len() == s1.len()
                    }
                    (a, b) => a == b,
                };
                if !same_op || x.inputs != y.inputs || x.outputs != y.outputs {
                    return Err(format!(
                        "{at} at node {i} ({} {} vs {} {})",
                        x.op.name(),
                        x.op.attrs(),
                        y.op.name(),
                        y.op.attrs()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Fits the values `at(graph)` takes at the probes.
    fn fit(&self, what: &str, at: impl Fn(&Graph) -> usize) -> Result<Dim, String> {
        let v: Vec<i64> = self.graphs.iter().map(|g| at(g) as i64).collect();
        Dim::fit(&v).ok_or_else(|| {
            let seen: Vec<String> =
                PROBES.iter().zip(&v).map(|((b, t), x)| format!("{x} at {b}×{t}")).collect();
            format!(
                "{what} is not k + b·{BATCH} + t·{SEQUENCE} + bt·{BATCH}·{SEQUENCE} ({})",
                seen.join(", ")
            )
        })
    }

    /// The shape of `t` in terms of the dynamic axes.
    fn dims(&self, t: TensorId) -> Result<Vec<Dim>, String> {
        (0..self.graph().shape(t).len())
            .map(|i| self.fit(&format!("axis {i} of {t}"), |g| g.shape(t)[i]))
            .collect()
    }
}

// ------------------------------------------------------------------------------- ONNX building

fn dim_param(name: &str) -> Dimension {
    Dimension { value: Some(dimension::Value::DimParam(name.into())), denotation: None }
}

fn value_info(name: &str, elem_type: i32, dim: Vec<Dimension>) -> ValueInfoProto {
    let tensor =
        type_proto::Tensor { elem_type: Some(elem_type), shape: Some(TensorShapeProto { dim }) };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(tensor)),
            denotation: None,
        }),
        doc_string: None,
    }
}

fn tensor_raw(name: &str, data_type: i32, dims: &[i64], raw: Vec<u8>) -> TensorProto {
    TensorProto {
        dims: dims.to_vec(),
        data_type: Some(data_type),
        name: Some(name.into()),
        doc_string: None,
        raw_data: Some(raw),
    }
}

fn tensor_f32(name: &str, shape: &[usize], data: &[f32]) -> TensorProto {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    tensor_raw(name, proto::FLOAT, &dims, data.iter().flat_map(|v| v.to_le_bytes()).collect())
}

fn tensor_i64(name: &str, dims: &[i64], data: &[i64]) -> TensorProto {
    tensor_raw(name, proto::INT64, dims, data.iter().flat_map(|v| v.to_le_bytes()).collect())
}

fn attr(name: &str, ty: AttributeType) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(ty as i32), ..Default::default() }
}

fn attr_i(name: &str, i: i64) -> AttributeProto {
    AttributeProto { i: Some(i), ..attr(name, AttributeType::Int) }
}

fn attr_f(name: &str, f: f32) -> AttributeProto {
    AttributeProto { f: Some(f), ..attr(name, AttributeType::Float) }
}

fn attr_ints(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto { ints: ints.to_vec(), ..attr(name, AttributeType::Ints) }
}

fn attr_t(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto { t: Some(t), ..attr(name, AttributeType::Tensor) }
}

/// The ONNX graph under construction: nodes, constant initializers, and every value name a
/// node reads (to keep only the parameters that are used).
#[derive(Default)]
struct Out {
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    used: std::collections::HashSet<String>,
    fresh: usize,
    consts_i64: HashMap<(Vec<i64>, bool), String>,
    consts_f32: HashMap<u32, String>,
}

impl Out {
    /// Appends `op_type(inputs) -> outputs`, named `name`.
    fn node(
        &mut self,
        op_type: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        attribute: Vec<AttributeProto>,
    ) {
        self.used.extend(inputs.iter().map(|s| s.to_string()));
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            name: Some(name.into()),
            op_type: Some(op_type.into()),
            domain: None,
            attribute,
            doc_string: None,
        });
    }

    /// A one-output node whose output gets a fresh name `{hint}_{n}`; returns that name.
    fn op(
        &mut self,
        op_type: &str,
        hint: &str,
        inputs: &[&str],
        attribute: Vec<AttributeProto>,
    ) -> String {
        self.fresh += 1;
        let y = format!("{hint}_{}", self.fresh);
        self.node(op_type, &y, inputs, &[&y], attribute);
        y
    }

    /// An int64 constant: a scalar when `scalar` (one value), else 1-D.
    fn i64s(&mut self, v: &[i64], scalar: bool) -> String {
        if let Some(n) = self.consts_i64.get(&(v.to_vec(), scalar)) {
            return n.clone();
        }
        let name = format!("const_i64_{}", self.consts_i64.len());
        let dims = if scalar { vec![] } else { vec![v.len() as i64] };
        self.inits.push(tensor_i64(&name, &dims, v));
        self.consts_i64.insert((v.to_vec(), scalar), name.clone());
        name
    }

    /// An f32 scalar constant (broadcasts against anything).
    fn f32(&mut self, v: f32) -> String {
        if let Some(n) = self.consts_f32.get(&v.to_bits()) {
            return n.clone();
        }
        let name = format!("const_f32_{}", self.consts_f32.len());
        self.inits.push(tensor_f32(&name, &[], &[v]));
        self.consts_f32.insert(v.to_bits(), name.clone());
        name
    }
}

/// Translates the probes' graph into [`Out`].
struct Exporter<'a> {
    probes: &'a Probes,
    out: Out,
    /// ONNX value name of each engine tensor.
    names: Vec<String>,
    /// Run-time values computed once: `Shape(input_ids)`, the axes as 1-D [1] tensors, sizes
    /// by their [`Dim`], causal masks by (Tq, Tk).
    ids_shape: Option<String>,
    sizes: HashMap<Dim, String>,
    causal: HashMap<(Dim, Dim), String>,
    engine_ops: BTreeMap<&'static str, usize>,
    /// `FamilyModel::fixed_inputs` at every position (name, (P, D) row-major), P = `positions`.
    fixed: Vec<(&'static str, Vec<f32>)>,
    positions: usize,
}

/// One engine node being exported: its ONNX name, its index and its operands' names.
#[derive(Clone, Copy)]
struct NodeAt<'a> {
    nm: &'a str,
    i: usize,
    x: &'a [String],
    y: &'a [String],
}

impl<'a> Exporter<'a> {
    fn new(probes: &'a Probes, fixed: Vec<(&'static str, Vec<f32>)>, positions: usize) -> Self {
        let g = probes.graph();
        let producers = g.producers();
        let logits = probes.logits;
        let names = (0..g.tensors().len())
            .map(|i| {
                let t = TensorId(i as u32);
                if t == logits {
                    return LOGITS.to_string();
                }
                match &g.tensor(t).kind {
                    TensorKind::Param(p) => g.params()[*p].name.clone(),
                    TensorKind::Input { name } if name == ATTENTION_MASK => {
                        "attention_mask_additive".into()
                    }
                    TensorKind::Input { name } => name.clone(),
                    _ => match producers[i] {
                        Some(n) => format!("{}_{i}", g.nodes()[n].op.name()),
                        None => format!("t{i}"),
                    },
                }
            })
            .collect();
        Exporter {
            probes,
            out: Out::default(),
            names,
            ids_shape: None,
            sizes: HashMap::new(),
            causal: HashMap::new(),
            engine_ops: BTreeMap::new(),
            fixed,
            positions,
        }
    }

    fn name(&self, t: TensorId) -> &str {
        &self.names[t.index()]
    }

    fn export(&mut self, pads: &Pads) -> Result<(), String> {
        let g = self.probes.graph();
        for &t in g.inputs() {
            self.derived_input(t, pads)?;
        }
        let live = liveness(g, self.probes.logits);
        for (i, node) in g.nodes().iter().enumerate() {
            if node.outputs.iter().any(|o| live[o.index()]) {
                *self.engine_ops.entry(node.op.name()).or_default() += 1;
                self.node(i, &live).map_err(|e| {
                    format!("node {i} ({} → {}): {e}", node.op.name(), node.outputs[0])
                })?;
            }
        }
        Ok(())
    }

    // ---- run-time sizes

    /// `Shape(input_ids)`: (2) int64 = [batch, sequence].
    fn ids_shape(&mut self) -> String {
        if let Some(s) = &self.ids_shape {
            return s.clone();
        }
        let s = "input_ids_shape".to_string();
        self.out.node("Shape", &s, &[INPUT_IDS], &[&s], vec![]);
        self.ids_shape = Some(s.clone());
        s
    }

    /// The size `d` at run time as a 1-D [1] int64 tensor (Shape → Gather, Mul, Add).
    fn size(&mut self, d: Dim) -> String {
        if let Some(n) = d.as_const() {
            return self.out.i64s(&[n], false);
        }
        if let Some(s) = self.sizes.get(&d) {
            return s.clone();
        }
        let axis = |ex: &mut Self, i: i64, hint: &str| {
            let shape = ex.ids_shape();
            let idx = ex.out.i64s(&[i], false);
            ex.out.op("Gather", hint, &[&shape, &idx], vec![attr_i("axis", 0)])
        };
        let s = if d == Dim::BATCH {
            axis(self, 0, BATCH)
        } else if d == Dim::SEQUENCE {
            axis(self, 1, SEQUENCE)
        } else if d == (Dim { k: 0, b: 0, t: 0, bt: 1 }) {
            let (b, t) = (self.size(Dim::BATCH), self.size(Dim::SEQUENCE));
            self.out.op("Mul", "batch_x_sequence", &[&b, &t], vec![])
        } else {
            let mut acc: Option<String> = None;
            for (c, unit) in
                [(d.b, Dim::BATCH), (d.t, Dim::SEQUENCE), (d.bt, Dim { k: 0, b: 0, t: 0, bt: 1 })]
            {
                if c == 0 {
                    continue;
                }
                let v = self.size(unit);
                let term = if c == 1 {
                    v
                } else {
                    let c = self.out.i64s(&[c], false);
                    self.out.op("Mul", "size", &[&v, &c], vec![])
                };
                acc = Some(match acc {
                    None => term,
                    Some(a) => self.out.op("Add", "size", &[&a, &term], vec![]),
                });
            }
            let acc = acc.expect("a non-constant size has a non-zero coefficient");
            if d.k == 0 {
                acc
            } else {
                let k = self.out.i64s(&[d.k], false);
                self.out.op("Add", "size", &[&acc, &k], vec![])
            }
        };
        self.sizes.insert(d, s.clone());
        s
    }

    /// A shape vector (N) int64 at run time: fixed runs as one constant, sizes concatenated.
    fn shape(&mut self, dims: &[Dim]) -> String {
        if let Some(c) = dims.iter().map(|d| d.as_const()).collect::<Option<Vec<i64>>>() {
            return self.out.i64s(&c, false);
        }
        let mut parts: Vec<String> = Vec::new();
        let mut run: Vec<i64> = Vec::new();
        for d in dims {
            match d.as_const() {
                Some(n) => run.push(n),
                None => {
                    if !run.is_empty() {
                        parts.push(self.out.i64s(&std::mem::take(&mut run), false));
                    }
                    parts.push(self.size(*d));
                }
            }
        }
        if !run.is_empty() {
            parts.push(self.out.i64s(&run, false));
        }
        let refs: Vec<&str> = parts.iter().map(|s| s.as_str()).collect();
        self.out.op("Concat", "shape", &refs, vec![attr_i("axis", 0)])
    }

    /// A size as an int64 scalar (Range's operands).
    fn scalar_size(&mut self, d: Dim) -> String {
        if let Some(n) = d.as_const() {
            return self.out.i64s(&[n], true);
        }
        let v = self.size(d);
        let axes = self.out.i64s(&[0], false);
        self.out.op("Squeeze", "scalar", &[&v, &axes], vec![])
    }

    // ---- the engine's fed inputs, from input_ids and attention_mask

    /// Computes the engine input `t` as `FeedInfo::feed` does (models/src/graph/mod.rs).
    fn derived_input(&mut self, t: TensorId, pads: &Pads) -> Result<(), String> {
        let g = self.probes.graph();
        let engine_name = g.input_name(t).expect("graph inputs are named").to_string();
        let y = self.name(t).to_string();
        let o = &mut self.out;
        match engine_name.as_str() {
            INPUT_IDS => {} // the user's input itself
            POSITION_IDS => {
                // 0..T, HF's default position_ids: Range(0, T, 1) → (T) int64.
                let t = self.scalar_size(Dim::SEQUENCE);
                let (zero, one) = (self.out.i64s(&[0], true), self.out.i64s(&[1], true));
                self.out.node("Range", &y, &[&zero, &t, &one], &[&y], vec![]);
            }
            TOKEN_TYPE_IDS => {
                // zeros (B, T) int64, HF's default token_type_ids: ConstantOfShape(Shape(ids)).
                let shape = self.ids_shape();
                let value = tensor_i64("value", &[1], &[0]);
                self.out.node(
                    "ConstantOfShape",
                    &y,
                    &[&shape],
                    &[&y],
                    vec![attr_t("value", value)],
                );
            }
            POSITION_IDS_AFTER_PAD => {
                // RoBERTa's create_position_ids_from_input_ids: m = Cast(ids ≠ pad) (B, T);
                // CumSum(m, axis 1)·m + pad → (B, T) int64
                // (https://onnx.ai/onnx/operators/onnx__CumSum.html).
                let pad = pads.embedding.ok_or(
                    "the graph takes positions after pad but the config has no pad_token_id",
                )?;
                let pad = o.i64s(&[pad], true);
                let is_pad = o.op("Equal", "pos_is_pad", &[INPUT_IDS, &pad], vec![]); // (B, T) bool
                let not_pad = o.op("Not", "pos_not_pad", &[&is_pad], vec![]);
                let m =
                    o.op("Cast", "pos_mask", &[&not_pad], vec![attr_i("to", proto::INT64 as i64)]);
                let axis = o.i64s(&[1], true);
                let count = o.op("CumSum", "pos_count", &[&m, &axis], vec![]); // (B, T)
                let counted = o.op("Mul", "pos_counted", &[&count, &m], vec![]);
                o.node("Add", &y, &[&counted, &pad], &[&y], vec![]);
            }
            NOT_PAD_MASK | PAD_MASK => {
                // 1.0 where the id is (not) the pad id, (B, T) → (B, T, 1, 1) f32.
                let pad = pads
                    .embedding
                    .ok_or("the graph takes pad masks but the config has no pad_token_id")?;
                let pad = o.i64s(&[pad], true);
                let is_pad = o.op("Equal", "is_pad", &[INPUT_IDS, &pad], vec![]); // (B, T) bool
                let m = if engine_name == NOT_PAD_MASK {
                    o.op("Not", "not_pad", &[&is_pad], vec![])
                } else {
                    is_pad
                };
                let f = o.op("Cast", "pad_mask", &[&m], vec![attr_i("to", proto::FLOAT as i64)]);
                let axes = o.i64s(&[2, 3], false);
                o.node("Unsqueeze", &y, &[&f, &axes], &[&y], vec![]);
            }
            ATTENTION_MASK => {
                // HF's 0/1 mask (B, T) → additive (B, 1, 1, T): −∞ where 0, else 0 (any non-zero
                // is a token, as FeedInfo::feed).
                let zero_i = o.i64s(&[0], true);
                let masked = o.op("Equal", "masked", &[ATTENTION_MASK_INPUT, &zero_i], vec![]); // (B, T) bool
                let (ninf, zero) = (o.f32(f32::NEG_INFINITY), o.f32(0.0));
                let add = o.op("Where", "mask_additive", &[&masked, &ninf, &zero], vec![]); // (B, T) f32
                let axes = o.i64s(&[1, 2], false);
                o.node("Unsqueeze", &y, &[&add, &axes], &[&y], vec![]);
            }
            LAST_TOKEN => {
                // One-hot (B, 1, T) at each row's rightmost token that is not pad_token_id
                // (position 0 when all are), HF's rule: argmax over t of t·[id ≠ pad]; ArgMax
                // takes the first maximum, so an all-pad row (all 0) gives 0. Without a pad id,
                // the last position (T − 1), as FeedInfo::feed.
                let positions = self.positions_i64();
                let o = &mut self.out;
                let weighted = match pads.pooling {
                    Some(pad) => {
                        let pad = o.i64s(&[pad], true);
                        let is_pad = o.op("Equal", "is_pad", &[INPUT_IDS, &pad], vec![]);
                        let not_pad = o.op("Not", "not_pad", &[&is_pad], vec![]);
                        let not_pad = o.op(
                            "Cast",
                            "not_pad",
                            &[&not_pad],
                            vec![attr_i("to", proto::INT64 as i64)],
                        );
                        o.op("Mul", "position_if_token", &[&not_pad, &positions], vec![])
                        // (B, T)
                    }
                    None => {
                        let shape = self.ids_shape();
                        self.out.op("Expand", "position_if_token", &[&positions, &shape], vec![])
                        // (B, T)
                    }
                };
                let o = &mut self.out;
                let last = o.op(
                    "ArgMax",
                    "last_token",
                    &[&weighted],
                    vec![attr_i("axis", 1), attr_i("keepdims", 1)],
                ); // (B, 1)
                let hit = o.op("Equal", "last_token_hit", &[&positions, &last], vec![]); // (B, T) bool
                let f = o.op(
                    "Cast",
                    "last_token_selector",
                    &[&hit],
                    vec![attr_i("to", proto::FLOAT as i64)],
                );
                let axes = o.i64s(&[1], false);
                o.node("Unsqueeze", &y, &[&f, &axes], &[&y], vec![]); // (B, 1, T)
            }
            other => {
                // A table of the sequence length only (rotary cos/sin, (T, D)): the (P, D)
                // table at every position as an initializer, its first T rows sliced at run
                // time — the same values FeedInfo::feed gives at T, row t being position t
                // whatever T is (https://onnx.ai/onnx/operators/onnx__Slice.html).
                let Some((_, table)) = self.fixed.iter().find(|(n, _)| *n == other) else {
                    return Err(format!(
                        "the graph takes an input '{other}' that the ONNX export cannot compute"
                    ));
                };
                let (p, d) = (self.positions, table.len() / self.positions.max(1));
                if p == 0 || p * d != table.len() {
                    return Err(format!("the table '{other}' is not (positions {p}, D)"));
                }
                let init = format!("{other}_table");
                self.out.inits.push(tensor_f32(&init, &[p, d], table));
                let t = self.size(Dim::SEQUENCE);
                let (zero, axis) = (self.out.i64s(&[0], false), self.out.i64s(&[0], false));
                self.out.node("Slice", &y, &[&init, &zero, &t, &axis], &[&y], vec![]);
            }
        }
        Ok(())
    }

    /// 0..T (T) int64: the position ids, whether or not the graph reads them.
    fn positions_i64(&mut self) -> String {
        let t = self.scalar_size(Dim::SEQUENCE);
        let (zero, one) = (self.out.i64s(&[0], true), self.out.i64s(&[1], true));
        self.out.op("Range", "positions", &[&zero, &t, &one], vec![])
    }

    // ---- the engine's ops

    /// One engine node as ONNX nodes. References: the ONNX operator docs
    /// (https://onnx.ai/onnx/operators/) and the engine op's doc in engine/src/graph/op.rs.
    fn node(&mut self, i: usize, live: &[bool]) -> Result<(), String> {
        let g = self.probes.graph();
        let node = &g.nodes()[i];
        let x: Vec<String> = node.inputs.iter().map(|&t| self.name(t).to_string()).collect();
        let y: Vec<String> = node.outputs.iter().map(|&t| self.name(t).to_string()).collect();
        let nm = format!("n{i}_{}", node.op.name());
        let at = NodeAt { nm: &nm, i, x: &x, y: &y };
        let rank = |t: TensorId| g.shape(t).len() as i64;
        match &node.op {
            // Constant (…) of the output's shape: an initializer when the shape is fixed,
            // else ConstantOfShape (https://onnx.ai/onnx/operators/onnx__ConstantOfShape.html).
            Op::Fill(Fill { value }) => {
                let dims = self.probes.dims(node.outputs[0])?;
                match dims.iter().map(|d| d.as_const()).collect::<Option<Vec<i64>>>() {
                    Some(shape) => {
                        let n = shape.iter().product::<i64>() as usize;
                        let t = tensor_raw(&y[0], proto::FLOAT, &shape, value.to_le_bytes().repeat(n));
                        self.out.inits.push(t);
                    }
                    None => {
                        let shape = self.shape(&dims);
                        let v = tensor_f32("value", &[1], &[*value]);
                        self.out.node("ConstantOfShape", &nm, &[&shape], &[&y[0]], vec![attr_t("value", v)]);
                    }
                }
            }
            // table (V, C), ids (…) → (…, C): Gather on axis 0
            // (https://onnx.ai/onnx/operators/onnx__Gather.html).
            Op::Embedding => self.out.node("Gather", &nm, &[&x[0], &x[1]], &[&y[0]], vec![attr_i("axis", 0)]),
            // a (…, M, K) · b (…, K, N) or (K, N) → (…, M, N); ta/tb as a Transpose of the last
            // two axes first. ONNX MatMul broadcasts a 2-D b over a's batch axes, as the engine
            // (https://onnx.ai/onnx/operators/onnx__MatMul.html).
            Op::MatMul(MatMul { ta, tb }) => {
                let operand = |t: TensorId, name: &str, transpose: bool, out: &mut Out| {
                    if !transpose {
                        return name.to_string();
                    }
                    let r = rank(t);
                    let mut perm: Vec<i64> = (0..r).collect();
                    perm.swap(r as usize - 1, r as usize - 2);
                    out.op("Transpose", &format!("{nm}_t"), &[name], vec![attr_ints("perm", &perm)])
                };
                let a = operand(node.inputs[0], &x[0], *ta, &mut self.out);
                let b = operand(node.inputs[1], &x[1], *tb, &mut self.out);
                self.out.node("MatMul", &nm, &[&a, &b], &[&y[0]], vec![]);
            }
            // x (…, C) + bias (C); a + b with b's shape a suffix of a's: numpy broadcasting
            // aligns trailing axes, the engine's rule (https://onnx.ai/onnx/operators/onnx__Add.html).
            Op::BiasAdd | Op::Add => self.out.node("Add", &nm, &[&x[0], &x[1]], &[&y[0]], vec![]),
            // s·x (…) (https://onnx.ai/onnx/operators/onnx__Mul.html).
            Op::Scale(Scale { s }) => {
                let s = self.out.f32(*s);
                self.out.node("Mul", &nm, &[&x[0], &s], &[&y[0]], vec![]);
            }
            Op::Gelu(Gelu { approx }) => self.gelu(&nm, &x[0], &y[0], *approx),
            // (…) → tanh (https://onnx.ai/onnx/operators/onnx__Tanh.html).
            Op::Tanh => self.out.node("Tanh", &nm, &[&x[0]], &[&y[0]], vec![]),
            Op::LayerNorm(LayerNorm { eps }) => self.layer_norm(at, *eps, live)?,
            Op::Softmax(Softmax { scale, causal }) => {
                let dims = self.probes.dims(node.inputs[0])?;
                let mask = x.get(1).map(|s| s.as_str());
                self.softmax(&nm, &x[0], mask, &y[0], *scale, (*causal).then(|| (dims[dims.len() - 2], dims[dims.len() - 1])));
            }
            // Inference: HF's eval mode, where dropout is the identity; the graph was built with
            // p = 0 everywhere (https://onnx.ai/onnx/operators/onnx__Identity.html).
            Op::Dropout(Dropout { p, .. }) => {
                if *p != 0.0 {
                    return Err(format!("dropout with p = {p} (export builds with dropout off: this is a bug)"));
                }
                self.out.node("Identity", &nm, &[&x[0]], &[&y[0]], vec![]);
            }
            // (…) → the output's shape, computed at run time; allowzero = 1 so a size that is 0
            // stays 0 instead of meaning "copy" (https://onnx.ai/onnx/operators/onnx__Reshape.html).
            Op::Reshape => {
                let dims = self.probes.dims(node.outputs[0])?;
                let shape = self.shape(&dims);
                self.out.node("Reshape", &nm, &[&x[0], &shape], &[&y[0]], vec![attr_i("allowzero", 1)]);
            }
            // x.permute(perm) (https://onnx.ai/onnx/operators/onnx__Transpose.html).
            Op::Permute(Permute { perm }) => {
                let perm: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
                self.out.node("Transpose", &nm, &[&x[0]], &[&y[0]], vec![attr_ints("perm", &perm)]);
            }
            // x (…, Σ sizes) → (…, sizes[i]) on the last axis, sizes at run time (BERT's
            // classifier splits off token 0 as [C, (T − 1)·C])
            // (https://onnx.ai/onnx/operators/onnx__Split.html, `split` as an input since 13).
            Op::Split(Split { sizes }) => {
                let dims = (0..sizes.len())
                    .map(|k| {
                        self.probes.fit(&format!("split size {k}"), |g| match &g.nodes()[i].op {
                            Op::Split(Split { sizes }) => sizes[k],
                            _ => unreachable!("the probes' nodes have the same ops"),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let split = self.shape(&dims);
                let outs: Vec<&str> = y.iter().map(|s| s.as_str()).collect();
                self.out.node("Split", &nm, &[&x[0], &split], &outs, vec![attr_i("axis", -1)]);
            }
            // (…, n_i) … → (…, Σ n_i) (https://onnx.ai/onnx/operators/onnx__Concat.html).
            Op::Concat => {
                let refs: Vec<&str> = x.iter().map(|s| s.as_str()).collect();
                self.out.node("Concat", &nm, &refs, &[&y[0]], vec![attr_i("axis", -1)]);
            }
            // f(x) elementwise (engine/src/ops/pointwise.rs); every function says its export.
            Op::Unary(Unary { f }) => match f {
                // SiLU: x·σ(x) (https://onnx.ai/onnx/operators/onnx__Sigmoid.html; opset 17
                // has no Swish).
                UnaryFn::Silu => {
                    let s = self.out.op("Sigmoid", &format!("{nm}_sigmoid"), &[&x[0]], vec![]);
                    self.out.node("Mul", &nm, &[&x[0], &s], &[&y[0]], vec![]);
                }
                // max(x, 0) (https://onnx.ai/onnx/operators/onnx__Relu.html).
                UnaryFn::Relu => self.out.node("Relu", &nm, &[&x[0]], &[&y[0]], vec![]),
            },
            // f(a, b), b's shape a suffix of a's: numpy broadcasting aligns trailing axes.
            Op::Binary(Binary { f }) => match f {
                BinaryFn::Mul => self.out.node("Mul", &nm, &[&x[0], &x[1]], &[&y[0]], vec![]),
            },
            Op::RmsNorm(RmsNorm { eps }) => self.rms_norm(at, *eps, live)?,
            Op::Rotary(Rotary { inverse }) => self.rotary(at, *inverse)?,
            other => {
                return Err(format!(
                    "the engine op '{}' has no ONNX export (the export takes the unoptimized inference graph; fused and backward ops are not expected there)",
                    other.name()
                ))
            }
        }
        Ok(())
    }

    /// LayerNorm's y and, when read, its size-1 row mean; its rstd has no export.
    fn layer_norm(&mut self, at: NodeAt<'_>, eps: f32, live: &[bool]) -> Result<(), String> {
        let NodeAt { nm, i, x, y } = at;
        let node = &self.probes.graph().nodes()[i];
        let [y_t, mean_t, rstd_t] = node.outputs[..] else {
            unreachable!("layernorm has 3 outputs")
        };
        let x0 = node.inputs[0];
        if live[rstd_t.index()] {
            return Err(
                "the rstd output of a LayerNorm is read: only y and the size-1 mean have an export"
                    .into(),
            );
        }
        if live[y_t.index()] {
            // x (…, C), w (C), b (C) → y (…, C) over the last axis
            // (https://onnx.ai/onnx/operators/onnx__LayerNormalization.html, opset 17).
            let attrs = vec![attr_i("axis", -1), attr_f("epsilon", eps)];
            self.out.node("LayerNormalization", nm, &[&x[0], &x[1], &x[2]], &[&y[0]], attrs);
        }
        if live[mean_t.index()] {
            // Builder::stop_gradient: the row mean of x (…, 1) is x itself, exactly
            // (one term): Squeeze the size-1 axis → (…)
            // (https://onnx.ai/onnx/operators/onnx__Squeeze.html).
            if self.probes.dims(x0)?.last().and_then(|d| d.as_const()) != Some(1) {
                return Err("the mean output of a LayerNorm over more than one value is read: only the size-1 row mean (stop_gradient) has an export".into());
            }
            let axes = self.out.i64s(&[-1], false);
            self.out.node("Squeeze", &format!("{nm}_mean"), &[&x[0], &axes], &[&y[1]], vec![]);
        }
        Ok(())
    }

    /// HF's LlamaRMSNorm: x (…, C), w (C) → w·(x·1/√(mean(x²) + eps)) over the last
    /// axis, in f32 (opset 17 has no RMSNormalization: it arrives in 23)
    /// (https://onnx.ai/onnx/operators/onnx__ReduceMean.html, axes an attribute in 13).
    fn rms_norm(&mut self, at: NodeAt<'_>, eps: f32, live: &[bool]) -> Result<(), String> {
        let NodeAt { nm, i, x, y } = at;
        let node = &self.probes.graph().nodes()[i];
        let [_, rstd_t] = node.outputs[..] else { unreachable!("rms_norm has 2 outputs") };
        if live[rstd_t.index()] {
            return Err("the rstd output of an RMSNorm is read: only y has an export".into());
        }
        let o = &mut self.out;
        let sq = o.op("Mul", &format!("{nm}_sq"), &[&x[0], &x[0]], vec![]);
        let attrs = vec![attr_ints("axes", &[-1]), attr_i("keepdims", 1)];
        let ms = o.op("ReduceMean", &format!("{nm}_ms"), &[&sq], attrs); // (…, 1)
        let eps = o.f32(eps);
        let v = o.op("Add", &format!("{nm}_var"), &[&ms, &eps], vec![]);
        let sd = o.op("Sqrt", &format!("{nm}_sqrt"), &[&v], vec![]);
        let rstd = o.op("Reciprocal", &format!("{nm}_rstd"), &[&sd], vec![]);
        let xh = o.op("Mul", &format!("{nm}_xhat"), &[&x[0], &rstd], vec![]);
        o.node("Mul", nm, &[&x[1], &xh], &[&y[0]], vec![]);
        Ok(())
    }

    /// HF's apply_rotary_pos_emb: x (…, T, D), cos, sin (T, D) → x·cos +
    /// rotate_half(x)·sin, rotate_half(x) = cat(−x[D/2:], x[:D/2]); `inverse` negates
    /// sin (the backward's rotation, not expected in an inference graph but exact).
    fn rotary(&mut self, at: NodeAt<'_>, inverse: bool) -> Result<(), String> {
        let NodeAt { nm, i, x, y } = at;
        let x0 = self.probes.graph().nodes()[i].inputs[0];
        let dims = self.probes.dims(x0)?;
        let d = dims.last().and_then(|d| d.as_const()).ok_or("rotary's head size must be fixed")?;
        let halves = self.out.i64s(&[d / 2, d / 2], false);
        let (x1, x2) = (format!("{nm}_x1"), format!("{nm}_x2"));
        let o = &mut self.out;
        o.node(
            "Split",
            &format!("{nm}_split"),
            &[&x[0], &halves],
            &[&x1, &x2],
            vec![attr_i("axis", -1)],
        );
        let neg = o.op("Neg", &format!("{nm}_neg"), &[&x2], vec![]);
        let rot = o.op("Concat", &format!("{nm}_rot"), &[&neg, &x1], vec![attr_i("axis", -1)]);
        let sin = if inverse {
            o.op("Neg", &format!("{nm}_nsin"), &[&x[2]], vec![])
        } else {
            x[2].clone()
        };
        let a = o.op("Mul", &format!("{nm}_cos"), &[&x[0], &x[1]], vec![]);
        let b = o.op("Mul", &format!("{nm}_sin"), &[&rot, &sin], vec![]);
        o.node("Add", nm, &[&a, &b], &[&y[0]], vec![]);
        Ok(())
    }

    /// HF's GELU (ATen's `GeluKernel.cpp`, engine/src/ops/gelu.rs), as the engine rounds it:
    /// erf: (0.5·x)·(1 + erf(x·(1/√2))); tanh: (0.5·x)·(1 + tanh(√(2/π)·(x + 0.044715·x·x·x))).
    /// Opset 17 has no Gelu op (it arrives in 20).
    // x: (…) -> (…)
    fn gelu(&mut self, nm: &str, x: &str, y: &str, approx: GeluApprox) {
        let o = &mut self.out;
        let inner = match approx {
            GeluApprox::Erf => {
                let c = o.f32(std::f64::consts::FRAC_1_SQRT_2 as f32);
                let u = o.op("Mul", &format!("{nm}_u"), &[x, &c], vec![]);
                o.op("Erf", &format!("{nm}_erf"), &[&u], vec![])
            }
            GeluApprox::Tanh => {
                let (kappa, c) = (o.f32(0.044715), o.f32(SQRT_2_OVER_PI as f32));
                // κ·x·x·x in the engine's order: ((κ·x)·x)·x.
                let k1 = o.op("Mul", &format!("{nm}_kx"), &[&kappa, x], vec![]);
                let k2 = o.op("Mul", &format!("{nm}_kxx"), &[&k1, x], vec![]);
                let k3 = o.op("Mul", &format!("{nm}_kxxx"), &[&k2, x], vec![]);
                let s = o.op("Add", &format!("{nm}_sum"), &[x, &k3], vec![]);
                let u = o.op("Mul", &format!("{nm}_u"), &[&c, &s], vec![]);
                o.op("Tanh", &format!("{nm}_tanh"), &[&u], vec![])
            }
        };
        let (one, half) = (o.f32(1.0), o.f32(0.5));
        let p = o.op("Add", &format!("{nm}_1p"), &[&one, &inner], vec![]);
        let hx = o.op("Mul", &format!("{nm}_hx"), &[&half, x], vec![]);
        o.node("Mul", nm, &[&hx, &p], &[y], vec![]);
    }

    /// softmax(x·scale + mask) over the last axis, keys j > i at −∞ when causal, and — the
    /// engine's rule (engine/src/ops/softmax.rs, torch's `_safe_softmax`) — a row whose every
    /// entry is −∞ (a left pad under the causal mask) gives zeros, where ONNX Softmax gives
    /// NaN: Where(ReduceMax(z) = −∞, 0, Softmax(z))
    /// (https://onnx.ai/onnx/operators/onnx__Softmax.html, onnx__ReduceMax.html, opset 13+).
    // x: (…, Tq, Tk), mask broadcastable to x -> (…, Tq, Tk)
    fn softmax(
        &mut self,
        nm: &str,
        x: &str,
        mask: Option<&str>,
        y: &str,
        scale: f32,
        causal: Option<(Dim, Dim)>,
    ) {
        let mut z = x.to_string();
        if scale != 1.0 {
            let s = self.out.f32(scale);
            z = self.out.op("Mul", &format!("{nm}_scaled"), &[&z, &s], vec![]);
        }
        if let Some(m) = mask {
            z = self.out.op("Add", &format!("{nm}_masked"), &[&z, m], vec![]);
        }
        if let Some((tq, tk)) = causal {
            // The engine overwrites j > i with −∞ after adding the mask: Where, not Add.
            let future = self.causal_future(tq, tk); // (Tq, Tk) bool
            let ninf = self.out.f32(f32::NEG_INFINITY);
            z = self.out.op("Where", &format!("{nm}_causal"), &[&future, &ninf, &z], vec![]);
        }
        let o = &mut self.out;
        let p = o.op("Softmax", &format!("{nm}_probs"), &[&z], vec![attr_i("axis", -1)]);
        let max = o.op(
            "ReduceMax",
            &format!("{nm}_max"),
            &[&z],
            vec![attr_ints("axes", &[-1]), attr_i("keepdims", 1)],
        );
        let ninf = o.f32(f32::NEG_INFINITY);
        let dead = o.op("Equal", &format!("{nm}_all_masked"), &[&max, &ninf], vec![]); // (…, Tq, 1)
        let zero = o.f32(0.0);
        o.node("Where", nm, &[&dead, &zero, &p], &[y], vec![]);
    }

    /// (Tq, Tk) bool, true at key j > query i: Greater(Range(Tk), Unsqueeze(Range(Tq), 1)).
    fn causal_future(&mut self, tq: Dim, tk: Dim) -> String {
        if let Some(s) = self.causal.get(&(tq, tk)) {
            return s.clone();
        }
        let (nq, nk) = (self.scalar_size(tq), self.scalar_size(tk));
        let o = &mut self.out;
        let (zero, one) = (o.i64s(&[0], true), o.i64s(&[1], true));
        let q = o.op("Range", "causal_q", &[&zero, &nq, &one], vec![]); // (Tq)
        let axes = o.i64s(&[1], false);
        let q = o.op("Unsqueeze", "causal_q", &[&q, &axes], vec![]); // (Tq, 1)
        let k = o.op("Range", "causal_k", &[&zero, &nk, &one], vec![]); // (Tk)
        let future = o.op("Greater", "causal_future", &[&k, &q], vec![]); // (Tq, Tk)
        self.causal.insert((tq, tk), future.clone());
        future
    }
}

/// Which tensors the logits depend on. A LayerNorm whose `y` is dead (stop_gradient reads
/// only its mean) needs only its input, not its weight and bias.
fn liveness(g: &Graph, logits: TensorId) -> Vec<bool> {
    let mut live = vec![false; g.tensors().len()];
    live[logits.index()] = true;
    for node in g.nodes().iter().rev() {
        if !node.outputs.iter().any(|o| live[o.index()]) {
            continue;
        }
        let reads: &[TensorId] = match node.op {
            Op::LayerNorm(_) if !live[node.outputs[0].index()] => &node.inputs[..1],
            _ => &node.inputs,
        };
        for t in reads {
            live[t.index()] = true;
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::builtin_config;

    #[test]
    fn dims_are_fitted_exactly_or_refused() {
        let at = |f: &dyn Fn(i64, i64) -> i64| {
            PROBES.iter().map(|&(b, t)| f(b as i64, t as i64)).collect::<Vec<_>>()
        };
        assert_eq!(Dim::fit(&at(&|_, _| 64)), Some(Dim { k: 64, b: 0, t: 0, bt: 0 }));
        assert_eq!(Dim::fit(&at(&|b, _| b)), Some(Dim::BATCH));
        assert_eq!(Dim::fit(&at(&|_, t| t)), Some(Dim::SEQUENCE));
        assert_eq!(Dim::fit(&at(&|b, t| 64 * b * t)), Some(Dim { k: 0, b: 0, t: 0, bt: 64 }));
        assert_eq!(Dim::fit(&at(&|_, t| 64 * (t - 1))), Some(Dim { k: -64, b: 0, t: 64, bt: 0 }));
        // T², T/2 and B² are not of the form: the fifth probe or an inexact division says so.
        assert_eq!(Dim::fit(&at(&|_, t| t * t)), None);
        assert_eq!(Dim::fit(&at(&|_, t| t / 2)), None);
        assert_eq!(Dim::fit(&at(&|b, _| b * b)), None);
        assert_eq!(Dim { k: -64, b: 0, t: 64, bt: 0 }.to_string(), "64·sequence − 64");
        assert_eq!(Dim { k: 0, b: -1, t: 0, bt: 2 }.to_string(), "2·batch·sequence − batch");
    }

    #[test]
    fn export_refuses_a_wrong_parameter_count_and_too_few_positions() {
        let cfg = builtin_config("tiny-gpt2").unwrap();
        let e = onnx_bytes(&cfg, &[0.0; 3]).unwrap_err().to_string();
        assert!(e.contains("has 3 values"), "{e}");
        let mut raw = cfg.raw.clone();
        raw["n_positions"] = serde_json::json!(4);
        let small = ModelConfig::from_value(raw, "test").unwrap();
        let e = onnx_bytes(&small, &[]).unwrap_err().to_string();
        assert!(e.contains("beyond the model's 4 positions"), "{e}");
    }

    /// Hand-built graphs at the probe sizes: (ids (B, T) → embedding (B, T, 4)) then `head`.
    fn probes_of(head: impl Fn(&mut Graph, TensorId, usize, usize) -> TensorId) -> Probes {
        let mut logits = None;
        let graphs = PROBES
            .iter()
            .map(|&(b, t)| {
                let mut g = Graph::new();
                let ids = g.input_ids(INPUT_IDS, &[b, t]).unwrap();
                let table = g.param("table", &[10, 4]).unwrap();
                let x = g.embedding(table, ids).unwrap();
                logits = Some(head(&mut g, x, b, t));
                g
            })
            .collect();
        Probes { graphs, logits: logits.unwrap() }
    }

    fn export_err(probes: &Probes) -> String {
        probes.check_structure().unwrap();
        Exporter::new(probes, Vec::new(), 0).export(&Pads::default()).unwrap_err()
    }

    /// An op with no mapping and a size not of the fitted form are errors naming the node.
    #[test]
    fn unmapped_ops_and_unfittable_sizes_are_errors_naming_the_node() {
        let fused = probes_of(|g, x, _, _| {
            let (w, bias) = (g.param("w", &[3, 4]).unwrap(), g.param("b", &[3]).unwrap());
            g.fused_linear(x, w, bias, true, None).unwrap()
        });
        let e = export_err(&fused);
        assert!(e.contains("node 1 (linear") && e.contains("'linear' has no ONNX export"), "{e}");
        let square = probes_of(|g, _, _, t| g.fill(&[t * t], 1.0));
        let e = export_err(&square);
        assert!(e.contains("node 1 (fill") && e.contains("axis 0 of %3 is not k + b·batch"), "{e}");
        // A different graph per size (here a reshape only at some sizes) is refused before.
        let varying =
            probes_of(|g, x, b, t| if b == 2 { g.reshape(x, &[b * t * 4]).unwrap() } else { x });
        assert!(varying.check_structure().unwrap_err().contains("differ"));
    }

    /// The model decodes back (prost) with what the module docs promise: opset, IR version,
    /// the two dynamic int64 inputs, the logits' declared shape, parameters under HF names.
    #[test]
    fn exported_model_declares_hf_inputs_and_dynamic_axes() {
        let cfg = builtin_config("tiny-gpt2").unwrap();
        let n = crate::param_count(&cfg);
        // The flat buffer holds the alignment pads too; the initializers only the parameters.
        let (_, flat_len) = ortbench_engine::graph::flat_offsets(
            crate::param_specs(&cfg).iter().map(|s| s.numel()),
        );
        let params: Vec<f32> = (0..flat_len).map(|i| (i % 7) as f32 * 0.01).collect();
        let (bytes, report) = onnx_bytes(&cfg, &params).unwrap();
        assert_eq!(report.logits_shape, ["batch", "sequence", "1000"]);
        assert_eq!((report.param_values, report.initializers), (n, crate::param_specs(&cfg).len())); // every parameter is read
        let m = ModelProto::decode(&bytes[..]).unwrap();
        assert_eq!((m.ir_version, m.opset_import[0].version), (Some(IR_VERSION), Some(OPSET)));
        let g = m.graph.unwrap();
        let names: Vec<_> = g.input.iter().map(|v| v.name.clone().unwrap()).collect();
        assert_eq!(names, [INPUT_IDS, ATTENTION_MASK_INPUT]);
        assert!(g.initializer.iter().any(|t| t.name.as_deref() == Some("transformer.wte.weight")));
    }
}
