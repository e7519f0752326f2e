//! Export of a model's inference graph as ONNX: what an HF user feeds in, the logits out.
//!
//! The exported model takes HF's inputs — `input_ids` and the 0/1 `attention_mask`, both
//! int64 `[batch, sequence]` with those two axes dynamic — and returns `logits`
//! (`[batch, sequence, vocab]` for the LM heads, `[batch, num_labels]` for the classifiers).
//! The graph is the engine's unoptimized inference graph ([`InferenceModel`](crate::graph::InferenceModel), HF's eager
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

mod ops;
mod proto;
mod sizes;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use ortbench_engine::graph::{Graph, Op, TensorId, TensorKind};
use prost::Message;

use crate::config::ModelConfig;
use crate::family::Pads;
use crate::graph::{
    ATTENTION_MASK, INPUT_IDS, LAST_TOKEN, NOT_PAD_MASK, PAD_MASK, POSITION_IDS,
    POSITION_IDS_AFTER_PAD, TOKEN_TYPE_IDS,
};
use crate::ModelError;
use proto::tensor_shape_proto::{dimension, Dimension};
use proto::{
    type_proto, AttributeProto, AttributeType, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use sizes::{Dim, Probes};

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
