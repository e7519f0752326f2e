//! The planned executor: the engine's fast path on CPU (its GPU counterpart is [`super::gpu`]).
//!
//! At build time it plans the training graph ([`crate::plan`]: schedule, views folded, places in
//! the parameter/gradient buffers and in one arena sized to the planned peak), allocates that
//! arena once, and resolves every executed node to a kernel with its sizes and strides
//! precomputed (GEMM offsets, attention strides, mask broadcasts). A step then walks the
//! steps, computes pointers from (root, offset) and calls one kernel per node — no heap
//! allocation after the first step (`engine/tests/no_alloc.rs`), no copies for reshapes, head
//! permutes, q/k/v splits or gradient concats, parameter gradients written straight into the
//! flat gradient buffer. Rows a cross-entropy ignores cost nothing in the LM head's GEMMs when
//! the labels are sparse (masked LM: `plan::rows`, off with `ORTBENCH_ROW_SKIP=0`).
//!
//! Its measured speed against PyTorch is in README and `docs/measurements.md`.
//!
//! The fused ops of `crate::passes` run here too: `linear` as the GEMM followed by one
//! epilogue pass over its rows (bias, or bias + GELU keeping the pre-activation), and
//! `add_layernorm` adding and normalising each row in one pass (its sum may overwrite a dying
//! operand).
//!
//! Extending it with a fused op: add the op to [`CpuSupport::check`] (and its layout
//! requirements / in-place slots / workspace if any), and one arm in [`PlannedExecutor::exec`]
//! calling its kernel. An op without a kernel is a [`PlanError::NoKernel`] when the executor is
//! built, naming the node and op — never a silent fallback.
//!
//! Threads: kernels run on the process-wide [`Pool`] (workers created once, spin-then-park).

use crate::backend::cpu::kernels::attention::AttnPlan;
use crate::backend::cpu::kernels::matmul::{self, MatMulPlan};
use crate::backend::cpu::kernels::softmax::MaskMap;
use crate::backend::cpu::kernels::{copy, layernorm, linear_cross_entropy as lce, rmsnorm};
use crate::backend::cpu::pool::Pool;
use crate::exec::{profile, ExecError, InputData, Inputs};
use crate::graph::op::{Attention, AttentionBackward, Linear, MatMul};
use crate::graph::{ElemType, Graph, Node, Op, TensorId, TensorKind};
use crate::ops::OpError;
use crate::plan::rows::{self, RowPlan, RowUse};
use crate::plan::{self, KernelSupport, Place, Plan, PlanError, Root};
use crate::DType;

/// What the CPU kernels accept (see [`KernelSupport`]).
#[derive(Debug, Clone)]
pub struct CpuSupport {
    pub threads: usize,
    /// Row-restricted nodes (`plan::rows`), whose kernels need gather workspaces.
    pub rows: RowPlan,
}

impl CpuSupport {
    /// Kernels without row skipping.
    pub fn new(threads: usize) -> Self {
        CpuSupport { threads: threads.max(1), rows: RowPlan::default() }
    }

    /// KernelSupport for `g`, with its row analysis unless `ORTBENCH_ROW_SKIP=0`.
    pub fn for_graph(g: &Graph, threads: usize) -> Self {
        let rows = if rows::enabled() { rows::analyze(g) } else { RowPlan::default() };
        CpuSupport { threads: threads.max(1), rows }
    }

    fn row_use(&self, node: usize) -> Option<(usize, RowUse)> {
        self.rows.nodes.get(node).copied().flatten()
    }
}

