//! The memory plan of a training graph: a fixed schedule, where every tensor lives, and one
//! arena in which buffers with disjoint lifetimes share memory.
//!
//! What the planner decides, in order:
//!
//! 1. **Schedule**: the graph's node order (it is already topological; passes keep it so).
//! 2. **Views**: reshape, permute, split and concat are *folded* when possible — their outputs
//!    are strided views of their inputs (or, for concat, its inputs are views of its output), so
//!    no data moves. Tensors connected by folded views form an *alias group* sharing one
//!    buffer; the planner gives the group one anchor laid out densely and derives every other
//!    member's strides from it ([`layout`]). A folding is kept only if every kernel that reads
//!    or writes a member accepts its layout (the backend says what it accepts: [`KernelSupport`],
//!    [`Req`]); otherwise a view node is *materialised* (a strided copy) and the group is split.
//!    For BERT and GPT-2 every view folds: head split/merge permutes become strides of the
//!    attention and GEMM operands, GPT-2's q/k/v split and its gradient's concat become column
//!    offsets into the (B, T, 3C) tensor.
//! 3. **Parameters and gradients**: parameters (and views of them) are read in place from the
//!    flat parameter buffer, step inputs in place from the caller's slices; the tensor holding a
//!    parameter's total gradient is placed directly in the flat gradient buffer at the
//!    parameter's (offset, len) — its producer writes there. A gradient that cannot be placed
//!    there (a tensor that is the gradient of two parameters) is copied at the end of the step.
//! 4. **In place**: an elementwise node whose input dies at that node may write its output over
//!    it (the backend lists which input slots); chains of such merges are one buffer. This is
//!    how a tied embedding's gradient is summed: the LM head's dW GEMM writes straight into the
//!    gradient buffer and the embedding's scatter-add is added onto it.
//! 5. **Liveness**: per buffer, the first node that writes it and the last node that reads it
//!    (views extend their source's life; the loss lives to the end).
//! 6. **Arena**: buffers (and per-node kernel workspaces, live for their node only) get byte
//!    offsets, greedy by size with best fit (TFLite's `ArenaPlanner` strategy), aligned to 64
//!    bytes. [`Plan::peak_bytes`] against [`Plan::naive_bytes`] (every node output allocated
//!    separately, as the reference executor does) is the saving.
//!
//! [`rows`] is a separate analysis the executor uses to skip the rows a cross-entropy ignores;
//! [`split`] divides the memory a plan implies into parameters, gradients, optimizer state,
//! activations and logits (the report's memory chart).
//!
//! Reference: TFLite `simple_memory_arena.cc` / `greedy_memory_planner.cc`; PyTorch
//! `computeStride` for the reshape view rule.

mod arena;
pub mod layout;
pub mod rows;
pub mod split;
mod views;

#[cfg(test)]
pub(crate) mod testgraphs;
#[cfg(test)]
mod tests;

use crate::graph::{ElemType, Graph, Op, TensorId};
pub use arena::allocate;
use arena::{gradient_slots, lay_out_arena, liveness, merge_in_place};
use layout::extent;
pub use layout::Req;
use views::Groups;

/// Arena offsets and sizes are multiples of this many f32 elements (64 bytes: a cache line,
/// and an AVX-512 vector).
pub const ALIGN_ELEMS: usize = 16;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("the planned executor needs a training graph with a loss: run autodiff::backward on the forward graph")]
    NotTraining,
    #[error("node {node} ({op}): the {backend} backend has no kernel for it{why}; a kernel is its op's `CpuKernel` / `GpuKernel` (docs/ARCHITECTURE.md, \"Where a new piece goes\"); or run the reference executor (ORTBENCH_EXECUTOR=ref)")]
    NoKernel { node: usize, op: &'static str, backend: &'static str, why: String },
    /// Several ops without a kernel: each named once (in graph order), so a user sees all that
    /// is missing (a model family the GPU backend does not have yet), then the first's reason.
    #[error("the {backend} backend has no kernel for: {ops}; the first: {first}")]
    NoKernels { backend: &'static str, ops: String, first: Box<PlanError> },
    #[error("{0}")]
    Backend(String),
}

