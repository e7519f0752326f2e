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
use crate::backend::cpu::kernels::copy;
use crate::backend::cpu::kernels::matmul::MatMulPlan;
use crate::backend::cpu::kernels::softmax::MaskMap;
use crate::backend::cpu::pool::Pool;
use crate::exec::{profile, ExecError, InputData, Inputs};
use crate::graph::{ElemType, Graph, Op, TensorId, TensorKind};
use crate::ops::OpError;
use crate::plan::rows::{self, RowPlan, RowUse};
use crate::plan::{self, KernelSupport, Place, Plan, PlanError, Root};
use crate::DType;
use kernel::CpuKernel;

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

    pub(crate) fn row_use(&self, node: usize) -> Option<(usize, RowUse)> {
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
        CpuKernel::check(n.op.def(), g, n).map_err(err)?;
        if n.outputs.iter().any(|&o| g.shape(o).len() > 8) {
            return Err(err(" for tensors of more than 8 dims".into()));
        }
        Ok(())
    }

    fn reads(&self, g: &Graph, node: usize, slot: usize) -> bool {
        g.nodes()[node].op.def().reads(slot)
    }

    fn workspace(&self, g: &Graph, node: usize) -> usize {
        CpuKernel::workspace(g.nodes()[node].op.def(), self, g, node)
    }

    fn stored_elems(&self, g: &Graph, t: TensorId) -> Option<usize> {
        let (n, slot) = g.output_slot(t)?;
        CpuKernel::stored_elems(n.op.def(), g, n, slot)
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
            let cx = kernel::ResolveCx { g: graph, plan: &plan, i: s.node, node };
            let mut aux = node.op.def().resolve(&cx)?;
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
                    // Not an output the kernel stores in a form of its own (the attention's
                    // row statistics, in the probabilities' place): f32, kept as written.
                    .filter(|&&o| {
                        matches!(graph.tensor(o).elem, ElemType::Float(d) if d != DType::F32)
                            && !param_grads.contains(&o)
                            && plan.stored_elems[o.index()].is_none()
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
        // The fused LM head's GEMMs are counted by its kernel's calls (labelled rows only).
        self.steps.iter().map(|r| g.nodes()[r.node].op.def().flops(self, r)).sum::<f64>()
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