impl KernelSupport for CpuSupport {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn check(&self, g: &Graph, node: usize) -> Result<(), PlanError> {
        let n = &g.nodes()[node];
        let err = |why: String| PlanError::NoKernel { node, op: n.op.name(), backend: "cpu", why };
        match &n.op {
            Op::Fill(_)
            | Op::Embedding
            | Op::MatMul(_)
            | Op::BiasAdd
            | Op::Add
            | Op::Scale(_)
            | Op::Gelu(_)
            | Op::Tanh
            | Op::LayerNorm(_)
            | Op::RmsNorm(_)
            | Op::Rotary(_)
            | Op::Softmax(_)
            | Op::Dropout(_)
            | Op::Reshape
            | Op::Permute(_)
            | Op::Split(_)
            | Op::Concat
            | Op::CrossEntropy(_)
            | Op::EmbeddingBackward
            | Op::ReduceSumLeading
            | Op::GeluBackward(_)
            | Op::TanhBackward
            | Op::LayerNormBackward
            | Op::RmsNormBackward
            | Op::SoftmaxBackward(_)
            | Op::CrossEntropyBackward(_)
            | Op::LinearCrossEntropy(_)
            | Op::LinearCrossEntropyBackward(_)
            | Op::Linear(_)
            | Op::AddLayerNorm(_)
            | Op::AddRmsNorm(_)
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::UnaryBackward(_) => {}
            Op::Attention(_) | Op::AttentionBackward(_) => {
                use crate::ops::attention::{backward_slot, slot};
                let q = if matches!(n.op, Op::Attention(_)) { slot::Q } else { backward_slot::Q };
                if g.shape(n.inputs[q]).len() != 4 {
                    return Err(err(" for a non-4-D attention".into()));
                }
            }
        }
        if n.outputs.iter().any(|&o| g.shape(o).len() > 8) {
            return Err(err(" for tensors of more than 8 dims".into()));
        }
        Ok(())
    }

    fn reads(&self, g: &Graph, node: usize, slot: usize) -> bool {
        // The attention backward's forward output and mask: read by the GPU kernels only (the
        // CPU kernel reads the saved probabilities).
        use crate::ops::attention::backward_slot as s;
        !(matches!(g.nodes()[node].op, Op::AttentionBackward(_)) && slot >= s::OUT)
    }

    fn workspace(&self, g: &Graph, node: usize) -> usize {
        let n = &g.nodes()[node];
        let t = self.threads;
        if let (Some((_, u)), Op::MatMul(MatMul { ta, .. })) = (self.row_use(node), &n.op) {
            let (sa, so) = (g.shape(n.inputs[0]), g.shape(n.outputs[0]));
            let (m, nn) = (so[so.len() - 2], so[so.len() - 1]);
            let k = if *ta { sa[sa.len() - 2] } else { sa[sa.len() - 1] };
            // Dead/Zero run on the flattened rows of the output; SparseK contracts over k rows.
            let rows = g.tensor(n.outputs[0]).numel() / nn.max(1);
            return matmul::rows_workspace(u, if u == RowUse::SparseK { m } else { rows }, nn, k);
        }
        match n.op {
            Op::LayerNormBackward => {
                layernorm::backward_workspace(t, *g.shape(n.inputs[2]).first().unwrap_or(&1))
            }
            Op::RmsNormBackward => {
                rmsnorm::backward_workspace(t, *g.shape(n.inputs[2]).first().unwrap_or(&1))
            }
            Op::CrossEntropy(_) => g.tensor(n.inputs[1]).numel(),
            // One chunk of logits, gathered rows, dx rows and row losses.
            Op::LinearCrossEntropy(_) | Op::LinearCrossEntropyBackward(_) => {
                let x = if matches!(n.op, Op::LinearCrossEntropy(_)) { 0 } else { 1 };
                let (c, v) = (g.shape(n.inputs[x + 1])[1], g.shape(n.inputs[x + 1])[0]);
                let rows = g.tensor(n.inputs[x + 2]).numel();
                lce::workspace(rows, c, v, lce::chunk_rows(v, t))
            }
            Op::Attention(Attention { dropout_p, .. }) if dropout_p > 0.0 => {
                let p = g.shape(n.outputs[1]);
                t * p[2] * p[3]
            }
            Op::AttentionBackward(_) => {
                let p = g.shape(n.inputs[crate::ops::attention::backward_slot::PROBS]);
                2 * t * p[2] * p[3]
            }
            Op::Attention(_)
            | Op::Fill(_)
            | Op::Embedding
            | Op::MatMul(_)
            | Op::BiasAdd
            | Op::Add
            | Op::Scale(_)
            | Op::Gelu(_)
            | Op::Tanh
            | Op::LayerNorm(_)
            | Op::RmsNorm(_)
            | Op::Rotary(_)
            | Op::Softmax(_)
            | Op::Dropout(_)
            | Op::Reshape
            | Op::Permute(_)
            | Op::Split(_)
            | Op::Concat
            | Op::Linear(_)
            | Op::AddLayerNorm(_)
            | Op::AddRmsNorm(_)
            | Op::EmbeddingBackward
            | Op::ReduceSumLeading
            | Op::GeluBackward(_)
            | Op::TanhBackward
            | Op::SoftmaxBackward(_)
            | Op::CrossEntropyBackward(_)
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::UnaryBackward(_) => 0,
        }
    }
}