/// What a backend's kernels accept: the planner asks before folding views or merging buffers.
pub trait KernelSupport {
    /// The backend's name for messages ("cpu").
    fn name(&self) -> &'static str;
    /// Ok when the backend has a kernel for `node`, else [`PlanError::NoKernel`].
    fn check(&self, g: &Graph, node: usize) -> Result<(), PlanError>;
    /// Whether the kernel of `node` reads its input `slot`: false for an operand only another
    /// backend's kernel reads (the plan then leaves its layout alone).
    fn reads(&self, _g: &Graph, _node: usize, _slot: usize) -> bool {
        true
    }
    /// Layout the kernel of `node` needs for its input `slot`: the op's ([`crate::graph::OpDef::read_req`],
    /// the same for every backend), unless the kernel does not read it.
    fn read_req(&self, g: &Graph, node: usize, slot: usize) -> Req {
        if self.reads(g, node, slot) {
            g.nodes()[node].op.def().read_req(slot)
        } else {
            Req::Any
        }
    }
    /// Layout the kernel of `node` can write its output `slot` in ([`crate::graph::OpDef::write_req`]).
    fn write_req(&self, g: &Graph, node: usize, slot: usize) -> Req {
        g.nodes()[node].op.def().write_req(slot)
    }
    /// Input slots whose buffer output 0 may overwrite (same shape, read and written element
    /// by element or row by row), in order of preference ([`crate::graph::OpDef::inplace_inputs`]).
    fn inplace(&self, g: &Graph, node: usize) -> Vec<usize> {
        g.nodes()[node].op.def().inplace_inputs().to_vec()
    }
    /// f32 elements of scratch the kernel needs while it runs (0 for none).
    fn workspace(&self, g: &Graph, node: usize) -> usize;
    /// Bytes of one element of `t` as the backend stores it in the arena: 4 (f32 slots, the
    /// CPU), or 2 for an f16/bf16 tensor on a GPU. Buffers are sized by it; offsets inside a
    /// buffer stay in the tensor's own elements (see [`Plan::elem_bytes`]).
    fn elem_bytes(&self, _g: &Graph, _t: TensorId) -> usize {
        4
    }
    /// Elements the kernel actually stores for output `t` when it stores fewer than its shape
    /// holds (a GPU attention's second output keeps the rows' log-sum-exp, B·H·Tq, not the
    /// B·H·Tq·Tk probabilities): its buffer is sized for these. None: the whole shape. Only for
    /// a tensor no view or in-place merge shares memory with.
    fn stored_elems(&self, _g: &Graph, _t: TensorId) -> Option<usize> {
        None
    }
}

/// Which buffer a tensor's elements are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Root {
    /// The executor's arena.
    Arena,
    /// The flat parameter buffer (read only).
    Param,
    /// The flat gradient buffer.
    Grad,
    /// The step input with this index in [`Graph::inputs`] (read only).
    Input(usize),
}

/// Where a tensor lives: `root[offset + Σ index_d · strides[d]]`, in elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub root: Root,
    pub offset: usize,
    pub strides: Vec<usize>,
}

/// One node the executor runs (folded views are not steps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub node: usize,
    /// Output 0 overwrites this input slot's buffer.
    pub inplace: Option<usize>,
    /// (offset, len) of the kernel's scratch in the arena.
    pub workspace: Option<(usize, usize)>,
}

/// One arena buffer after in-place merging: the tensors in it and when it is live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buffer {
    /// Offset in the arena, in elements.
    pub offset: usize,
    /// Length in elements (rounded up to [`ALIGN_ELEMS`]).
    pub len: usize,
    /// First node position that writes it, last one that reads it (inclusive).
    pub first: usize,
    pub last: usize,
    pub tensors: Vec<TensorId>,
    /// A kernel workspace rather than tensors.
    pub workspace: bool,
}

/// A gradient copied into the flat gradient buffer: (tensor, offset, len) in elements.
pub type GradCopy = (TensorId, usize, usize);
/// A gradient range zeroed each step: (offset, len) in elements.
pub type GradZeros = (usize, usize);

