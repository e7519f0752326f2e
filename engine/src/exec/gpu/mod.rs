//! The GPU executor: a training graph's plan walked on a [`GpuDevice`], one kernel launch (or
//! GEMM) per executed node, nothing synchronised inside a step.
//!
//! At build it plans the graph with the GPU kernels' requirements ([`support::GpuSupport`]),
//! allocates every buffer once — the planned arena, the flat parameter and gradient buffers,
//! one buffer per step input, a small array of copy shapes, a status block — and resolves each
//! step to launches with every address, size, stride and tile fixed: a step then uploads its
//! inputs and queues the launches, substituting only the dropout seed and the loss scale. The
//! host reads back one status block per step (loss, bad-id flag, and from the optimizer the
//! gradient norm, finite flag and clip coefficient: `session`), the only synchronisation.
//!
//! The same executor runs on an NVIDIA GPU (`backend::cuda`) and, in the tests, on the host
//! SIMT harness with a host GEMM, where it is checked against the CPU engine
//! (`tests/tests/gpu_executor.rs`): the device path, not only each kernel, runs in CI.
//!
//! The kernels and the CPU kernels they must match are `engine/kernels/*.cu`; GEMMs keep the
//! CPU's split (GEMM, then the bias or bias + GELU pass) so both compute the same thing —
//! cuBLASLt's fused epilogues are a tuning step (issue 15).
//!
//! Precision: fp32, or f16/bf16 storage with f32 arithmetic in every kernel, fp32 master
//! parameters with a compute-dtype copy the graph reads (written by the optimizer's step), f32
//! parameter gradients (half GEMM operands into an f32 C for dW), f32 loss, seed, LayerNorm
//! statistics and attention log-sum-exp ([`support::storage_dtypes`]) — the same rounding
//! points as the CPU executor's f16/bf16 mode, so the two are compared in tests. The plan sizes
//! buffers by each tensor's element bytes, so half activations take half the arena.

pub mod launch;
pub mod session;
pub mod support;

use crate::backend::cpu::kernels::matmul::MatMulPlan;
use crate::backend::cpu::kernels::{cross_entropy, embedding};
use crate::backend::gpu::{
    Epilogue, GemmDtype, GemmPtrs, GemmShape, GpuDevice, GpuError, KernelArg,
};
use crate::exec::{ExecError, InputData, Inputs};
use crate::graph::op::{
    AddLayerNorm, Attention, AttentionBackward, Binary, CrossEntropy, CrossEntropyBackward,
    Dropout, Fill, GeluBackward, LayerNorm, Linear, LinearCrossEntropy, LinearCrossEntropyBackward,
    MatMul, Permute, Scale, Softmax, SoftmaxBackward, Split, Unary, UnaryBackward,
};
use crate::graph::{Graph, Node, Op, TensorId, TensorKind};
use crate::plan::{self, Place, Plan, PlanError, Root};
use crate::DType;
use launch::{attention as attn, copy, cross_entropy as ce, elementwise as ew, embedding as emb};
use launch::{layernorm as ln, linear_cross_entropy as lce, pointwise as pw, reduce};
use launch::{softmax as sm, StepValue};
use support::GpuSupport;

/// Words of the status block the host reads once per step (f32 unless said).
pub mod status {
    /// The loss.
    pub const LOSS: usize = 0;
    /// An embedding id or label out of range (i32, set by the kernels, zeroed per step).
    pub const BAD_ID: usize = 1;
    /// From the optimizer (adamw.cu `grad_stats_finish`): norm, finite (1/0), clip coefficient.
    pub const STATS: usize = 2;
    pub const WORDS: usize = 8;
}

/// One argument of a resolved launch: fixed at build, or this step's seed / loss scale.
#[derive(Debug, Clone, Copy)]
enum Arg {
    K(KernelArg),
    /// The step's dropout seed (u64).
    Seed,
    /// value · the step's loss scale (f32): the backward's seed.
    Scaled(f32),
}

/// One queued operation of a step.
#[derive(Debug, Clone)]
enum Call {
    Kernel { name: String, grid: u32, block: u32, smem: u32, args: Vec<Arg> },
    Gemm(GemmShape, GemmPtrs),
}

impl From<launch::Launch<u64>> for Call {
    /// A typed launcher's launch over device addresses; its step values stay symbolic.
    fn from(l: launch::Launch<u64>) -> Call {
        let args = l
            .args
            .into_iter()
            .map(|a| match a.kernel_arg() {
                Ok(k) => Arg::K(k),
                Err(StepValue::Seed) => Arg::Seed,
                Err(StepValue::LossScaled(v)) => Arg::Scaled(v),
            })
            .collect();
        Call::Kernel { name: l.name, grid: l.grid, block: l.block, smem: l.smem, args }
    }
}

/// Runs one training graph on a GPU (see the module comment).
pub struct GpuExecutor<D: GpuDevice> {
    dev: D,
    graph: Graph,
    plan: Plan,
    /// Before the nodes: the status block's bad-id flag zeroed.
    reset: Vec<Call>,
    /// Per executed node: its node index and launches.
    steps: Vec<(usize, Vec<Call>)>,
    /// After the nodes: gradient copies and zeros, the loss into the status block.
    tail: Vec<Call>,
    _arena: D::Buffer,
    /// fp32 master parameters (what the optimizer updates).
    params: D::Buffer,
    /// f16/bf16 graphs: the parameters in the compute dtype, which the graph reads (written by
    /// the optimizer's step as it updates the master); None in fp32.
    compute: Option<D::Buffer>,
    /// Per tensor: its storage dtype ([`support::storage_dtypes`]).
    dtypes: Vec<DType>,
    grads: D::Buffer,
    status: D::Buffer,
    _meta: D::Buffer,
    /// Per graph input: its buffer and byte size.
    inputs: Vec<(D::Buffer, usize)>,
    loss_scale: f32,
    /// Launch argument scratch (no allocation per launch).
    scratch: Vec<KernelArg>,
    flops: f64,
}

impl<D: GpuDevice> std::fmt::Debug for GpuExecutor<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuExecutor({}, {})", self.dev.describe(), self.plan.summary(&self.graph))
    }
}

fn gpu_err(e: GpuError) -> PlanError {
    PlanError::Backend(e.0)
}

impl<D: GpuDevice> GpuExecutor<D> {
    /// Plans `graph` (a training graph) for the GPU kernels and allocates its memory on `dev`;
    /// parameters start at zero ([`GpuExecutor::upload_params`]).
    pub fn new(graph: &Graph, dev: D) -> Result<Self, PlanError> {
        Self::with_flat_len(graph, dev, graph.num_param_elems())
    }

    /// As [`GpuExecutor::new`], with the flat parameter, compute-copy and gradient buffers
    /// `flat_len` ≥ Ψ elements long: ZeRO-1's padding to a multiple of the ranks, which NCCL's
    /// in-place reduce-scatter and all-gather address (`session`). The padding starts at zero
    /// and nothing in a step writes it.
    pub fn with_flat_len(graph: &Graph, dev: D, flat_len: usize) -> Result<Self, PlanError> {
        Self::with_support(graph, dev, flat_len, GpuSupport::for_graph(graph))
    }