/// Kernel data resolved at build time, per step.
#[derive(Debug, Clone)]
pub enum Aux {
    None,
    /// The product, and the row set it may restrict itself to.
    MatMul(MatMulPlan, Option<(usize, RowUse)>),
    /// A sum over rows that may skip the rows outside a row set.
    RowSum(usize),
    Attn(Box<AttnPlan>),
    Mask(MaskMap),
}

#[derive(Debug, Clone)]
pub struct Resolved {
    pub node: usize,
    pub inplace: Option<usize>,
    pub ws: Option<(usize, usize)>,
    pub aux: Aux,
    /// The profile key: the op name, matmuls by flags (as the reference executor's).
    pub key: String,
    /// f16/bf16 graphs: the outputs to round to the storage dtype after the kernel, with the
    /// element extent of each (see [`PlannedExecutor::new`]).
    pub round: Vec<(TensorId, usize)>,
}

/// 64-byte aligned, zero-initialised f32 memory: the arena.
struct Arena {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: plain owned memory, written only through `&mut PlannedExecutor`.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl Arena {
    fn new(len: usize) -> Arena {
        if len == 0 {
            return Arena { ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0 };
        }
        let layout =
            std::alloc::Layout::from_size_align(len * 4, 64).expect("arena size overflows");
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut f32;
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Arena { ptr, len }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `new` with this layout.
            unsafe {
                std::alloc::dealloc(
                    self.ptr as *mut u8,
                    std::alloc::Layout::from_size_align(self.len * 4, 64).expect("layout"),
                )
            };
        }
    }
}

/// A bound step input.
#[derive(Debug, Clone, Copy)]
pub(crate) enum In {
    Ids(*const i64, usize),
    Floats(*const f32),
}

// SAFETY: the pointers are only dereferenced inside `train_step`, during the borrow of the
// caller's inputs they were bound from; between steps they are stale and unused.
unsafe impl Send for In {}
unsafe impl Sync for In {}

/// Runs one training graph on its plan with the fast CPU kernels.
pub struct PlannedExecutor {
    graph: Graph,
    pub(crate) plan: Plan,
    steps: Vec<Resolved>,
    arena: Arena,
    pool: &'static Pool,
    /// Bound inputs of the current step (capacity reserved at build: no allocation per step).
    bound: Vec<In>,
    /// Row sets (`plan::rows`) and this step's selected rows of each (capacity reserved).
    pub(crate) row_sets: Vec<rows::RowSet>,
    pub(crate) sel: Vec<Vec<u32>>,
    /// The node seeding the backward with d(loss)/d(loss) = 1, and the loss scale it seeds
    /// instead (dynamic loss scaling: the whole backward then runs on scaled values).
    pub(crate) seed_node: Option<usize>,
    pub(crate) loss_scale: f32,
    /// GEMM FLOPs the linear + cross-entropy nodes ran in the last step (their labelled rows
    /// are known only at run time).
    pub(crate) lce_flops: std::sync::atomic::AtomicU64,
    /// `plan::rows::enabled()`: the fused LM head leaves unlabelled rows out of its GEMMs.
    pub(crate) row_skip: bool,
}

