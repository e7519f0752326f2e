//! The GPU executor: a training graph's plan walked on a [`GpuDevice`], one kernel launch (or
//! GEMM) per executed node, nothing synchronised inside a step.
//!
//! At build it plans the graph with the GPU kernels' requirements ([`support::GpuSupport`]),
//! allocates every buffer once — the planned arena, the flat parameter and gradient buffers,
//! one buffer for the step's inputs, a small array of copy shapes, a status block — and
//! resolves each step to launches with every address, size, stride and tile fixed. What
//! changes from step to step (the dropout seed, the loss scale, the optimizer's scalars) is
//! read by the kernels from the step block, uploaded with the inputs from pinned memory in one
//! asynchronous copy ([`step_block`]): a step's launches are the same every step, so a session
//! can capture them once as a CUDA graph and replay it (`session`). The host reads back one
//! status block per step (loss, bad-id flag, and from the optimizer the gradient norm, finite
//! flag and clip coefficient), the only synchronisation.
//!
//! The same executor runs on an NVIDIA GPU (`backend::cuda`) and, in the tests, on the host
//! SIMT harness with a host GEMM, where it is checked against the CPU engine
//! (`tests/tests/gpu_executor.rs`): the device path, not only each kernel, runs in CI.
//!
//! The kernels and the CPU kernels they must match are `engine/kernels/*.cu`; a linear layer's
//! bias and tanh GELU ride cuBLASLt's epilogues (`launch/gemm.rs`), and so does the tanh GELU's
//! backward (DGELU) where it follows a GEMM; the host GEMM of the SIMT device implements them
//! too.
//!
//! Precision: fp32, or f16/bf16 storage with f32 arithmetic in every kernel, fp32 master
//! parameters with a compute-dtype copy the graph reads (written by the optimizer's step), f32
//! parameter gradients (half GEMM operands into an f32 C for dW), f32 loss, seed, layer_norm
//! statistics and attention's softmax statistics ([`support::storage_dtypes`]) — the same rounding
//! points as the CPU executor's f16/bf16 mode, so the two are compared in tests. The plan sizes
//! buffers by each tensor's element bytes, so half activations take half the arena.

pub mod kernel;
pub mod launch;
pub mod session;
pub mod step_block;
pub mod support;

use crate::backend::cpu::kernels::matmul::MatMulPlan;
use crate::backend::gpu::{
    Epilogue, GemmDtype, GemmPtrs, GemmShape, GpuDevice, GpuError, KernelArg,
};
use crate::exec::{ExecError, InputData, Inputs};
use crate::graph::{Graph, Node, TensorId, TensorKind};
use crate::plan::{self, Place, Plan, PlanError, Root};
use crate::DType;
use launch::{copy, elementwise as ew};
pub use step_block::StepBlock;
use step_block::StepInputs;
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

/// One queued operation of a step, every argument fixed at build: what changes from step to
/// step is read from the step block ([`StepBlock`]).
#[derive(Debug, Clone)]
pub enum Call {
    Kernel { name: String, grid: u32, block: u32, smem: u32, args: Vec<KernelArg> },
    Gemm(GemmShape, GemmPtrs),
}