    /// As [`GpuExecutor::with_flat_len`], planned with `kernels` (the graph's
    /// [`GpuSupport::for_graph`], a tunable changed: tests shrink the linear cross-entropy's
    /// chunk to run several chunks at small sizes).
    pub fn with_support(
        graph: &Graph,
        dev: D,
        flat_len: usize,
        kernels: GpuSupport,
    ) -> Result<Self, PlanError> {
        let plan = plan::build(graph, &kernels)?;
        let arena = dev.alloc_zeroed(plan.arena_len * 4).map_err(gpu_err)?;
        let n = flat_len.max(graph.num_param_elems());
        let params = dev.alloc_zeroed(n * 4).map_err(gpu_err)?;
        let dtypes = kernels.dtypes.clone();
        let compute = match graph.dtype() {
            DType::F32 => None,
            d => Some(dev.alloc_zeroed(n * d.size()).map_err(gpu_err)?),
        };
        let grads = dev.alloc_zeroed(n * 4).map_err(gpu_err)?;
        let status = dev.alloc_zeroed(status::WORDS * 4).map_err(gpu_err)?;
        let mut inputs = Vec::new();
        for &t in graph.inputs() {
            let info = graph.tensor(t);
            let bytes =
                info.numel() * if info.elem.is_float() { dtypes[t.index()].size() } else { 8 };
            inputs.push((dev.alloc_zeroed(bytes).map_err(gpu_err)?, bytes));
        }
        let bases = Bases {
            arena: dev.address(&arena),
            params: dev.address(compute.as_ref().unwrap_or(&params)),
            grads: dev.address(&grads),
            status: dev.address(&status),
            inputs: inputs.iter().map(|(b, _)| dev.address(b)).collect(),
        };
        // Copy shapes go into one small device array; launches address it by offset, so it is
        // filled first and uploaded once its size is known.
        let mut r = Resolver {
            g: graph,
            plan: &plan,
            b: &bases,
            dts: &dtypes,
            sup: &kernels,
            dev: launch::Device::of(&dev),
            meta: Vec::new(),
            meta_refs: Vec::new(),
            flops: 0.0,
        };
        let mut steps = Vec::with_capacity(plan.steps.len());
        r.check_buffers()?;
        for s in &plan.steps {
            let node = &graph.nodes()[s.node];
            let calls = r.resolve(s.node, node, s.inplace, s.workspace)?;
            steps.push((s.node, calls));
        }
        let mut tail: Vec<Call> = Vec::new();
        let f32_ = DType::F32;
        for &(off, n) in &plan.grad_zeros {
            let out = bases.grads + 4 * off as u64;
            let zero = ew::Fill { dtype: f32_, out, n, value: 0.0, loss_scaled: false };
            tail.push(zero.launch(r.device()).into());
        }
        for &(t, off, len) in &plan.grad_copies {
            if dtypes[t.index()] != DType::F32 {
                return Err(PlanError::Backend(format!("the gradient {t:?} is copied into the gradient buffer from {:?} storage: the GPU executor has no converting strided copy", dtypes[t.index()])));
            }
            let p = &plan.places[t.index()];
            let shape = graph.shape(t);
            let contig = contiguous(shape);
            let meta = r.copy_meta(shape, &p.strides, shape, &contig);
            let (dst, src) = (bases.grads + 4 * off as u64, r.at(t));
            let copy = copy::CopyStrided { dtype: f32_, dst, src, n: len, meta };
            tail.push(copy.launch(r.device()).into());
        }
        // The loss into the status block, the one word the host reads besides the flags.
        let (out, x) = (bases.status + 4 * status::LOSS as u64, r.at(plan.loss));
        tail.push(ew::Scale { dtype: f32_, out, x, n: 1, s: 1.0 }.launch(r.device()).into());

        // The kernels only ever set the bad-id flag: each step zeroes it first.
        let flag = bases.status + 4 * status::BAD_ID as u64;
        let zero = ew::Fill { dtype: DType::F32, out: flag, n: 1, value: 0.0, loss_scaled: false };
        let reset = vec![zero.launch(r.device()).into()];

        let meta_bytes: Vec<u8> = r.meta.iter().flat_map(|v| v.to_le_bytes()).collect();
        let meta = dev.alloc_zeroed(meta_bytes.len().max(8)).map_err(gpu_err)?;
        let meta_base = dev.address(&meta);
        // SAFETY: `meta` holds exactly these bytes.
        unsafe { dev.upload(meta_base, &meta_bytes) }.map_err(gpu_err)?;
        let refs = std::mem::take(&mut r.meta_refs);
        let flops = r.flops;
        for calls in steps.iter_mut().map(|(_, c)| c).chain([&mut tail]) {
            for c in calls.iter_mut() {
                if let Call::Kernel { args, .. } = c {
                    for a in args.iter_mut() {
                        if let Arg::K(KernelArg::Ptr(p)) = a {
                            if let Some(i) =
                                p.checked_sub(META_TAG).filter(|i| (*i as usize) < refs.len())
                            {
                                *a = ptr(meta_base + 8 * refs[i as usize] as u64);
                            }
                        }
                    }
                }
            }
        }
        Ok(GpuExecutor {
            dev,
            graph: graph.clone(),
            plan,
            reset,
            steps,
            tail,
            _arena: arena,
            params,
            compute,
            dtypes,
            grads,
            status,
            _meta: meta,
            inputs,
            loss_scale: 1.0,
            scratch: Vec::with_capacity(64),
            flops,
        })
    }