/// The plan of one training graph.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Per tensor id: where it lives (every tensor of the graph has a place).
    pub places: Vec<Place>,
    /// Per node: a view that is a no-op (its outputs alias its inputs).
    pub folded: Vec<bool>,
    /// The executed nodes, in schedule order.
    pub steps: Vec<Step>,
    /// Per tensor: (first def, last use) as node positions; None for parameters and inputs.
    /// Views inherit the uses of what views them; the loss's last use is `nodes.len()`.
    pub live: Vec<Option<(usize, usize)>>,
    /// Arena buffers and workspaces.
    pub buffers: Vec<Buffer>,
    /// Per tensor: its arena buffer (index into `buffers`).
    pub buffer_of: Vec<Option<usize>>,
    /// Arena length in elements.
    pub arena_len: usize,
    /// Bytes of every node output allocated separately (the reference executor's footprint).
    pub naive_bytes: usize,
    /// Gradients copied into the flat gradient buffer at the end.
    pub grad_copies: Vec<GradCopy>,
    /// Gradient ranges zeroed each step (parameters the loss does not depend on).
    pub grad_zeros: Vec<GradZeros>,
    pub loss: TensorId,
    /// Per tensor: bytes per element in the arena ([`KernelSupport::elem_bytes`]). Buffer offsets and
    /// lengths count 4-byte units; a tensor's place offset is its buffer's offset plus its
    /// own elements into the buffer, so its first byte is 4·buffer.offset + elem_bytes·(place
    /// offset − buffer.offset) ([`Plan::arena_byte_span`]).
    pub elem_bytes: Vec<usize>,
    /// Per tensor: [`KernelSupport::stored_elems`] (None: its whole extent is stored).
    pub stored_elems: Vec<Option<usize>>,
}

impl Plan {
    /// Bytes of the arena: the planned peak of intermediate memory.
    pub fn peak_bytes(&self) -> usize {
        self.arena_len * 4
    }

    /// [first, end) bytes of arena tensor `t` (its buffer's start plus its elements' bytes).
    pub fn arena_byte_span(&self, g: &Graph, t: TensorId) -> (usize, usize) {
        let p = &self.places[t.index()];
        let b = &self.buffers[self.buffer_of[t.index()].expect("an arena tensor has a buffer")];
        let eb = self.elem_bytes[t.index()];
        let s: Vec<isize> = p.strides.iter().map(|&s| s as isize).collect();
        let first = 4 * b.offset + eb * (p.offset - b.offset);
        let n = self.stored_elems[t.index()].unwrap_or_else(|| extent(g.shape(t), &s) as usize);
        (first, first + eb * n)
    }

    /// Number of view nodes folded (no copy) and materialised (a copy).
    pub fn view_counts(&self, g: &Graph) -> (usize, usize) {
        let views = g.nodes().iter().map(|n| is_view(&n.op));
        let mut c = (0, 0);
        for (i, v) in views.enumerate() {
            if v {
                if self.folded[i] {
                    c.0 += 1
                } else {
                    c.1 += 1
                }
            }
        }
        c
    }

    /// A one-line summary: peak vs naive, views, in-place merges.
    pub fn summary(&self, g: &Graph) -> String {
        let (folded, copied) = self.view_counts(g);
        let inplace = self.steps.iter().filter(|s| s.inplace.is_some()).count();
        format!(
            "plan: {} steps, arena {:.1} MiB vs {:.1} MiB naive ({:.1}x less), {} buffers, {folded} views folded, {copied} copied, {inplace} in place, {} gradients copied",
            self.steps.len(),
            self.peak_bytes() as f64 / (1 << 20) as f64,
            self.naive_bytes as f64 / (1 << 20) as f64,
            self.naive_bytes as f64 / self.peak_bytes().max(1) as f64,
            self.buffers.len(),
            self.grad_copies.len()
        )
    }