impl From<launch::Launch<u64>> for Call {
    fn from(l: launch::Launch<u64>) -> Call {
        let args = l.args.iter().map(launch::Arg::kernel_arg).collect();
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
    /// The step block and the graph's inputs, uploaded together each step.
    step_in: StepInputs<D>,
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
        let sizes: Vec<usize> = graph
            .inputs()
            .iter()
            .map(|&t| {
                let info = graph.tensor(t);
                info.numel() * if info.elem.is_float() { dtypes[t.index()].size() } else { 8 }
            })
            .collect();
        let step_in = StepInputs::new(&dev, &sizes).map_err(gpu_err)?;
        let bases = Bases {
            arena: dev.address(&arena),
            params: dev.address(compute.as_ref().unwrap_or(&params)),
            grads: dev.address(&grads),
            status: dev.address(&status),
            step: step_in.block_address(&dev),
            inputs: (0..sizes.len()).map(|k| step_in.input_address(&dev, k)).collect(),
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
            dgelu: launch::gemm::dgelu_pairs(graph, &plan),
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
            let zero = ew::Fill { dtype: f32_, out, n, value: 0.0, scaled_by: None };
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
        let zero = ew::Fill { dtype: DType::F32, out: flag, n: 1, value: 0.0, scaled_by: None };
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
                        if let KernelArg::Ptr(p) = a {
                            if let Some(i) =
                                p.checked_sub(META_TAG).filter(|i| (*i as usize) < refs.len())
                            {
                                *p = meta_base + 8 * refs[i as usize] as u64;
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
            step_in,
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
    /// The step block's device address ([`StepBlock`]).
    pub fn step_block_address(&self) -> u64 {
        self.step_in.block_address(&self.dev)
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

    /// Queues one forward + backward, seeded with 1 (a session seeds it with its loss scale
    /// through the step block: [`GpuExecutor::upload_step`]): gradients land in the gradient
    /// buffer, the loss in the status block. Nothing is waited for;
    /// [`GpuExecutor::finish_step`] reads the result.
    pub fn queue_step(&mut self, inputs: &Inputs<'_>, seed: u64) -> Result<(), ExecError> {
        let block = StepBlock { seed, loss_scale: 1.0, ..StepBlock::default() };
        self.upload_step(inputs, &block)?;
        self.queue_calls()
    }

    /// Writes `inputs` and `block` into the next pinned image and queues its upload: what the
    /// step's launches ([`GpuExecutor::queue_calls`], or a replay of them) read.
    pub fn upload_step(&mut self, inputs: &Inputs<'_>, block: &StepBlock) -> Result<(), ExecError> {
        self.bind(inputs)?;
        self.step_in.upload(&self.dev, block).map_err(dev_err)
    }

    /// Queues the forward's and backward's launches and GEMMs, as resolved at build (a device
    /// capturing records them).
    pub fn queue_calls(&self) -> Result<(), ExecError> {
        let nodes = self.steps.iter().map(|(n, c)| (Some(*n), c));
        let all = [(None, &self.reset)].into_iter().chain(nodes).chain([(None, &self.tail)]);
        for (node, calls) in all {
            for c in calls {
                self.run(c).map_err(|e| match node {
                    Some(i) => ExecError::Device(format!(
                        "node {i} ({}): {}",
                        self.graph.nodes()[i].op.name(),
                        e.0
                    )),
                    None => dev_err(e),
                })?;
            }
        }
        Ok(())
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

    fn run(&self, c: &Call) -> Result<(), GpuError> {
        match c {
            Call::Kernel { name, grid, block, smem, args } => {
                // SAFETY: resolved against the plan: every pointer is inside its buffer.
                unsafe { self.dev.launch(name, *grid, *block, *smem, args) }
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
            debug_assert_eq!(bytes.len(), self.step_in.input_bytes(k));
            self.step_in.input_mut(k).copy_from_slice(bytes);
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
            let ids = |slot: usize| node.inputs.get(slot).copied().and_then(ids_of);
            if let Err(source) = node.op.def().check_ids(g, node, &ids) {
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
pub(crate) struct Bases {
    arena: u64,
    params: u64,
    grads: u64,
    status: u64,
    /// The step block ([`StepBlock`]).
    step: u64,
    inputs: Vec<u64>,
}

/// Pointer arguments at or above this tag are indices into the copy-shape array, patched to
/// its device address once it is uploaded (no real address is this high on a 48-bit VA).
const META_TAG: u64 = 0xfff0_0000_0000_0000;

pub(crate) fn contiguous(shape: &[usize]) -> Vec<usize> {
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
pub(crate) fn broadcast_strides4(m: &[usize], full: [usize; 4]) -> [i64; 4] {
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
pub struct Resolver<'a> {
    pub(crate) g: &'a Graph,
    pub(crate) plan: &'a Plan,
    pub(crate) b: &'a Bases,
    pub(crate) dts: &'a [DType],
    /// The kernel rules the plan was made with (the linear cross-entropy's workspace layout).
    pub(crate) sup: &'a GpuSupport,
    /// The device's geometry, as the typed launchers take it.
    pub(crate) dev: launch::Device,
    /// The copy-shape array and, per reference, its start (in i64 words).
    pub(crate) meta: Vec<i64>,
    pub(crate) meta_refs: Vec<usize>,
    pub(crate) flops: f64,
    /// GEMMs that take a GELU backward into their DGELU epilogue: (MatMul node, GELU
    /// backward node, pre-activation) ([`launch::gemm::dgelu_pairs`]).
    pub(crate) dgelu: Vec<(usize, usize, TensorId)>,
}

impl Resolver<'_> {
    /// What the typed launchers' geometry depends on.
    pub(crate) fn device(&self) -> launch::Device {
        self.dev
    }

    /// The step block's device address: dropout seeds and the backward's loss scale are read
    /// from it ([`StepBlock`]).
    pub(crate) fn step_block(&self) -> u64 {
        self.b.step
    }

    /// The pre-activation's address when MatMul node `i` takes a GELU backward into its DGELU
    /// epilogue.
    pub(crate) fn dgelu_aux(&self, i: usize) -> Option<u64> {
        self.dgelu.iter().find(|d| d.0 == i).map(|d| self.at(d.2))
    }

    /// Whether node `i` (a GELU backward) runs in a GEMM's epilogue.
    pub(crate) fn in_epilogue(&self, i: usize) -> bool {
        self.dgelu.iter().any(|d| d.1 == i)
    }

    /// Bytes per element of `t` as stored.
    pub(crate) fn es(&self, t: TensorId) -> u64 {
        self.plan.elem_bytes[t.index()] as u64
    }

    /// Device address of tensor `t`. The plan's offsets count 4-byte elements; a tensor in an
    /// arena buffer starts at the buffer's byte offset plus its own element offset within the
    /// buffer times its element size (every tensor of a buffer has one dtype: `check_buffers`).
    pub(crate) fn at(&self, t: TensorId) -> u64 {
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
    pub(crate) fn check_buffers(&self) -> Result<(), PlanError> {
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

    pub(crate) fn strides(&self, t: TensorId) -> &[usize] {
        &self.plan.places[t.index()].strides
    }

    /// Registers a copy_strided meta ([`copy::copy_meta`]) and returns its (tagged) address.
    pub(crate) fn copy_meta(
        &mut self,
        ss: &[usize],
        st: &[usize],
        ds: &[usize],
        dt: &[usize],
    ) -> u64 {
        self.add_meta(copy::copy_meta(ss, st, ds, dt))
    }

    /// Registers a fill_strided meta ([`copy::fill_meta`]) and returns its (tagged) address.
    pub(crate) fn fill_meta(&mut self, shape: &[usize], strides: &[usize]) -> u64 {
        self.add_meta(copy::fill_meta(shape, strides))
    }

    pub(crate) fn add_meta(&mut self, m: Vec<i64>) -> u64 {
        self.meta_refs.push(self.meta.len());
        self.meta.extend(m);
        META_TAG + (self.meta_refs.len() - 1) as u64
    }

    /// The GEMM of a matmul plan over operands a, b (same dtype) into c (theirs, or f32 for a
    /// parameter's gradient).
    pub(crate) fn gemm(
        &mut self,
        m: &MatMulPlan,
        (a, b, c): (TensorId, TensorId, TensorId),
        no: &dyn Fn(&str) -> PlanError,
    ) -> Result<Call, PlanError> {
        let d = (self.dts[a.index()], self.dts[b.index()], self.dts[c.index()]);
        self.gemm_at(m, d, (self.at(a), self.at(b), self.at(c)), no)
    }

    /// [`Resolver::gemm`] with the operands' dtypes and addresses given.
    pub(crate) fn gemm_at(
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
    pub(crate) fn gemm2(
        &mut self,
        ab: DType,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        (lda, ldb, ldc): (usize, usize, usize),
        (a, b, c): (u64, u64, u64),
        accumulate: bool,
    ) -> Call {
        let plan = MatMulPlan {
            m,
            n,
            k,
            ta,
            tb,
            lda,
            ldb,
            ldc,
            offs: vec![(0, 0, 0)],
            kind: Default::default(),
        };
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
    pub(crate) fn strides3(&self, t: TensorId) -> [i64; 3] {
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
        let ws = ws.map(|(o, _)| self.b.arena + 4 * o as u64);
        let cx = kernel::NodeCx {
            g,
            node,
            i,
            inplace,
            ws,
            ia: node.inputs.iter().map(|&t| self.at(t)).collect(),
            oa: node.outputs.iter().map(|&t| self.at(t)).collect(),
            err: self.b.status + 4 * status::BAD_ID as u64,
            dts: self.dts,
        };
        if let Some(k) = inplace {
            cx.same(&[node.outputs[0], node.inputs[k]])?;
        }
        node.op.def().launches(self, &cx)
    }
}