    pub fn device(&self) -> &D {
        &self.dev
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Device addresses of the flat parameter and gradient buffers (fp32, graph order).
    pub fn param_address(&self) -> u64 {
        self.dev.address(&self.params)
    }
    /// The compute-dtype copy of the parameters (f16/bf16 graphs), which the optimizer writes.
    pub fn compute_address(&self) -> Option<u64> {
        self.compute.as_ref().map(|b| self.dev.address(b))
    }
    pub fn grad_address(&self) -> u64 {
        self.dev.address(&self.grads)
    }
    pub fn status_address(&self) -> u64 {
        self.dev.address(&self.status)
    }

    /// Every GEMM a step queues, in order, with its pointers (what cuBLASLt is asked to run:
    /// the alignment test reads them).
    pub fn gemms(&self) -> Vec<(GemmShape, GemmPtrs)> {
        let calls = self.steps.iter().flat_map(|(_, c)| c).chain(&self.tail);
        calls
            .filter_map(|c| match c {
                Call::Gemm(s, p) => Some((*s, *p)),
                Call::Kernel { .. } => None,
            })
            .collect()
    }

    /// FLOPs of a step's GEMMs and attention products (2 per multiply-add; causal attention
    /// counted dense): what the GPU executes, as the CPU's `last_step_flops` without row skips.
    pub fn step_flops(&self) -> f64 {
        self.flops
    }

    /// Copies the host's parameters to the device.
    pub fn upload_params(&self, params: &[f32]) -> Result<(), ExecError> {
        let n = self.graph.num_param_elems();
        if params.len() != n {
            return Err(ExecError::ParamLen { expected: n, got: params.len() });
        }
        // SAFETY: the parameter buffer holds n f32, the compute copy n of its dtype.
        unsafe {
            self.dev.upload(self.param_address(), f32_bytes(params)).map_err(dev_err)?;
            if let Some(c) = self.compute_address() {
                self.dev.upload(c, &to_storage(params, self.graph.dtype())).map_err(dev_err)?;
            }
        }
        Ok(())
    }

    /// The device's parameters (waits for the queued work).
    pub fn download_params(&self) -> Result<Vec<f32>, ExecError> {
        self.download_f32(self.param_address(), self.graph.num_param_elems())
    }

    /// The device's gradients of the last step (waits for the queued work).
    pub fn download_grads(&self) -> Result<Vec<f32>, ExecError> {
        self.download_f32(self.grad_address(), self.graph.num_param_elems())
    }

    fn download_f32(&self, addr: u64, n: usize) -> Result<Vec<f32>, ExecError> {
        let mut bytes = vec![0u8; n * 4];
        // SAFETY: `addr` is one of this executor's buffers of at least n f32.
        unsafe { self.dev.download(addr, &mut bytes) }.map_err(dev_err)?;
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// The status block (waits for the queued work): see [`status`].
    pub fn read_status(&self) -> Result<[f32; status::WORDS], ExecError> {
        let v = self.download_f32(self.status_address(), status::WORDS)?;
        let mut s = [0f32; status::WORDS];
        s.copy_from_slice(&v);
        Ok(s)
    }

    /// Seeds the next steps' backward with `scale` instead of 1 (see the CPU executor's
    /// `set_loss_scale`).
    pub fn set_loss_scale(&mut self, scale: f32) {
        self.loss_scale = scale;
    }

    /// Queues one forward + backward: gradients land in the gradient buffer, the loss in the
    /// status block. Nothing is waited for; [`GpuExecutor::finish_step`] reads the result.
    pub fn queue_step(&mut self, inputs: &Inputs<'_>, seed: u64) -> Result<(), ExecError> {
        self.bind(inputs)?;
        let reset = std::mem::take(&mut self.reset);
        let (steps, tail) = (std::mem::take(&mut self.steps), std::mem::take(&mut self.tail));
        let nodes = steps.iter().map(|(n, c)| (Some(*n), c));
        let mut res = Ok(());
        'run: for (node, calls) in [(None, &reset)].into_iter().chain(nodes).chain([(None, &tail)])
        {
            for c in calls {
                if let Err(e) = self.run(c, seed) {
                    res = Err(match node {
                        Some(i) => ExecError::Device(format!(
                            "node {i} ({}): {}",
                            self.graph.nodes()[i].op.name(),
                            e.0
                        )),
                        None => dev_err(e),
                    });
                    break 'run;
                }
            }
        }
        self.reset = reset;
        self.steps = steps;
        self.tail = tail;
        res
    }

    /// Reads the step's status; an out-of-range id or label is named from the host's inputs.
    pub fn finish_step(&self, inputs: &Inputs<'_>) -> Result<[f32; status::WORDS], ExecError> {
        let s = self.read_status()?;
        if s[status::BAD_ID].to_bits() != 0 {
            return Err(self.explain_bad_ids(inputs));
        }
        Ok(s)
    }

    /// One step, waited for: the loss (gradients stay on the device).
    pub fn train_step(&mut self, inputs: &Inputs<'_>, seed: u64) -> Result<f32, ExecError> {
        self.queue_step(inputs, seed)?;
        Ok(self.finish_step(inputs)?[status::LOSS])
    }

    fn run(&mut self, c: &Call, seed: u64) -> Result<(), GpuError> {
        match c {
            Call::Kernel { name, grid, block, smem, args } => {
                self.scratch.clear();
                self.scratch.extend(args.iter().map(|a| match *a {
                    Arg::K(k) => k,
                    Arg::Seed => KernelArg::U64(seed),
                    Arg::Scaled(v) => KernelArg::F32(v * self.loss_scale),
                }));
                // SAFETY: resolved against the plan: every pointer is inside its buffer.
                unsafe { self.dev.launch(name, *grid, *block, *smem, &self.scratch) }
            }
            // SAFETY: as above.
            Call::Gemm(s, p) => unsafe { self.dev.gemm(s, p) },
        }
    }

    fn bind(&mut self, inputs: &Inputs<'_>) -> Result<(), ExecError> {
        let g = &self.graph;
        if let Some(name) =
            inputs.names().find(|n| !g.inputs().iter().any(|&t| g.input_name(t) == Some(n)))
        {
            let declared: Vec<&str> = g.inputs().iter().filter_map(|&t| g.input_name(t)).collect();
            return Err(ExecError::UnknownInput {
                name: name.to_string(),
                declared: declared.join(", "),
            });
        }
        for (k, &t) in g.inputs().iter().enumerate() {
            let info = g.tensor(t);
            let TensorKind::Input { name } = &info.kind else {
                unreachable!("graph inputs are Input tensors")
            };
            let data = inputs.get(name).ok_or_else(|| ExecError::MissingInput(name.clone()))?;
            let expected = || {
                format!(
                    "{} {} ({} elements)",
                    crate::graph::fmt_shape(&info.shape),
                    info.elem,
                    info.numel()
                )
            };
            let converted;
            let (bytes, got): (&[u8], usize) = match data {
                InputData::Ids(d) if !info.elem.is_float() => (i64_bytes(d), d.len()),
                InputData::Floats(d) if info.elem.is_float() => {
                    converted = to_storage(d, self.dtypes[t.index()]);
                    (&converted[..], d.len())
                }
                InputData::Ids(d) => {
                    return Err(ExecError::BadInput {
                        name: name.clone(),
                        expected: expected(),
                        got: format!("{} i64 ids", d.len()),
                    })
                }
                InputData::Floats(d) => {
                    return Err(ExecError::BadInput {
                        name: name.clone(),
                        expected: expected(),
                        got: format!("{} floats", d.len()),
                    })
                }
            };
            if got != info.numel() {
                return Err(ExecError::BadInput {
                    name: name.clone(),
                    expected: expected(),
                    got: format!("{got} elements"),
                });
            }
            let (buf, size) = &self.inputs[k];
            debug_assert_eq!(bytes.len(), *size);
            // SAFETY: the input's buffer holds exactly its bytes.
            unsafe { self.dev.upload(self.dev.address(buf), bytes) }.map_err(dev_err)?;
        }
        Ok(())
    }

    /// The kernels flagged an id or label out of range: find and name it on the host, as the
    /// CPU kernels' checks do.
    fn explain_bad_ids(&self, inputs: &Inputs<'_>) -> ExecError {
        let g = &self.graph;
        let ids_of = |t: TensorId| {
            g.input_name(t).and_then(|n| inputs.get(n)).and_then(|d| match d {
                InputData::Ids(d) => Some(d),
                InputData::Floats(_) => None,
            })
        };
        for (i, node) in g.nodes().iter().enumerate() {
            let res = match node.op {
                Op::Embedding => ids_of(node.inputs[1])
                    .map(|ids| embedding::check_ids(ids, g.shape(node.inputs[0])[0])),
                Op::CrossEntropy(CrossEntropy { ignore_index }) => {
                    ids_of(node.inputs[1]).map(|l| {
                        cross_entropy::check_labels(
                            l,
                            *g.shape(node.inputs[0]).last().unwrap_or(&1),
                            ignore_index,
                        )
                        .map(|_| ())
                    })
                }
                Op::LinearCrossEntropy(LinearCrossEntropy { ignore_index })
                | Op::LinearCrossEntropyBackward(LinearCrossEntropyBackward { ignore_index }) => {
                    let at = usize::from(matches!(node.op, Op::LinearCrossEntropyBackward(_)));
                    let v = g.shape(node.inputs[at + 1])[0];
                    ids_of(node.inputs[at + 2])
                        .map(|l| cross_entropy::check_labels(l, v, ignore_index).map(|_| ()))
                }
                // The only ops that index with ids: embedding rows and (linear) cross-entropy
                // labels.
                _ => None,
            };
            if let Some(Err(source)) = res {
                return ExecError::Op { node: i, op: node.op.name(), source };
            }
        }
        dev_err(GpuError(
            "a kernel flagged an id or label out of range, but the host found none in the inputs"
                .into(),
        ))
    }
}

fn dev_err(e: GpuError) -> ExecError {
    ExecError::Device(e.0)
}

/// Base addresses the resolver turns places into.
struct Bases {
    arena: u64,
    params: u64,
    grads: u64,
    status: u64,
    inputs: Vec<u64>,
}

/// Pointer arguments at or above this tag are indices into the copy-shape array, patched to
/// its device address once it is uploaded (no real address is this high on a 48-bit VA).
const META_TAG: u64 = 0xfff0_0000_0000_0000;

fn ptr(a: u64) -> Arg {
    Arg::K(KernelArg::Ptr(a))
}

fn contiguous(shape: &[usize]) -> Vec<usize> {
    plan::layout::contiguous_strides(shape).into_iter().map(|s| s as usize).collect()
}

/// `v` stored in `d`, little-endian bytes (f16/bf16 rounded to nearest even).
fn to_storage(v: &[f32], d: DType) -> Vec<u8> {
    match d {
        DType::F32 => f32_bytes(v).to_vec(),
        DType::F16 => v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
        DType::BF16 => v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
    }
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
fn i64_bytes(v: &[i64]) -> &[u8] {
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// Element strides of a broadcast operand of shape `m` against the 4-D `full` shape it is
/// right-aligned to: 0 on a dim of size 1 (or a missing leading dim).
fn broadcast_strides4(m: &[usize], full: [usize; 4]) -> [i64; 4] {
    let own = contiguous(m);
    let mut s = [0i64; 4];
    for d in 0..4 {
        let k = (d + m.len()).checked_sub(4);
        if let Some(k) = k {
            if m[k] != 1 && m[k] == full[d] {
                s[d] = own[k] as i64;
            }
        }
    }
    s
}

/// Turns plan steps into launches.
struct Resolver<'a> {
    g: &'a Graph,
    plan: &'a Plan,
    b: &'a Bases,
    dts: &'a [DType],
    /// The kernel rules the plan was made with (the linear cross-entropy's workspace layout).
    sup: &'a GpuSupport,
    /// The device's geometry, as the typed launchers take it.
    dev: launch::Device,
    /// The copy-shape array and, per reference, its start (in i64 words).
    meta: Vec<i64>,
    meta_refs: Vec<usize>,
    flops: f64,
}

impl Resolver<'_> {
    /// What the typed launchers' geometry depends on.
    fn device(&self) -> launch::Device {
        self.dev
    }

    /// Bytes per element of `t` as stored.
    fn es(&self, t: TensorId) -> u64 {
        self.plan.elem_bytes[t.index()] as u64
    }

    /// Device address of tensor `t`. The plan's offsets count 4-byte elements; a tensor in an
    /// arena buffer starts at the buffer's byte offset plus its own element offset within the
    /// buffer times its element size (every tensor of a buffer has one dtype: `check_buffers`).
    fn at(&self, t: TensorId) -> u64 {
        let p: &Place = &self.plan.places[t.index()];
        let es = self.es(t);
        match p.root {
            Root::Arena => {
                let b = &self.plan.buffers
                    [self.plan.buffer_of[t.index()].expect("arena tensors have a buffer")];
                self.b.arena + 4 * b.offset as u64 + es * (p.offset - b.offset) as u64
            }
            Root::Param => self.b.params + es * p.offset as u64,
            Root::Grad => self.b.grads + 4 * p.offset as u64,
            Root::Input(k) => self.b.inputs[k] + es * p.offset as u64,
        }
    }

    /// Every arena buffer holds tensors of one storage dtype, so element offsets within it mean
    /// the same bytes to all of them.
    fn check_buffers(&self) -> Result<(), PlanError> {
        // The flat gradient buffer is f32: a tensor placed in it (a view of a gradient, or an
        // in-place merge) must be stored so.
        for (t, p) in self.plan.places.iter().enumerate() {
            let d = self.dts[t];
            if p.root == Root::Grad && self.g.tensors()[t].elem.is_float() && d != DType::F32 {
                return Err(PlanError::Backend(format!(
                    "%{t} is placed in the f32 gradient buffer but stored in {d:?}"
                )));
            }
        }
        for b in &self.plan.buffers {
            let mut d = b
                .tensors
                .iter()
                .filter(|&&t| self.g.tensor(t).elem.is_float())
                .map(|&t| self.dts[t.index()]);
            if let Some(first) = d.next() {
                if let Some(other) = d.find(|&x| x != first) {
                    return Err(PlanError::Backend(format!("an arena buffer holds {first:?} and {other:?} tensors ({:?}): the GPU executor needs one dtype per buffer", b.tensors)));
                }
            }
        }
        Ok(())
    }

    fn strides(&self, t: TensorId) -> &[usize] {
        &self.plan.places[t.index()].strides
    }

    /// Registers a copy_strided meta ([`copy::copy_meta`]) and returns its (tagged) address.
    fn copy_meta(&mut self, ss: &[usize], st: &[usize], ds: &[usize], dt: &[usize]) -> u64 {
        self.add_meta(copy::copy_meta(ss, st, ds, dt))
    }

    /// Registers a fill_strided meta ([`copy::fill_meta`]) and returns its (tagged) address.
    fn fill_meta(&mut self, shape: &[usize], strides: &[usize]) -> u64 {
        self.add_meta(copy::fill_meta(shape, strides))
    }

    fn add_meta(&mut self, m: Vec<i64>) -> u64 {
        self.meta_refs.push(self.meta.len());
        self.meta.extend(m);
        META_TAG + (self.meta_refs.len() - 1) as u64
    }

    /// The GEMM of a matmul plan over operands a, b (same dtype) into c (theirs, or f32 for a
    /// parameter's gradient).
    fn gemm(
        &mut self,
        m: &MatMulPlan,
        (a, b, c): (TensorId, TensorId, TensorId),
        no: &dyn Fn(&str) -> PlanError,
    ) -> Result<Call, PlanError> {
        let d = (self.dts[a.index()], self.dts[b.index()], self.dts[c.index()]);
        self.gemm_at(m, d, (self.at(a), self.at(b), self.at(c)), no)
    }

    /// [`Resolver::gemm`] with the operands' dtypes and addresses given.
    fn gemm_at(
        &mut self,
        m: &MatMulPlan,
        (da, db, dc): (DType, DType, DType),
        (pa, pb, pc): (u64, u64, u64),
        no: &dyn Fn(&str) -> PlanError,
    ) -> Result<Call, PlanError> {
        // A batch must be one arithmetic progression per operand (strided batched GEMM).
        let stride = |f: &dyn Fn(&(usize, usize, usize)) -> usize| -> Option<i64> {
            let o: Vec<i64> = m.offs.iter().map(|x| f(x) as i64).collect();
            let s = if o.len() > 1 { o[1] - o[0] } else { 0 };
            o.windows(2).all(|w| w[1] - w[0] == s).then_some(s)
        };
        let (sa, sb, sc) = match (stride(&|x| x.0), stride(&|x| x.1), stride(&|x| x.2)) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => return Err(no(" for a batched matmul whose batches are not evenly strided")),
        };
        if da != db || (dc != da && dc != DType::F32) {
            return Err(no(&format!(" for operands in {da:?} and {db:?} into {dc:?}")));
        }
        let dtype = match da {
            DType::F32 => GemmDtype::F32 { tf32: false },
            DType::F16 => GemmDtype::F16,
            DType::BF16 => GemmDtype::BF16,
        };
        let (o0a, o0b, o0c) = m.offs[0];
        self.flops += 2.0 * (m.m * m.n * m.k * m.offs.len()) as f64;
        let shape = GemmShape {
            dtype,
            ta: m.ta,
            tb: m.tb,
            m: m.m as u64,
            n: m.n as u64,
            k: m.k as u64,
            lda: m.lda as i64,
            ldb: m.ldb as i64,
            ldc: m.ldc as i64,
            batch: m.offs.len() as i32,
            stride_a: sa,
            stride_b: sb,
            stride_c: sc,
            epilogue: Epilogue::None,
            c_f32: dc != da,
        };
        let ptrs = GemmPtrs {
            a: pa + da.size() as u64 * o0a as u64,
            b: pb + db.size() as u64 * o0b as u64,
            c: pc + dc.size() as u64 * o0c as u64,
            bias: 0,
            aux: 0,
        };
        Ok(Call::Gemm(shape, ptrs))
    }

    /// A plain row-major GEMM C (m, n) = op(A)·op(B) over dense operands of storage `ab`, C in
    /// f32 (the linear cross-entropy's: logits, dx rows and dw, accumulated in f32); with
    /// `accumulate`, C += the product. A one-matrix plan through [`Resolver::gemm_at`].
    fn gemm2(
        &mut self,
        ab: DType,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        (lda, ldb, ldc): (usize, usize, usize),
        (a, b, c): (u64, u64, u64),
        accumulate: bool,
    ) -> Call {
        let plan = MatMulPlan { m, n, k, ta, tb, lda, ldb, ldc, offs: vec![(0, 0, 0)] };
        // One matrix is evenly strided, and (ab, ab) into f32 is a supported mix.
        let no = |why: &str| -> PlanError { unreachable!("a dense {ab:?} GEMM into f32{why}") };
        match self.gemm_at(&plan, (ab, ab, DType::F32), (a, b, c), &no) {
            Ok(Call::Gemm(shape, ptrs)) if accumulate => {
                Call::Gemm(GemmShape { epilogue: Epilogue::Accumulate, ..shape }, ptrs)
            }
            Ok(call) => call,
            Err(e) => unreachable!("{e}"),
        }
    }

    /// (b, h, t) strides of a (B, H, T, D) operand with unit last stride.
    fn strides3(&self, t: TensorId) -> [i64; 3] {
        let s = self.strides(t);
        [0, 1, 2].map(|i| s[i] as i64)
    }

    fn resolve(
        &mut self,
        i: usize,
        node: &Node,
        inplace: Option<usize>,
        ws: Option<(usize, usize)>,
    ) -> Result<Vec<Call>, PlanError> {
        let g = self.g;
        let no = |why: &str| PlanError::NoKernel {
            node: i,
            op: node.op.name(),
            backend: "gpu",
            why: why.to_string(),
        };
        let (ins, outs) = (&node.inputs, &node.outputs);
        let n = |t: TensorId| g.tensor(t).numel();
        let last = |t: TensorId| *g.shape(t).last().unwrap_or(&1);
        let ws = ws.map(|(o, _)| self.b.arena + 4 * o as u64);
        let ws_at = || ws.expect("the plan gives this kernel its workspace");
        let (ia, oa): (Vec<u64>, Vec<u64>) =
            (ins.iter().map(|&t| self.at(t)).collect(), outs.iter().map(|&t| self.at(t)).collect());
        let inp = |k: usize| ia[k];
        let out = |k: usize| oa[k];
        let dt = |t: TensorId| self.dts[t.index()];
        let dts = self.dts;
        let es = |t: TensorId| {
            if g.tensor(t).elem.is_float() {
                dts[t.index()].size() as u64
            } else {
                8
            }
        };
        // Elementwise kernels read and write one dtype.
        let same = |ts: &[TensorId]| -> Result<(), PlanError> {
            let d = dt(ts[0]);
            match ts.iter().find(|&&t| g.tensor(t).elem.is_float() && dt(t) != d) {
                Some(&t) => Err(no(&format!(
                    " for {:?} mixed with {d:?} ({t:?}, {:?} {})",
                    dt(t),
                    g.tensor(t).kind,
                    g.tensor(t).elem
                ))),
                None => Ok(()),
            }
        };
        if let Some(k) = inplace {
            same(&[outs[0], ins[k]])?;
        }
        let err = self.b.status + 4 * status::BAD_ID as u64;
        let calls = match &node.op {
            Op::Fill(Fill { value }) => {
                let o = outs[0];
                let is_seed =
                    matches!(g.tensor(o).kind, TensorKind::Grad(l) if Some(l) == g.loss());
                let p = self.plan.places[o.index()].clone();
                let sh = g.shape(o);
                if p.strides == contiguous(sh) {
                    let (dtype, n, value) = (dt(o), n(o), *value);
                    let fill = ew::Fill { dtype, out: out(0), n, value, loss_scaled: is_seed };
                    vec![fill.launch(self.device()).into()]
                } else {
                    let meta = self.fill_meta(sh, &p.strides);
                    let (dtype, n, value) = (dt(o), n(o), *value);
                    let fill = copy::FillStrided {
                        dtype,
                        dst: out(0),
                        n,
                        meta,
                        value,
                        loss_scaled: is_seed,
                    };
                    vec![fill.launch(self.device()).into()]
                }
            }
            Op::Embedding => {
                same(&[outs[0], ins[0]])?;
                let (v, c) = (g.shape(ins[0])[0], g.shape(ins[0])[1]);
                let (dtype, ids, table, n) = (dt(outs[0]), inp(1), inp(0), n(ins[1]));
                let l = emb::EmbeddingForward {
                    dtype,
                    out: out(0),
                    err: Some(err),
                    ids,
                    table,
                    n,
                    c,
                    v,
                };
                vec![l.launch(self.device()).into()]
            }
            Op::EmbeddingBackward => {
                let (o, dout) = (outs[0], ins[1]);
                let (v, c) = (g.shape(o)[0], g.shape(o)[1]);
                // The scatter writes f32: into the output if it is stored so, else into the
                // workspace and then cast (a half part of a tied table's gradient).
                let target = if dt(o) == DType::F32 {
                    out(0)
                } else {
                    ws.ok_or_else(|| no(" without its f32 workspace"))?
                };
                let (dtype, ids, dout, n_) = (dt(dout), inp(0), inp(1), n(ins[0]));
                let l = emb::EmbeddingBackward {
                    dtype,
                    dtable: target,
                    err: Some(err),
                    ids,
                    dout,
                    n: n_,
                    c,
                    v,
                };
                let mut v_ = vec![l.launch(self.device()).into()];
                if dt(o) != DType::F32 {
                    let (from, to, n) = (DType::F32, dt(o), n(o));
                    let cast = ew::Cast { from, to, out: out(0), x: target, n };
                    v_.push(cast.launch(self.device()).into());
                }
                v_
            }
            Op::MatMul(MatMul { ta, tb }) => {
                let (a, b, c) = (ins[0], ins[1], outs[0]);
                let m = MatMulPlan::new(
                    *ta,
                    *tb,
                    (g.shape(a), self.strides(a)),
                    (g.shape(b), self.strides(b)),
                    (g.shape(c), self.strides(c)),
                )
                .ok_or_else(|| no(" for these operand layouts"))?;
                if dt(a) == dt(b) {
                    vec![self.gemm(&m, (a, b, c), &no)?]
                } else {
                    // An f32 operand of a half product (BERT's stop-gradient is a LayerNorm's
                    // f32 mean): cast into the workspace, the CPU's rounding of what it reads.
                    let (f, h) = if dt(a) == DType::F32 { (a, b) } else { (b, a) };
                    if !g.tensor(f).elem.is_float()
                        || self.strides(f) != contiguous(g.shape(f))
                        || dt(c) != dt(h)
                    {
                        return Err(no(&format!(
                            " for operands in {:?} and {:?} into {:?}",
                            dt(a),
                            dt(b),
                            dt(c)
                        )));
                    }
                    let w = ws.ok_or_else(|| no(" without the workspace for its cast operand"))?;
                    let src = if f == a { inp(0) } else { inp(1) };
                    let cast = ew::Cast { from: DType::F32, to: dt(h), out: w, x: src, n: n(f) };
                    let cast = cast.launch(self.device()).into();
                    let (pa, pb) = if f == a { (w, inp(1)) } else { (inp(0), w) };
                    vec![cast, self.gemm_at(&m, (dt(h), dt(h), dt(c)), (pa, pb, out(0)), &no)?]
                }
            }
            Op::Linear(Linear { tb, gelu }) => {
                let (x, w) = (ins[0], ins[1]);
                let c = outs[usize::from(gelu.is_some())];
                same(&[outs[0], x, w, ins[2], c])?;
                let m = MatMulPlan::new(
                    false,
                    *tb,
                    (g.shape(x), self.strides(x)),
                    (g.shape(w), self.strides(w)),
                    (g.shape(c), self.strides(c)),
                )
                .ok_or_else(|| no(" for these operand layouts"))?;
                let cols = last(outs[0]);
                let rows = n(outs[0]) / cols.max(1);
                let gemm = self.gemm(&m, (x, w, c), &no)?;
                let dtype = dt(outs[0]);
                let epi = match gelu {
                    Some(a) => ew::BiasGelu {
                        dtype,
                        y: out(0),
                        pre: out(1),
                        bias: inp(2),
                        rows,
                        c: cols,
                        approx: *a,
                    }
                    .launch(self.device()),
                    None => ew::Add {
                        dtype,
                        to_f32: false,
                        out: out(0),
                        a: out(0),
                        b: inp(2),
                        n: n(outs[0]),
                        nb: cols,
                    }
                    .launch(self.device()),
                };
                vec![gemm, epi.into()]
            }
            Op::BiasAdd | Op::Add => {
                let (len, nb) = (n(outs[0]), n(ins[1]));
                if nb == 0 || len % nb != 0 {
                    return Err(no(" for an operand that does not tile the output"));
                }
                same(&[ins[0], ins[1]])?;
                let o = match inplace {
                    Some(k) => inp(k),
                    None => out(0),
                };
                // Two half parts summed into a parameter's f32 gradient (tied weights).
                let to_f32 = if dt(outs[0]) == dt(ins[0]) {
                    false
                } else if dt(outs[0]) == DType::F32 {
                    true
                } else {
                    return Err(no(" for f32 operands into a half output"));
                };
                let (a, b) = (inp(0), inp(1));
                let add = ew::Add { dtype: dt(ins[0]), to_f32, out: o, a, b, n: len, nb };
                vec![add.launch(self.device()).into()]
            }
            Op::Scale(Scale { s }) => {
                same(&[outs[0], ins[0]])?;
                let o = if inplace.is_some() { inp(0) } else { out(0) };
                let scale =
                    ew::Scale { dtype: dt(outs[0]), out: o, x: inp(0), n: n(outs[0]), s: *s };
                vec![scale.launch(self.device()).into()]
            }
            Op::Tanh => {
                same(&[outs[0], ins[0]])?;
                let o = if inplace.is_some() { inp(0) } else { out(0) };
                let tanh = ew::TanhForward { dtype: dt(outs[0]), y: o, x: inp(0), n: n(outs[0]) };
                vec![tanh.launch(self.device()).into()]
            }
            Op::TanhBackward | Op::GeluBackward(_) => {
                same(&[outs[0], ins[0], ins[1]])?;
                let o = if inplace.is_some() { inp(1) } else { out(0) };
                let (dtype, n, dev) = (dt(outs[0]), n(outs[0]), self.device());
                let l = match &node.op {
                    Op::GeluBackward(GeluBackward { approx }) => {
                        let (dx, x, dy, approx) = (o, inp(0), inp(1), *approx);
                        ew::GeluBackward { dtype, dx, x, dy, n, approx }.launch(dev)
                    }
                    // Op::TanhBackward, the arm's other op.
                    _ => ew::TanhBackward { dtype, dx: o, y: inp(0), dy: inp(1), n }.launch(dev),
                };
                vec![l.into()]
            }
            Op::Unary(Unary { f }) => {
                same(&[outs[0], ins[0]])?;
                let y = if inplace.is_some() { inp(0) } else { out(0) };
                let (f, dtype, n) = (*f, dt(outs[0]), n(outs[0]));
                vec![pw::Unary { f, dtype, y, x: inp(0), n }.launch(self.device()).into()]
            }
            Op::UnaryBackward(UnaryBackward { f }) => {
                same(&[outs[0], ins[0], ins[1]])?;
                let dx = if inplace.is_some() { inp(1) } else { out(0) };
                let (f, dtype, n) = (*f, dt(outs[0]), n(outs[0]));
                let l = pw::UnaryBackward { f, dtype, dx, x: inp(0), dy: inp(1), n };
                vec![l.launch(self.device()).into()]
            }
            Op::Binary(Binary { f }) => {
                let (len, nb) = (n(outs[0]), n(ins[1]));
                if nb == 0 || len % nb != 0 {
                    return Err(no(" for an operand that does not tile the output"));
                }
                same(&[outs[0], ins[0], ins[1]])?;
                let o = match inplace {
                    Some(k) => inp(k),
                    None => out(0),
                };
                let (f, dtype, a, b) = (*f, dt(outs[0]), inp(0), inp(1));
                vec![pw::Binary { f, dtype, out: o, a, b, n: len, nb }.launch(self.device()).into()]
            }
            Op::Dropout(Dropout { p, offset }) => {
                same(&[outs[0], ins[0]])?;
                let o = if inplace.is_some() { inp(0) } else { out(0) };
                let (dtype, n, p, offset) = (dt(outs[0]), n(outs[0]), *p, *offset);
                let seed = ew::Seed::Step;
                let drop = ew::Dropout { dtype, out: o, x: inp(0), n, p, seed, offset };
                vec![drop.launch(self.device()).into()]
            }
            Op::LayerNorm(LayerNorm { eps }) => {
                same(&[outs[0], ins[0], ins[1], ins[2]])?;
                let c = last(ins[0]);
                let rows = n(ins[0]) / c;
                let (y, mean, rstd, x, w, b) = (out(0), out(1), out(2), inp(0), inp(1), inp(2));
                let dtype = dt(outs[0]);
                let l = ln::LayerNormForward { dtype, y, mean, rstd, x, w, b, rows, c, eps: *eps };
                vec![l.launch(self.device()).into()]
            }
            Op::AddLayerNorm(AddLayerNorm { eps }) => {
                same(&[outs[0], outs[1], ins[0], ins[1], ins[2], ins[3]])?;
                let c = last(ins[0]);
                let rows = n(ins[0]) / c;
                // The sum may overwrite a dying operand: the kernel allows it over `a`, and the
                // sum commutes, so that operand goes first.
                let (sum, a, b) = match inplace {
                    Some(k) => (inp(k), inp(k), inp(1 - k)),
                    None => (out(0), inp(0), inp(1)),
                };
                let l = ln::AddLayerNormForward {
                    dtype: dt(outs[1]),
                    sum,
                    y: out(1),
                    mean: out(2),
                    rstd: out(3),
                    a,
                    b,
                    w: inp(2),
                    bias: inp(3),
                    rows,
                    c,
                    eps: *eps,
                };
                vec![l.launch(self.device()).into()]
            }
            Op::LayerNormBackward => {
                same(&[outs[0], ins[0], ins[1], ins[2]])?;
                let c = n(ins[2]);
                let rows = n(ins[0]) / c;
                let chunks = support::chunks(rows);
                let ws = ws_at();
                let (dy, x, mean, rstd) = (inp(0), inp(1), inp(3), inp(4));
                let dev = self.device();
                // dw's partials, then db's, in the workspace: (2, chunks, c) f32.
                let (dw_ws, db_ws) = (ws, ws + 4 * (chunks * c) as u64);
                let dtype = dt(outs[0]);
                let dx = ln::LayerNormBackwardDx {
                    dtype,
                    dx: out(0),
                    dy,
                    x,
                    w: inp(2),
                    mean,
                    rstd,
                    rows,
                    c,
                };
                let dwdb =
                    ln::LayerNormBackwardDwdb { dtype: dt(ins[0]), ws, dy, x, mean, rstd, rows, c };
                let dw = reduce::ColumnSumFinish {
                    dtype: dt(outs[1]),
                    out: out(1),
                    ws: dw_ws,
                    chunks,
                    c,
                };
                let db = reduce::ColumnSumFinish {
                    dtype: dt(outs[2]),
                    out: out(2),
                    ws: db_ws,
                    chunks,
                    c,
                };
                vec![
                    dx.launch(dev).into(),
                    dwdb.launch(dev).into(),
                    dw.launch(dev).into(),
                    db.launch(dev).into(),
                ]
            }
            Op::ReduceSumLeading => {
                let c = n(outs[0]);
                let rows = n(ins[0]) / c.max(1);
                let (ws, dev) = (ws_at(), self.device());
                let part = reduce::ColumnSumPartial { dtype: dt(ins[0]), ws, x: inp(0), rows, c };
                let chunks = support::chunks(rows);
                let fin =
                    reduce::ColumnSumFinish { dtype: dt(outs[0]), out: out(0), ws, chunks, c };
                vec![part.launch(dev).into(), fin.launch(dev).into()]
            }
            Op::Softmax(Softmax { scale, causal }) => {
                same(&[outs[0], ins[0]])?;
                if let Some(&m) = ins.get(1) {
                    same(&[ins[0], m])?;
                }
                let s = g.shape(ins[0]);
                let r = s.len();
                let ncol = s[r - 1];
                let rows = n(ins[0]) / ncol;
                let tq = if r >= 2 { s[r - 2] } else { 1 };
                let h = if r >= 3 { s[r - 3] } else { 1 };
                let full = [rows / (h * tq).max(1), h, tq, ncol];
                let mask = ins.get(1).map(|&m| launch::Mask {
                    mask: self.at(m),
                    strides: broadcast_strides4(g.shape(m), full),
                });
                let l = sm::SoftmaxForward {
                    dtype: dt(outs[0]),
                    y: out(0),
                    x: inp(0),
                    mask,
                    rows,
                    n: ncol,
                    scale: *scale,
                    causal: *causal,
                    h,
                    tq,
                };
                vec![l.launch(self.device()).into()]
            }
            Op::SoftmaxBackward(SoftmaxBackward { scale }) => {
                same(&[outs[0], ins[0], ins[1]])?;
                let ncol = last(ins[0]);
                let rows = n(ins[0]) / ncol;
                let o = if inplace.is_some() { inp(1) } else { out(0) };
                let (dtype, y, dy, scale) = (dt(outs[0]), inp(0), inp(1), *scale);
                let l = sm::SoftmaxBackward { dtype, dx: o, y, dy, rows, n: ncol, scale };
                vec![l.launch(self.device()).into()]
            }
            Op::Reshape | Op::Permute(_) => {
                // Materialised (the plan could not fold it): a strided copy.
                let (x, o) = (ins[0], outs[0]);
                same(&[x, o])?;
                let xs = g.shape(x).to_vec();
                let (ss, st) = match &node.op {
                    Op::Permute(Permute { perm }) => (
                        perm.iter().map(|&p| xs[p]).collect::<Vec<_>>(),
                        perm.iter().map(|&p| self.strides(x)[p]).collect::<Vec<_>>(),
                    ),
                    // Op::Reshape, the arm's other op: the input as it is.
                    _ => (xs, self.strides(x).to_vec()),
                };
                let (ds, dst) = (g.shape(o).to_vec(), self.strides(o).to_vec());
                let meta = self.copy_meta(&ss, &st, &ds, &dst);
                let copy =
                    copy::CopyStrided { dtype: dt(o), dst: out(0), src: inp(0), n: n(o), meta };
                vec![copy.launch(self.device()).into()]
            }
            Op::Split(Split { sizes }) => {
                let x = ins[0];
                let xst = self.strides(x).to_vec();
                let ls = *xst.last().unwrap_or(&0) as u64;
                let mut start = 0u64;
                let mut v = Vec::new();
                for (k, (&o, &sz)) in outs.iter().zip(sizes).enumerate() {
                    same(&[x, o])?;
                    let os = g.shape(o).to_vec();
                    let ost = self.strides(o).to_vec();
                    let meta = self.copy_meta(&os, &xst, &os, &ost);
                    let src = inp(0) + es(x) * start * ls;
                    let copy = copy::CopyStrided { dtype: dt(o), dst: out(k), src, n: n(o), meta };
                    v.push(copy.launch(self.device()).into());
                    start += sz as u64;
                }
                v
            }
            Op::Concat => {
                let o = outs[0];
                let ost = self.strides(o).to_vec();
                let ls = *ost.last().unwrap_or(&0) as u64;
                let mut start = 0u64;
                let mut v = Vec::new();
                for (k, &x) in ins.iter().enumerate() {
                    same(&[x, o])?;
                    let xs = g.shape(x).to_vec();
                    let xst = self.strides(x).to_vec();
                    let meta = self.copy_meta(&xs, &xst, &xs, &ost);
                    let dst = out(0) + es(o) * start * ls;
                    let copy = copy::CopyStrided { dtype: dt(o), dst, src: inp(k), n: n(x), meta };
                    v.push(copy.launch(self.device()).into());
                    start += last(x) as u64;
                }
                v
            }
            Op::Attention(Attention { scale, causal, dropout_p, offset })
            | Op::AttentionBackward(AttentionBackward { scale, causal, dropout_p, offset }) => {
                use crate::ops::attention::{backward_slot as bs, slot as fs};
                let fwd = matches!(node.op, Op::Attention(_));
                let (q, k, v) = if fwd {
                    (ins[fs::Q], ins[fs::K], ins[fs::V])
                } else {
                    (ins[bs::Q], ins[bs::K], ins[bs::V])
                };
                let mask = if fwd { ins.get(fs::MASK) } else { ins.get(bs::MASK) }.copied();
                let mut all = vec![q, k, v];
                all.extend(mask);
                if fwd {
                    all.push(outs[0]);
                } else {
                    all.extend([ins[bs::DOUT], ins[bs::OUT], outs[0], outs[1], outs[2]]);
                }
                same(&all)?;
                let (sq, sk, sv) = (g.shape(q), g.shape(k), g.shape(v));
                let (b, h, tq, tk, d, dv) = (sq[0], sq[1], sq[2], sk[2], sq[3], sv[3]);
                let dims = attn::Dims { b, h, tq, tk, d, dv };
                let mask = mask.map(|m| launch::Mask {
                    mask: self.at(m),
                    strides: broadcast_strides4(g.shape(m), [b, h, tq, tk]),
                });
                let (scale, causal, dropout_p, offset) = (*scale, *causal, *dropout_p, *offset);
                let scores =
                    attn::Scores { scale, causal, dropout_p, seed: launch::Seed::Step, offset };
                // The forward's products; the backward's are twice those, plus the recomputed
                // scores.
                let mm = 2.0 * (b * h * tq * tk) as f64 * (d + dv) as f64;
                self.flops += if fwd { mm } else { 2.0 * mm + 2.0 * (b * h * tq * tk * d) as f64 };
                // Tensor t at address `at` with its (b, h, t) strides.
                let st = |t: TensorId, at: u64| attn::Strided { at, strides: self.strides3(t) };
                let (dtype, dev) = (dt(q), self.device());
                let no_tiles = |e: attn::NoTiles| no(&format!(" for {e}"));
                if fwd {
                    let l = attn::AttentionForward {
                        dtype,
                        out: st(outs[0], out(0)),
                        lse: out(1),
                        q: st(q, inp(fs::Q)),
                        k: st(k, inp(fs::K)),
                        v: st(v, inp(fs::V)),
                        mask,
                        dims,
                        scores,
                    };
                    vec![l.launch(dev).map_err(no_tiles)?.into()]
                } else {
                    // The backward: dq (and D) first, then dk and dv reading D.
                    let (dout, fo) = (ins[bs::DOUT], ins[bs::OUT]);
                    let delta = ws_at();
                    let (q, k, v, dout) = (
                        st(q, inp(bs::Q)),
                        st(k, inp(bs::K)),
                        st(v, inp(bs::V)),
                        st(dout, inp(bs::DOUT)),
                    );
                    // The CPU's probabilities slot holds the rows' log-sum-exp on the GPU.
                    let lse = inp(bs::PROBS);
                    let dq = attn::AttentionBackwardDq {
                        dtype,
                        dq: st(outs[0], out(0)),
                        delta,
                        dout,
                        out: st(fo, inp(bs::OUT)),
                        q,
                        k,
                        v,
                        mask,
                        lse,
                        dims,
                        scores,
                    };
                    let dkdv = attn::AttentionBackwardDkdv {
                        dtype,
                        dk: st(outs[1], out(1)),
                        dv: st(outs[2], out(2)),
                        dout,
                        q,
                        k,
                        v,
                        mask,
                        lse,
                        delta,
                        dims,
                        scores,
                    };
                    vec![
                        dq.launch(dev).map_err(no_tiles)?.into(),
                        dkdv.launch(dev).map_err(no_tiles)?.into(),
                    ]
                }
            }
            Op::CrossEntropy(CrossEntropy { ignore_index }) => {
                let v = last(ins[0]);
                let rows = n(ins[0]) / v;
                // Per-row losses in the workspace, then their mean into the loss.
                let (losses, logits, labels, ignore_index) =
                    (ws_at(), inp(0), inp(1), *ignore_index);
                let (dtype, dev) = (dt(ins[0]), self.device());
                let fwd = ce::CrossEntropyForward {
                    dtype,
                    losses,
                    err: Some(err),
                    logits,
                    labels,
                    rows,
                    v,
                    ignore_index,
                };
                let mean =
                    ce::CrossEntropyMean { loss: out(0), losses, labels, rows, ignore_index };
                vec![fwd.launch(dev).into(), mean.launch(dev).into()]
            }
            Op::CrossEntropyBackward(CrossEntropyBackward { ignore_index }) => {
                same(&[outs[0], ins[1]])?;
                if dt(ins[0]) != DType::F32 {
                    return Err(no(" for a non-f32 loss gradient"));
                }
                let v = last(ins[1]);
                let rows = n(ins[1]) / v;
                // The count of labelled rows in the workspace, then dlogits dividing by it.
                let (count, labels, ignore_index) = (ws_at(), inp(2), *ignore_index);
                let o = if inplace.is_some() { inp(1) } else { out(0) };
                let (dtype, dev) = (dt(outs[0]), self.device());
                let cnt = ce::CrossEntropyCount { count, labels, rows, ignore_index };
                let bwd = ce::CrossEntropyBackward {
                    dtype,
                    dlogits: o,
                    err: Some(err),
                    logits: inp(1),
                    labels,
                    dloss: inp(0),
                    count,
                    rows,
                    v,
                    ignore_index,
                };
                vec![cnt.launch(dev).into(), bwd.launch(dev).into()]
            }
            Op::LinearCrossEntropy(LinearCrossEntropy { ignore_index })
            | Op::LinearCrossEntropyBackward(LinearCrossEntropyBackward { ignore_index }) => {
                // linear_cross_entropy.cu's launches around three GEMMs per chunk (see there):
                // the labelled rows compacted on the device, then ⌈rows / k⌉ chunks of their
                // positions (those past the count are zero rows), then the mean.
                let bwd = matches!(node.op, Op::LinearCrossEntropyBackward(_));
                let at = usize::from(bwd);
                let (x, w) = (ins[at], ins[at + 1]);
                let (v, c) = (g.shape(w)[0], g.shape(w)[1]);
                let rows = n(ins[at + 2]);
                let lw = self.sup.lce_workspace(g, i);
                let base = ws_at();
                let wa = |o: usize| base + 4 * o as u64;
                let t = dt(x);
                let (idx, count, losses, logits, xs) =
                    (wa(lw.idx), wa(lw.count), wa(lw.losses), wa(lw.logits), wa(lw.xs));
                let (xp, wp, labels, ignore_index) =
                    (inp(at), inp(at + 1), inp(at + 2), *ignore_index);
                let bias = ins.get(at + 3).map(|_| inp(at + 3));
                let dev = self.device();
                let compact =
                    lce::LceCompact { idx, count, err: Some(err), labels, rows, v, ignore_index };
                let mut calls: Vec<Call> = vec![compact.launch(dev).into()];
                // Gradient targets: dw and dbias accumulate in f32, in their outputs when
                // stored so (parameters' gradients), else in the workspace and cast at the end.
                let dw = lw.dw.map_or_else(|| if bwd { out(2) } else { 0 }, wa);
                let db = if outs.len() > 3 { Some(lw.db.map_or_else(|| out(3), wa)) } else { None };
                if bwd {
                    let (dtype, n) = (dt(outs[1]), n(outs[1]));
                    let zero = ew::Fill { dtype, out: out(1), n, value: 0.0, loss_scaled: false };
                    calls.push(zero.launch(dev).into());
                }
                // f32 GEMMs read g in place in the logits; half ones its copy in T.
                let gp = lw.g16.map_or(logits, wa);
                for (ci, start) in (0..rows).step_by(lw.k).enumerate() {
                    let k = lw.k.min(rows - start);
                    let gather = lce::LceGather { dtype: t, xs, x: xp, idx, count, start, k, c };
                    calls.push(gather.launch(dev).into());
                    // logits (k, V) = xs (k, C) · wᵀ
                    calls.push(self.gemm2(
                        t,
                        (false, true),
                        (k, v, c),
                        (c, c, v),
                        (xs, wp, logits),
                        false,
                    ));
                    let rows_pass = lce::LceRows {
                        dtype: t,
                        logits,
                        g16: lw.g16.map(wa),
                        losses,
                        err: Some(err),
                        labels,
                        idx,
                        count,
                        bias,
                        dloss: bwd.then(|| inp(0)),
                        start,
                        k,
                        v,
                        ignore_index,
                    };
                    calls.push(rows_pass.launch(dev).into());
                    if !bwd {
                        continue;
                    }
                    // dx rows (k, C) = g (k, V) · w (V, C), scattered to their rows.
                    let dxs = wa(lw.dxs.expect("the backward's workspace has dx rows"));
                    calls.push(self.gemm2(
                        t,
                        (false, false),
                        (k, c, v),
                        (v, c, c),
                        (gp, wp, dxs),
                        false,
                    ));
                    let scatter = lce::LceScatter {
                        dtype: dt(outs[1]),
                        dx: out(1),
                        dxs,
                        idx,
                        count,
                        start,
                        k,
                        c,
                    };
                    calls.push(scatter.launch(dev).into());
                    // dw (V, C) (+)= gᵀ (V, k) · xs (k, C): β = 1 after the first chunk.
                    calls.push(self.gemm2(
                        t,
                        (true, false),
                        (v, c, k),
                        (v, c, c),
                        (gp, xs, dw),
                        ci > 0,
                    ));
                    if let Some(db) = db {
                        let sum = lce::LceColumnSum { db, g: logits, k, v, accumulate: ci > 0 };
                        calls.push(sum.launch(dev).into());
                    }
                }
                let mean =
                    ce::CrossEntropyMean { loss: out(0), losses, labels, rows, ignore_index };
                calls.push(mean.launch(dev).into());
                for (acc, o) in [(lw.dw, 2), (lw.db, 3)] {
                    if let (Some(a), true) = (acc, bwd) {
                        let cast = ew::Cast {
                            from: DType::F32,
                            to: dt(outs[o]),
                            out: out(o),
                            x: wa(a),
                            n: n(outs[o]),
                        };
                        calls.push(cast.launch(dev).into());
                    }
                }
                calls
            }
            // The passes fuse GELU into its linear layer; `GpuSupport::check` refuses the rest.
            Op::Gelu(_) => return Err(no(": gelu has no GPU launch outside a linear layer")),
            // `GpuSupport::check` refuses these (no GPU kernels yet); never a silent fallback.
            Op::RmsNorm(_) | Op::RmsNormBackward | Op::AddRmsNorm(_) | Op::Rotary(_) => {
                return Err(no(&format!(": {} has no GPU kernel yet", node.op.name())))
            }
        };
        Ok(calls)
    }
}