    /// Checks the plan's memory invariants; Err names the first violation. Used by tests.
    ///
    /// - Arena buffers whose lifetimes intersect do not overlap in memory.
    /// - Every arena tensor lies inside its buffer.
    /// - Two arena tensors that are live at the same time and share memory are in one buffer
    ///   (views of each other, or an in-place merge at the node where one dies).
    /// - Nothing is written to the parameter buffer or to a step input.
    pub fn check(&self, g: &Graph) -> Result<(), String> {
        let bufs = &self.buffers;
        for (i, a) in bufs.iter().enumerate() {
            if a.offset % ALIGN_ELEMS != 0 || a.offset + a.len > self.arena_len {
                return Err(format!(
                    "buffer {i} at {}+{} is misaligned or outside the arena",
                    a.offset, a.len
                ));
            }
            for (j, b) in bufs.iter().enumerate().skip(i + 1) {
                let time = a.first <= b.last && b.first <= a.last;
                let mem = a.offset < b.offset + b.len && b.offset < a.offset + a.len;
                if time && mem {
                    return Err(format!(
                        "buffers {i} ({:?}, nodes {}..={}, at {}+{}) and {j} ({:?}, nodes {}..={}, at {}+{}) overlap while both live",
                        a.tensors, a.first, a.last, a.offset, a.len, b.tensors, b.first, b.last, b.offset, b.len
                    ));
                }
            }
        }
        let arena: Vec<usize> =
            (0..self.places.len()).filter(|&t| self.places[t].root == Root::Arena).collect();
        for &t in &arena {
            let Some(b) = self.buffer_of[t] else {
                return Err(format!("%{t} is in the arena but in no buffer"));
            };
            let buf = &bufs[b];
            if self.places[t].offset < buf.offset {
                return Err(format!("%{t} starts before its buffer {b}"));
            }
            let (s, e) = self.arena_byte_span(g, TensorId(t as u32));
            if e > 4 * (buf.offset + buf.len) {
                return Err(format!(
                    "%{t} bytes [{s}, {e}) lie outside its buffer {b} [{}, {})",
                    4 * buf.offset,
                    4 * (buf.offset + buf.len)
                ));
            }
        }
        let span = |t: usize| self.arena_byte_span(g, TensorId(t as u32));
        for (x, &a) in arena.iter().enumerate() {
            for &b in &arena[x + 1..] {
                let (Some(la), Some(lb)) = (self.live[a], self.live[b]) else { continue };
                if self.buffer_of[a] == self.buffer_of[b] {
                    continue;
                }
                let ((sa, ea), (sb, eb)) = (span(a), span(b));
                if la.0 <= lb.1 && lb.0 <= la.1 && sa < eb && sb < ea {
                    return Err(format!("%{a} (nodes {la:?}, [{sa}, {ea})) and %{b} (nodes {lb:?}, [{sb}, {eb})) share memory while both live"));
                }
            }
        }
        for (i, n) in g.nodes().iter().enumerate() {
            if self.folded[i] {
                continue;
            }
            for &o in &n.outputs {
                if matches!(self.places[o.index()].root, Root::Param | Root::Input(_)) {
                    return Err(format!(
                        "node {i} ({}) writes %{} into a read-only buffer",
                        n.op.name(),
                        o.0
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Ops whose output can be a view of their input (or, for concat, the inputs views of it).
pub fn is_view(op: &Op) -> bool {
    matches!(op, Op::Reshape | Op::Permute(_) | Op::Split(_) | Op::Concat)
}

struct Ctx<'a> {
    g: &'a Graph,
    k: &'a dyn KernelSupport,
    /// Per tensor: (node, output slot) of its producer.
    producer: Vec<Option<(usize, usize)>>,
    /// Per tensor: (node, input slot) of every consumer.
    consumers: Vec<Vec<(usize, usize)>>,
    /// Per tensor: the first parameter whose total gradient it is.
    grad_of: Vec<Option<usize>>,
    /// Per tensor: its index among the graph inputs.
    input_index: Vec<Option<usize>>,
}

impl Ctx<'_> {
    fn shape(&self, t: TensorId) -> &[usize] {
        self.g.shape(t)
    }

    fn numel(&self, t: TensorId) -> usize {
        self.g.tensor(t).numel()
    }

    /// Written by an executed (non-folded) node.
    fn written(&self, t: TensorId, fold: &[bool]) -> bool {
        matches!(self.producer[t.index()], Some((n, _)) if !fold[n])
    }

    /// Folded view nodes touching `t` (as producer or consumer).
    fn view_nodes(&self, t: TensorId, fold: &[bool]) -> Vec<usize> {
        let mut v: Vec<usize> =
            self.consumers[t.index()].iter().map(|&(n, _)| n).filter(|&n| fold[n]).collect();
        if let Some((n, _)) = self.producer[t.index()] {
            if fold[n] {
                v.push(n);
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Builds the plan of training graph `g` for a backend's kernels.
pub fn build(g: &Graph, k: &dyn KernelSupport) -> Result<Plan, PlanError> {
    let loss = match (g.is_training(), g.loss()) {
        (true, Some(l)) => l,
        _ => return Err(PlanError::NotTraining),
    };
    let ctx = Ctx::new(g, k)?;
    let groups = Groups::place(&ctx);
    let mut last = liveness(&ctx, &groups.fold, loss);
    let (grad_copies, grad_zeros) = gradient_slots(&ctx, &groups, &mut last);
    let nt = g.tensors().len();
    let def: Vec<Option<usize>> = (0..nt).map(|t| ctx.producer[t].map(|(n, _)| n)).collect();
    let live: Vec<Option<(usize, usize)>> =
        (0..nt).map(|t| def[t].map(|d| (d, last[t].unwrap_or(d).max(d)))).collect();
    let mut sets = merge_in_place(&ctx, &groups, &def, &last);
    let arena = lay_out_arena(&ctx, &groups, &mut sets);
    let places: Vec<Place> = (0..nt)
        .map(|t| {
            let s = sets.set[groups.group_of[t]];
            let l = &groups.lay[t];
            let off = sets.base[s] as isize + l.off;
            Place {
                root: sets.root[s],
                offset: off.max(0) as usize,
                strides: l.strides.iter().map(|&x| x.max(0) as usize).collect(),
            }
        })
        .collect();
    let steps = (0..g.nodes().len())
        .filter(|&i| !groups.fold[i])
        .map(|i| Step {
            node: i,
            inplace: sets.inplace[i],
            workspace: arena.workspace_of.get(&i).copied(),
        })
        .collect();
    let naive_bytes = g
        .nodes()
        .iter()
        .flat_map(|n| &n.outputs)
        .filter(|&&o| g.tensor(o).elem != ElemType::I64)
        .map(|&o| g.tensor(o).numel() * k.elem_bytes(g, o))
        .sum();
    Ok(Plan {
        elem_bytes: (0..g.tensors().len()).map(|t| k.elem_bytes(g, TensorId(t as u32))).collect(),
        stored_elems: (0..g.tensors().len())
            .map(|t| k.stored_elems(g, TensorId(t as u32)))
            .collect(),
        places,
        folded: groups.fold,
        steps,
        live,
        buffers: arena.buffers,
        buffer_of: arena.buffer_of,
        arena_len: arena.len,
        naive_bytes,
        grad_copies,
        grad_zeros,
        loss,
    })
}

impl<'a> Ctx<'a> {
    /// Step 1: every node has a kernel on this backend; producer, consumers, gradient and
    /// input indices per tensor.
    fn new(g: &'a Graph, k: &'a dyn KernelSupport) -> Result<Ctx<'a>, PlanError> {
        let nodes = g.nodes();
        let mut missing: Vec<PlanError> = Vec::new();
        for i in 0..nodes.len() {
            match k.check(g, i) {
                Ok(()) => {}
                Err(e @ PlanError::NoKernel { .. }) => missing.push(e),
                Err(e) => return Err(e),
            }
        }
        if missing.len() == 1 {
            return Err(missing.remove(0));
        }
        if !missing.is_empty() {
            let mut ops: Vec<&str> = Vec::new();
            for e in &missing {
                if let PlanError::NoKernel { op, .. } = e {
                    if !ops.contains(op) {
                        ops.push(op);
                    }
                }
            }
            return Err(PlanError::NoKernels {
                backend: k.name(),
                ops: ops.join(", "),
                first: Box::new(missing.remove(0)),
            });
        }
        let nt = g.tensors().len();
        let mut producer = vec![None; nt];
        let mut consumers = vec![Vec::new(); nt];
        for (i, n) in nodes.iter().enumerate() {
            for (s, &o) in n.outputs.iter().enumerate() {
                producer[o.index()] = Some((i, s));
            }
            for (s, &x) in n.inputs.iter().enumerate() {
                consumers[x.index()].push((i, s));
            }
        }
        let mut grad_of = vec![None; nt];
        for i in (0..g.params().len()).rev() {
            if let Some(t) = g.param_grad(i) {
                grad_of[t.index()] = Some(i);
            }
        }
        let mut input_index = vec![None; nt];
        for (i, &t) in g.inputs().iter().enumerate() {
            input_index[t.index()] = Some(i);
        }
        Ok(Ctx { g, k, producer, consumers, grad_of, input_index })
    }
}