impl std::fmt::Debug for PlannedExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PlannedExecutor({})", self.plan.summary(&self.graph))
    }
}

/// Raw bases of the step's buffers.
#[derive(Clone, Copy)]
pub(crate) struct Mem<'a> {
    arena: *mut f32,
    params: *const f32,
    grads: *mut f32,
    inputs: &'a [In],
}

impl PlannedExecutor {
    /// Plans `graph` (a training graph) and allocates its arena.
    ///
    /// f16/bf16 graphs compute in f32 like f32 ones, and every f16/bf16 activation and
    /// activation gradient is rounded to its dtype as its producer finishes (its elements are
    /// kept in f32 slots; parameters' gradients stay f32): the values, the
    /// overflow to inf past 65504 in f16 and the 8-bit mantissa of bf16 are those of real
    /// half-precision storage, so mixed precision and loss scaling are exercised on the CPU.
    /// What the CPU does not get is the memory saving: that is the GPU backends' storage.
    pub fn new(graph: &Graph) -> Result<Self, PlanError> {
        crate::backend::cpu::blas::check().map_err(|e| PlanError::Backend(e.to_string()))?;
        let pool = Pool::global();
        let kernels = CpuSupport::for_graph(graph, pool.threads());
        let plan = plan::build(graph, &kernels)?;
        // Parameters' gradients stay f32 (the flat fp32 gradient buffer, as PyTorch autocast's
        // fp32 .grad and ORT's fp32 gradient buffers): a GEMM computing dW accumulates in f32
        // and writes it without a round trip through the half dtype.
        let param_grads: std::collections::HashSet<TensorId> =
            (0..graph.params().len()).filter_map(|i| graph.param_grad(i)).collect();
        // Autodiff's seed: the fill whose output is the gradient of the loss itself. It holds
        // the loss scale (2^16 does not fit in f16) and is f32 like the loss.
        let seed_node = graph.loss().and_then(|l| {
            graph.nodes().iter().position(|n| {
                matches!(n.op, Op::Fill(_))
                    && n.outputs.len() == 1
                    && graph.tensor(n.outputs[0]).kind == TensorKind::Grad(l)
            })
        });
        let mut steps = Vec::with_capacity(plan.steps.len());
        for s in &plan.steps {
            let node = &graph.nodes()[s.node];
            let mut aux = resolve(graph, &plan, s.node, node)?;
            // Row restrictions the resolved kernel supports (and whose workspace is planned).
            match (&mut aux, kernels.row_use(s.node)) {
                (Aux::MatMul(m, r), Some((set, u)))
                    if s.workspace.is_some() && m.supports_rows(u, kernels.rows.sets[set].rows) =>
                {
                    *r = Some((set, u))
                }
                (Aux::None, Some((set, RowUse::Skip)))
                    if matches!(node.op, Op::ReduceSumLeading) =>
                {
                    aux = Aux::RowSum(set)
                }
                _ => {}
            }
            let key = match &node.op {
                // ORTBENCH_PROFILE_SHAPES=1: one row per matmul shape (M×N×K, batch).
                Op::MatMul(_) if profile_shapes() => {
                    let Aux::MatMul(m, r) = &aux else { unreachable!("matmuls resolve to a plan") };
                    let rows = r.map_or(String::new(), |(_, u)| format!(" rows:{u:?}"));
                    format!(
                        "matmul {} {}x{}x{} b{}{rows}",
                        node.op.attrs(),
                        m.m,
                        m.n,
                        m.k,
                        m.offs.len()
                    )
                }
                Op::MatMul(_) => format!("matmul {}", node.op.attrs()),
                // Not a dispatch: every other op's profile row is its name.
                op => op.name().to_string(),
            };
            let round = if seed_node == Some(s.node) {
                Vec::new()
            } else {
                node.outputs
                    .iter()
                    .filter(|&&o| {
                        matches!(graph.tensor(o).elem, ElemType::Float(d) if d != DType::F32)
                            && !param_grads.contains(&o)
                    })
                    .map(|&o| {
                        let p = &plan.places[o.index()];
                        let strides: Vec<isize> = p.strides.iter().map(|&x| x as isize).collect();
                        (o, crate::plan::layout::extent(graph.shape(o), &strides) as usize)
                    })
                    .collect()
            };
            steps.push(Resolved {
                node: s.node,
                inplace: s.inplace,
                ws: s.workspace,
                aux,
                key,
                round,
            });
        }

        let arena = Arena::new(plan.arena_len);
        let row_sets = kernels.rows.sets.clone();
        let sel = row_sets.iter().map(|s| Vec::with_capacity(s.rows)).collect();
        Ok(PlannedExecutor {
            graph: graph.clone(),
            plan,
            steps,
            arena,
            pool,
            bound: Vec::with_capacity(graph.inputs().len()),
            row_sets,
            sel,
            seed_node,
            loss_scale: 1.0,
            lce_flops: std::sync::atomic::AtomicU64::new(0),
            row_skip: rows::enabled(),
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Seeds the next steps' backward with `scale` instead of 1: every gradient comes out
    /// multiplied by it, as in a scaled-loss backward (`loss_scale · loss`). Errors when the
    /// graph has no seed this executor can find (then gradients would silently be unscaled).
    pub fn set_loss_scale(&mut self, scale: f32) -> Result<(), ExecError> {
        if self.seed_node.is_none() && scale != 1.0 {
            return Err(ExecError::NotTraining);
        }
        self.loss_scale = scale;
        Ok(())
    }

    /// Steps that may run restricted to a row set (`plan::rows`).
    pub fn row_restricted_steps(&self) -> usize {
        self.steps
            .iter()
            .filter(|r| matches!(r.aux, Aux::MatMul(_, Some(_)) | Aux::RowSum(_)))
            .count()
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// FLOPs of the GEMMs and attention products the last step executed (2 per
    /// multiply-add), with the rows its row sets skipped (`plan::rows`) and causal attention's
    /// skipped blocks left out: the hardware FLOPs behind the harness's HFU. Element-wise work
    /// is not counted, as in the model FLOP count it is compared with.
    pub fn last_step_flops(&self) -> f64 {
        let g = &self.graph;
        self.steps
            .iter()
            .map(|r| match &g.nodes()[r.node].op {
                Op::MatMul(_) | Op::Linear(_) => {
                    let Aux::MatMul(m, rows) = &r.aux else { unreachable!("resolved at build") };
                    let dense = 2.0 * (m.m * m.n * m.k * m.offs.len()) as f64;
                    match rows {
                        Some((set, u))
                            if self.sel[*set].len()
                                <= matmul::row_cap(self.row_sets[*set].rows) =>
                        {
                            let sel = self.sel[*set].len() as f64;
                            match u {
                                RowUse::SparseK => 2.0 * (m.m * m.n) as f64 * sel,
                                _ => 2.0 * (m.n * m.k) as f64 * sel,
                            }
                        }
                        _ => dense,
                    }
                }
                Op::Attention(_) | Op::AttentionBackward(_) => {
                    let Aux::Attn(a) = &r.aux else { unreachable!("resolved at build") };
                    a.executed_flops(matches!(g.nodes()[r.node].op, Op::AttentionBackward(_)))
                }
                // Counted by the kernels' calls (labelled rows only), added once below.
                Op::LinearCrossEntropy(_) | Op::LinearCrossEntropyBackward(_) => 0.0,
                // Element-wise, normalisation, loss and data movement: not counted (above).
                Op::Fill(_)
                | Op::Embedding
                | Op::BiasAdd
                | Op::Add
                | Op::Scale(_)
                | Op::Gelu(_)
                | Op::Tanh
                | Op::LayerNorm(_)
                | Op::RmsNorm(_)
                | Op::Rotary(_)
                | Op::Softmax(_)
                | Op::Dropout(_)
                | Op::Reshape
                | Op::Permute(_)
                | Op::Split(_)
                | Op::Concat
                | Op::CrossEntropy(_)
                | Op::AddLayerNorm(_)
                | Op::AddRmsNorm(_)
                | Op::EmbeddingBackward
                | Op::ReduceSumLeading
                | Op::GeluBackward(_)
                | Op::TanhBackward
                | Op::LayerNormBackward
                | Op::RmsNormBackward
                | Op::SoftmaxBackward(_)
                | Op::CrossEntropyBackward(_)
                | Op::Unary(_)
                | Op::Binary(_)
                | Op::UnaryBackward(_) => 0.0,
            })
            .sum::<f64>()
            + self.lce_flops.load(std::sync::atomic::Ordering::Relaxed) as f64
    }

    /// One training step: forward and backward; every parameter's gradient is written into
    /// `grads` at its (offset, len) — overwriting, zero where the loss does not depend on it —
    /// the pads between parameters are zeroed, and the loss is returned. Same contract as
    /// [`crate::RefExecutor::train_step`].
    pub fn train_step(
        &mut self,
        params: &[f32],
        inputs: &Inputs<'_>,
        seed: u64,
        grads: &mut [f32],
    ) -> Result<f32, ExecError> {
        let n = self.graph.num_param_elems();
        if params.len() != n {
            return Err(ExecError::ParamLen { expected: n, got: params.len() });
        }
        if grads.len() != n {
            return Err(ExecError::GradLen { expected: n, got: grads.len() });
        }
        self.bind(inputs)?;
        self.select_rows();
        *self.lce_flops.get_mut() = 0;
        let g = &self.graph;
        for pad in g.param_pads() {
            grads[pad].fill(0.0);
        }
        let mem = Mem {
            arena: self.arena.ptr,
            params: params.as_ptr(),
            grads: grads.as_mut_ptr(),
            inputs: &self.bound,
        };
        let prof = profile::enabled();
        for r in &self.steps {
            let t0 = prof.then(std::time::Instant::now);
            // SAFETY: the plan gives every tensor a place inside its buffer, kernels write only
            // their outputs, and outputs overlap inputs only where the plan made them in place.
            unsafe { self.exec(r, mem, seed) }.map_err(|source| ExecError::Op {
                node: r.node,
                op: g.nodes()[r.node].op.name(),
                source,
            })?;
            for &(t, len) in &r.round {
                let d = match g.tensor(t).elem {
                    ElemType::Float(d) => d,
                    ElemType::I64 => unreachable!("only float outputs are rounded"),
                };
                // SAFETY: the extent of a planned output lies inside its buffer; elements of
                // the extent that belong to other f16/bf16 tensors are already rounded (rounding
                // is idempotent) or not yet written.
                let base = SyncPtr(mem_ptr(mem, &self.plan.places[t.index()]));
                self.pool.for_ranges(len, 1 << 14, 16, &|rg| {
                    d.round_slice(unsafe {
                        std::slice::from_raw_parts_mut(base.get().add(rg.start), rg.len())
                    })
                });
            }
            if let Some(t0) = t0 {
                profile::record(r.key.clone(), t0.elapsed());
            }
        }
        for &(off, len) in &self.plan.grad_zeros {
            // SAFETY: inside the gradient buffer (checked length).
            unsafe { std::slice::from_raw_parts_mut(mem.grads.add(off), len) }.fill(0.0);
        }
        for &(t, off, len) in &self.plan.grad_copies {
            let p = &self.plan.places[t.index()];
            let shape = g.shape(t);
            let dst_strides = contiguous(shape);
            debug_assert_eq!(len, g.tensor(t).numel());
            // SAFETY: the source is a planned tensor; the destination is the parameter's slot.
            unsafe {
                copy::copy_strided(
                    self.pool,
                    mem_ptr(mem, p),
                    shape,
                    &p.strides,
                    mem.grads.add(off),
                    shape,
                    &dst_strides,
                )
            };
        }
        let lp = &self.plan.places[self.plan.loss.index()];
        // SAFETY: the loss is a planned scalar, live to the end.
        Ok(unsafe { *mem_ptr(mem, lp) })
    }

    /// This step's labelled rows of every row set (from the bound labels).
    fn select_rows(&mut self) {
        for (set, sel) in self.row_sets.iter().zip(&mut self.sel) {
            sel.clear();
            let Root::Input(k) = self.plan.places[set.labels.index()].root else { continue };
            let In::Ids(p, n) = self.bound[k] else { continue };
            // SAFETY: bound from the caller's slice for this step.
            let labels = unsafe { std::slice::from_raw_parts(p, n) };
            sel.extend(
                labels
                    .iter()
                    .enumerate()
                    .filter(|(_, &l)| l != set.ignore_index)
                    .map(|(r, _)| r as u32),
            );
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
        self.bound.clear();
        for &t in g.inputs() {
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
            let (b, got) = match data {
                InputData::Ids(d) if !info.elem.is_float() => {
                    (In::Ids(d.as_ptr(), d.len()), d.len())
                }
                InputData::Floats(d) if info.elem.is_float() => (In::Floats(d.as_ptr()), d.len()),
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
            self.bound.push(b);
        }
        Ok(())
    }

    /// Runs one step's kernel.
    ///
    /// # Safety
    /// `mem` holds this step's buffers (the plan's contract).
    unsafe fn exec(&self, r: &Resolved, mem: Mem<'_>, seed: u64) -> Result<(), OpError> {
        let g = &self.graph;
        let k =
            kernel::Kernel { g, node: &g.nodes()[r.node], r, pool: self.pool, seed, x: self, mem };
        g.nodes()[r.node].op.def().exec(&k)
    }
}

fn profile_shapes() -> bool {
    std::env::var("ORTBENCH_PROFILE_SHAPES").is_ok_and(|v| v == "1")
}

fn mem_ptr(mem: Mem<'_>, p: &Place) -> *mut f32 {
    // SAFETY (callers): offsets come from the plan and lie inside their root.
    unsafe {
        match p.root {
            Root::Arena => mem.arena.add(p.offset),
            Root::Param => (mem.params as *mut f32).add(p.offset),
            Root::Grad => mem.grads.add(p.offset),
            Root::Input(k) => match mem.inputs[k] {
                In::Floats(ptr) => (ptr as *mut f32).add(p.offset),
                In::Ids(..) => unreachable!("ids are not float tensors"),
            },
        }
    }
}

fn contiguous(shape: &[usize]) -> Vec<usize> {
    crate::plan::layout::contiguous_strides(shape).into_iter().map(|s| s as usize).collect()
}

pub(crate) fn is_contig(shape: &[usize], strides: &[usize]) -> bool {
    let s: Vec<isize> = strides.iter().map(|&x| x as isize).collect();
    crate::plan::layout::is_contiguous(shape, &s)
}

/// (b, h, t) strides of a (B, H, T, D) operand with unit last stride; the t stride is a GEMM
/// leading dimension, so it is at least D even where T = 1 makes it irrelevant.
fn strides3(shape: &[usize], p: &Place) -> [usize; 3] {
    [p.strides[0], p.strides[1], p.strides[2].max(shape[3]).max(1)]
}

/// Build-time data of one node's kernel.
fn resolve(g: &Graph, plan: &Plan, i: usize, node: &Node) -> Result<Aux, PlanError> {
    let pl = |t: TensorId| &plan.places[t.index()];
    let no = |why: &str| PlanError::NoKernel {
        node: i,
        op: node.op.name(),
        backend: "cpu",
        why: why.to_string(),
    };
    Ok(match &node.op {
        Op::MatMul(MatMul { ta, tb }) => {
            let (a, b, c) = (node.inputs[0], node.inputs[1], node.outputs[0]);
            let m = MatMulPlan::new(
                *ta,
                *tb,
                (g.shape(a), &pl(a).strides),
                (g.shape(b), &pl(b).strides),
                (g.shape(c), &pl(c).strides),
            )
            .ok_or_else(|| no(" for these operand layouts"))?;
            Aux::MatMul(m, None)
        }
        Op::Attention(Attention { scale, causal, dropout_p, offset })
        | Op::AttentionBackward(AttentionBackward { scale, causal, dropout_p, offset }) => {
            use crate::ops::attention::{backward_slot as bs, slot as fs};
            let fwd = matches!(node.op, Op::Attention(_));
            let i = &node.inputs;
            let (q, k, v, o) = if fwd {
                (i[fs::Q], i[fs::K], i[fs::V], node.outputs[0])
            } else {
                (i[bs::Q], i[bs::K], i[bs::V], i[bs::DOUT])
            };
            let (sq, sk, sv) = (g.shape(q), g.shape(k), g.shape(v));
            let full = [sq[0], sq[1], sq[2], sk[2]];
            let mask =
                if fwd { i.get(fs::MASK).map(|&m| MaskMap::new(g.shape(m), &full)) } else { None };
            let (dq, dk, dvs) = if fwd {
                ([0; 3], [0; 3], [0; 3])
            } else {
                (
                    strides3(sq, pl(node.outputs[0])),
                    strides3(sk, pl(node.outputs[1])),
                    strides3(sv, pl(node.outputs[2])),
                )
            };
            Aux::Attn(Box::new(AttnPlan {
                b: sq[0],
                h: sq[1],
                hkv: sk[1],
                tq: sq[2],
                tk: sk[2],
                d: sq[3],
                dv: sv[3],
                scale: *scale,
                causal: *causal,
                dropout_p: *dropout_p,
                offset: *offset,
                q: strides3(sq, pl(q)),
                k: strides3(sk, pl(k)),
                v: strides3(sv, pl(v)),
                o: strides3(g.shape(o), pl(o)),
                dq,
                dk,
                dvs,
                mask,
            }))
        }
        Op::Linear(Linear { tb, gelu }) => {
            // The GEMM writes x·op(w) into y, or into the saved pre-activation with GELU.
            let (x, w) = (node.inputs[0], node.inputs[1]);
            let c = node.outputs[usize::from(gelu.is_some())];
            let m = MatMulPlan::new(
                false,
                *tb,
                (g.shape(x), &pl(x).strides),
                (g.shape(w), &pl(w).strides),
                (g.shape(c), &pl(c).strides),
            )
            .ok_or_else(|| no(" for these operand layouts"))?;
            Aux::MatMul(m, None)
        }
        Op::Softmax(_) if node.inputs.len() > 1 => {
            Aux::Mask(MaskMap::new(g.shape(node.inputs[1]), g.shape(node.inputs[0])))
        }
        // Kernels that take their sizes from the shapes at run time: nothing to resolve.
        Op::Softmax(_)
        | Op::Fill(_)
        | Op::Embedding
        | Op::BiasAdd
        | Op::Add
        | Op::Scale(_)
        | Op::Gelu(_)
        | Op::Tanh
        | Op::LayerNorm(_)
        | Op::RmsNorm(_)
        | Op::Rotary(_)
        | Op::Dropout(_)
        | Op::Reshape
        | Op::Permute(_)
        | Op::Split(_)
        | Op::Concat
        | Op::CrossEntropy(_)
        | Op::AddLayerNorm(_)
        | Op::AddRmsNorm(_)
        | Op::EmbeddingBackward
        | Op::ReduceSumLeading
        | Op::GeluBackward(_)
        | Op::TanhBackward
        | Op::LayerNormBackward
        | Op::RmsNormBackward
        | Op::SoftmaxBackward(_)
        | Op::CrossEntropyBackward(_)
        | Op::LinearCrossEntropy(_)
        | Op::LinearCrossEntropyBackward(_)
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::UnaryBackward(_) => Aux::None,
    })
}

pub(crate) mod kernel;
#[cfg(test)]
mod tests;

/// A raw base pointer shared with the pool's threads, each writing a disjoint range.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: only used for disjoint ranges inside one step.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}
impl SyncPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}
