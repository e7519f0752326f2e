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

pub mod layout;
pub mod rows;
pub mod split;

#[cfg(test)]
pub(crate) mod testgraphs;
#[cfg(test)]
mod tests;

use crate::graph::op::{Permute, Split};
use crate::graph::{ElemType, Graph, Op, TensorId, TensorKind};
pub use layout::Req;
use layout::{
    contiguous_strides, extent, is_contiguous, non_overlapping, permute_strides, reshape_strides,
    satisfies, unpermute_strides,
};
use std::collections::HashMap;

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

/// A tensor's layout during planning: offset relative to its group, strides.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Lay {
    off: isize,
    strides: Vec<isize>,
}

/// A placed alias group.
#[derive(Debug, Clone)]
struct GroupPlace {
    root: Root,
    /// Offset of the group's element 0 in the root (arena: assigned later).
    base: usize,
    extent: usize,
    lays: Vec<(TensorId, Lay)>,
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

/// Start offsets of the pieces of a split/concat along the last dim.
fn starts(sizes: &[usize]) -> Vec<usize> {
    let mut s = Vec::with_capacity(sizes.len());
    let mut acc = 0;
    for &n in sizes {
        s.push(acc);
        acc += n;
    }
    s
}

/// The layout of `to` through folded view `node`, given `from`'s; None when it cannot be
/// derived in that direction (the caller then needs another path or a copy).
fn derive(ctx: &Ctx, node: usize, from: TensorId, fl: &Lay, to: TensorId) -> Option<Lay> {
    let n = &ctx.g.nodes()[node];
    let (fs, ts) = (ctx.shape(from), ctx.shape(to));
    let from_is_input = n.inputs.contains(&from) && !n.outputs.contains(&from);
    let last_stride = |s: &[usize], st: &[isize]| -> Option<isize> {
        // The last dim's stride: 0 by convention when its size is 1, then unknown.
        match s.last() {
            Some(&1) | None => None,
            Some(_) => st.last().copied(),
        }
    };
    match &n.op {
        Op::Reshape => Some(Lay { off: fl.off, strides: reshape_strides(fs, &fl.strides, ts)? }),
        Op::Permute(Permute { perm }) => Some(Lay {
            off: fl.off,
            strides: if from_is_input {
                permute_strides(&fl.strides, perm)
            } else {
                unpermute_strides(&fl.strides, perm)
            },
        }),
        Op::Split(Split { sizes }) => {
            let st = starts(sizes);
            if from_is_input {
                let i = n.outputs.iter().position(|&o| o == to)?;
                let ls = last_stride(fs, &fl.strides).unwrap_or(0);
                let mut strides = fl.strides.clone();
                if let Some(l) = strides.last_mut() {
                    if sizes[i] == 1 {
                        *l = 0;
                    }
                }
                Some(Lay { off: fl.off + st[i] as isize * ls, strides })
            } else {
                let i = n.outputs.iter().position(|&o| o == from)?;
                let ls = if ts.last() == Some(&1) { 0 } else { last_stride(fs, &fl.strides)? };
                let mut strides = fl.strides.clone();
                if let Some(l) = strides.last_mut() {
                    *l = ls;
                }
                Some(Lay { off: fl.off - st[i] as isize * ls, strides })
            }
        }
        Op::Concat => {
            let sizes: Vec<usize> =
                n.inputs.iter().map(|&x| *ctx.shape(x).last().unwrap_or(&1)).collect();
            let st = starts(&sizes);
            if from_is_input {
                let i = n.inputs.iter().position(|&x| x == from)?;
                let ls = if ts.last() == Some(&1) { 0 } else { last_stride(fs, &fl.strides)? };
                let mut strides = fl.strides.clone();
                if let Some(l) = strides.last_mut() {
                    *l = ls;
                }
                Some(Lay { off: fl.off - st[i] as isize * ls, strides })
            } else {
                let i = n.inputs.iter().position(|&x| x == to)?;
                let ls = last_stride(fs, &fl.strides).unwrap_or(0);
                let mut strides = fl.strides.clone();
                if let Some(l) = strides.last_mut() {
                    if sizes[i] == 1 {
                        *l = 0;
                    }
                }
                Some(Lay { off: fl.off + st[i] as isize * ls, strides })
            }
        }
        // Not a view op: its output is a tensor of its own (the caller asks of view nodes).
        _ => None,
    }
}

/// Tensors of `node` reachable through it from `t`.
fn neighbours(ctx: &Ctx, node: usize, t: TensorId) -> Vec<TensorId> {
    let n = &ctx.g.nodes()[node];
    if n.inputs.contains(&t) {
        n.outputs.clone()
    } else {
        n.inputs.clone()
    }
}

/// Lays out one alias group from `anchor` (dense at offset 0 of `root` + `base`); Err when a
/// kernel does not accept a derived layout or the members conflict.
fn try_anchor(
    ctx: &Ctx,
    fold: &[bool],
    members: &[TensorId],
    anchor: TensorId,
    root: Root,
    base: usize,
    limit: Option<usize>,
) -> Result<GroupPlace, ()> {
    let idx: HashMap<TensorId, usize> = members.iter().enumerate().map(|(i, &t)| (t, i)).collect();
    let mut lays: Vec<Option<Lay>> = vec![None; members.len()];
    lays[idx[&anchor]] = Some(Lay { off: 0, strides: contiguous_strides(ctx.shape(anchor)) });
    let mut queue = vec![anchor];
    while let Some(t) = queue.pop() {
        let tl = lays[idx[&t]].clone().expect("queued tensors are placed");
        for node in ctx.view_nodes(t, fold) {
            for u in neighbours(ctx, node, t) {
                let Some(&ui) = idx.get(&u) else { continue };
                let Some(ul) = derive(ctx, node, t, &tl, u) else { continue };
                match &lays[ui] {
                    Some(existing) if *existing != ul => return Err(()),
                    Some(_) => {}
                    None => {
                        lays[ui] = Some(ul);
                        queue.push(u);
                    }
                }
            }
        }
    }
    let lays: Vec<Lay> = lays.into_iter().collect::<Option<_>>().ok_or(())?;
    // Kernels must accept every layout they read or write, and no layout may give two
    // elements one address (a split's input derived from a piece's strides, a concat's
    // output from an input's, can: the group then needs a copy).
    for (&t, l) in members.iter().zip(&lays) {
        let shape = ctx.shape(t);
        if !non_overlapping(shape, &l.strides) {
            return Err(());
        }
        for &(n, slot) in &ctx.consumers[t.index()] {
            if !fold[n] && !satisfies(shape, &l.strides, ctx.k.read_req(ctx.g, n, slot)) {
                return Err(());
            }
        }
        if let Some((n, slot)) = ctx.producer[t.index()] {
            if !fold[n] && !satisfies(shape, &l.strides, ctx.k.write_req(ctx.g, n, slot)) {
                return Err(());
            }
        }
    }
    let lo = members
        .iter()
        .zip(&lays)
        .map(|(&t, l)| if ctx.numel(t) == 0 { isize::MAX } else { l.off })
        .min()
        .unwrap_or(0);
    let lo = if lo == isize::MAX { 0 } else { lo };
    let hi = members
        .iter()
        .zip(&lays)
        .map(|(&t, l)| l.off + extent(ctx.shape(t), &l.strides))
        .max()
        .unwrap_or(0);
    let written: Vec<usize> =
        (0..members.len()).filter(|&i| ctx.written(members[i], fold)).collect();
    let shift = match root {
        Root::Arena => -lo,
        _ => {
            // External buffers: the anchor's own place; everything must stay inside it.
            if lo < 0 || hi as usize > limit.unwrap_or(usize::MAX) {
                return Err(());
            }
            if matches!(root, Root::Param | Root::Input(_)) && !written.is_empty() {
                return Err(());
            }
            0
        }
    };
    let lays: Vec<Lay> =
        lays.into_iter().map(|l| Lay { off: l.off + shift, strides: l.strides }).collect();
    let ext = (hi + shift).max(0) as usize;
    // Written members must not overlap (concat pieces written by different nodes).
    if written.len() > 1 {
        let mut seen = vec![false; ext];
        for &i in &written {
            let (t, l) = (members[i], &lays[i]);
            let mut ok = true;
            for_each_offset(ctx.shape(t), &l.strides, l.off, &mut |o| {
                let o = o as usize;
                if std::mem::replace(&mut seen[o], true) {
                    ok = false;
                }
            });
            if !ok {
                return Err(());
            }
        }
    }
    Ok(GroupPlace { root, base, extent: ext, lays: members.iter().copied().zip(lays).collect() })
}

/// Calls `f` with every element offset of a strided tensor.
fn for_each_offset(shape: &[usize], strides: &[isize], off: isize, f: &mut dyn FnMut(isize)) {
    if shape.contains(&0) {
        return;
    }
    let r = shape.len();
    let mut idx = vec![0usize; r];
    let mut o = off;
    loop {
        f(o);
        let mut d = r;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            o += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            o -= strides[d] * shape[d] as isize;
            idx[d] = 0;
        }
    }
}

/// Places one group: external anchors first (a parameter or input and its views), then the
/// gradient buffer for a parameter's gradient, then the arena from each member in turn.
fn place_group(ctx: &Ctx, fold: &[bool], members: &[TensorId]) -> Result<GroupPlace, ()> {
    let g = ctx.g;
    let externals: Vec<TensorId> = members
        .iter()
        .copied()
        .filter(|&t| matches!(g.tensor(t).kind, TensorKind::Param(_) | TensorKind::Input { .. }))
        .collect();
    match externals.len() {
        0 => {}
        1 => {
            let t = externals[0];
            let (root, base, limit) = match g.tensor(t).kind {
                TensorKind::Param(i) => (Root::Param, g.params()[i].offset, g.params()[i].len),
                _ => (Root::Input(ctx.input_index[t.index()].ok_or(())?), 0, ctx.numel(t)),
            };
            return try_anchor(ctx, fold, members, t, root, base, Some(limit));
        }
        _ => return Err(()),
    }
    for &t in members {
        if let Some(pi) = ctx.grad_of[t.index()] {
            let p = &g.params()[pi];
            if let Ok(gp) = try_anchor(ctx, fold, members, t, Root::Grad, p.offset, Some(p.len)) {
                return Ok(gp);
            }
        }
    }
    let mut order: Vec<TensorId> =
        members.iter().copied().filter(|&t| ctx.written(t, fold)).collect();
    order.extend(members.iter().copied().filter(|&t| !ctx.written(t, fold)));
    for t in order {
        if let Ok(gp) = try_anchor(ctx, fold, members, t, Root::Arena, 0, None) {
            return Ok(gp);
        }
    }
    Err(())
}

/// Alias groups: tensors connected by folded views.
fn components(g: &Graph, fold: &[bool]) -> Vec<Vec<TensorId>> {
    let n = g.tensors().len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(p: &mut [usize], mut x: usize) -> usize {
        while p[x] != x {
            p[x] = p[p[x]];
            x = p[x];
        }
        x
    }
    for (i, node) in g.nodes().iter().enumerate() {
        if !fold[i] {
            continue;
        }
        for &a in node.inputs.iter().chain(&node.outputs) {
            let (ra, rb) =
                (find(&mut parent, a.index()), find(&mut parent, node.outputs[0].index()));
            parent[ra] = rb;
        }
    }
    let mut groups: HashMap<usize, Vec<TensorId>> = HashMap::new();
    for t in 0..n {
        let r = find(&mut parent, t);
        groups.entry(r).or_default().push(TensorId(t as u32));
    }
    let mut v: Vec<Vec<TensorId>> = groups.into_values().collect();
    v.sort_by_key(|m| m[0]);
    v
}

/// Which folded view to materialise when a group cannot be laid out: the first whose copy
/// lets both sides be placed, preferring permutes (a real data movement anyway), then concat,
/// split, reshape.
fn choose_cut(ctx: &Ctx, fold: &[bool], members: &[TensorId]) -> usize {
    let mut cands: Vec<usize> = members.iter().flat_map(|&t| ctx.view_nodes(t, fold)).collect();
    cands.sort_unstable();
    cands.dedup();
    let rank = |n: usize| match ctx.g.nodes()[n].op {
        Op::Permute(_) => 0,
        Op::Concat => 1,
        Op::Split(_) => 2,
        // Reshape, the last view op.
        _ => 3,
    };
    cands.sort_by_key(|&n| (rank(n), n));
    for &c in &cands {
        let mut f = fold.to_vec();
        f[c] = false;
        let sub = components(ctx.g, &f);
        let ok = sub
            .iter()
            .filter(|m| m.iter().any(|t| members.contains(t)))
            .all(|m| place_group(ctx, &f, m).is_ok());
        if ok {
            return c;
        }
    }
    cands[0]
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

/// Alias groups (tensors sharing memory through folded views) and where each is laid out.
struct Groups {
    /// Per node: a view folded into its neighbours' memory.
    fold: Vec<bool>,
    members: Vec<Vec<TensorId>>,
    placed: Vec<GroupPlace>,
    /// Per tensor: its group, and its layout inside the group.
    group_of: Vec<usize>,
    lay: Vec<Lay>,
}

impl Groups {
    /// Steps 2–3: alias groups and their layouts, materialising views (unfolding the one
    /// [`choose_cut`] picks) until every group places.
    fn place(ctx: &Ctx) -> Groups {
        let (g, nt) = (ctx.g, ctx.g.tensors().len());
        // A concat reading one tensor more than once (HF's repeat_kv as `Graph::repeat_kv`
        // writes it) is a copy: a tensor has one place, not one per piece of the concat.
        let mut fold: Vec<bool> = g
            .nodes()
            .iter()
            .map(|n| {
                is_view(&n.op)
                    && !(matches!(n.op, Op::Concat)
                        && n.inputs.iter().enumerate().any(|(i, x)| n.inputs[..i].contains(x)))
            })
            .collect();
        let (members, placed) = loop {
            let groups = components(g, &fold);
            let mut placed = Vec::with_capacity(groups.len());
            let mut cut = None;
            for m in &groups {
                match place_group(ctx, &fold, m) {
                    Ok(p) => placed.push(p),
                    Err(()) => {
                        cut = Some(choose_cut(ctx, &fold, m));
                        break;
                    }
                }
            }
            match cut {
                Some(c) => fold[c] = false,
                None => break (groups, placed),
            }
        };
        let mut group_of = vec![0usize; nt];
        let mut lay: Vec<Option<Lay>> = vec![None; nt];
        for (gi, p) in placed.iter().enumerate() {
            for (t, l) in &p.lays {
                group_of[t.index()] = gi;
                lay[t.index()] = Some(l.clone());
            }
        }
        let lay = lay.into_iter().map(|l| l.expect("every tensor is in a group")).collect();
        Groups { fold, members, placed, group_of, lay }
    }
}

/// Step 5: per tensor, the last executed node that uses it, extended through folded views
/// (in reverse order); the loss lives to the end.
fn liveness(ctx: &Ctx, fold: &[bool], loss: TensorId) -> Vec<Option<usize>> {
    let nodes = ctx.g.nodes();
    let mut last: Vec<Option<usize>> = ctx
        .consumers
        .iter()
        .map(|cs| cs.iter().filter(|&&(n, _)| !fold[n]).map(|&(n, _)| n).max())
        .collect();
    for i in (0..nodes.len()).rev() {
        if !fold[i] {
            continue;
        }
        let n = &nodes[i];
        let (ins, outs) = (&n.inputs, &n.outputs);
        // Inputs live as long as any output (and vice versa for concat: its output is read
        // through its inputs' memory, which the inputs' producers wrote).
        let l = ins.iter().chain(outs).filter_map(|t| last[t.index()]).max();
        for &t in ins.iter().chain(outs) {
            last[t.index()] = last[t.index()].max(l);
        }
    }
    last[loss.index()] = Some(nodes.len());
    last
}

/// Gradients that are not in their parameter's slot of the gradient buffer are copied there at
/// the end (and live until then); parameters the loss does not depend on get zeros.
fn gradient_slots(
    ctx: &Ctx,
    groups: &Groups,
    last: &mut [Option<usize>],
) -> (Vec<GradCopy>, Vec<GradZeros>) {
    let (g, end) = (ctx.g, ctx.g.nodes().len());
    let mut grad_copies = Vec::new();
    let mut grad_zeros = Vec::new();
    for (i, p) in g.params().iter().enumerate() {
        match g.param_grad(i) {
            None => grad_zeros.push((p.offset, p.len)),
            Some(t) => {
                let gp = &groups.placed[groups.group_of[t.index()]];
                let l = &groups.lay[t.index()];
                let in_slot = gp.root == Root::Grad
                    && gp.base as isize + l.off == p.offset as isize
                    && is_contiguous(g.shape(t), &l.strides)
                    && g.tensor(t).numel() == p.len;
                if !in_slot {
                    grad_copies.push((t, p.offset, p.len));
                    last[t.index()] = Some(end);
                }
            }
        }
    }
    (grad_copies, grad_zeros)
}

/// Buffer sets: alias groups merged where an output overwrites a dying input in place.
struct Sets {
    /// Per group: the representative group of its set.
    set: Vec<usize>,
    /// Per set representative: root, base offset (arena: assigned by [`lay_out_arena`]),
    /// first and last node that needs its memory.
    root: Vec<Root>,
    base: Vec<usize>,
    first: Vec<usize>,
    last: Vec<usize>,
    /// Per node: the input slot its output 0 overwrites.
    inplace: Vec<Option<usize>>,
}

/// Step 4: when each group's memory is needed, then the in-place merges (union of groups into
/// buffer sets, in schedule order) the kernels allow.
fn merge_in_place(
    ctx: &Ctx,
    groups: &Groups,
    def: &[Option<usize>],
    last: &[Option<usize>],
) -> Sets {
    let (g, k, nodes) = (ctx.g, ctx.k, ctx.g.nodes());
    let (placed, group_of, lay, fold) =
        (&groups.placed, &groups.group_of, &groups.lay, &groups.fold);
    let ng = placed.len();
    let mut gfirst = vec![usize::MAX; ng];
    let mut glast = vec![0usize; ng];
    for t in 0..g.tensors().len() {
        let gi = group_of[t];
        if ctx.written(TensorId(t as u32), fold) {
            gfirst[gi] = gfirst[gi].min(def[t].expect("written tensors have a producer"));
        }
        if let Some(l) = last[t] {
            glast[gi] = glast[gi].max(l);
        }
    }
    for gi in 0..ng {
        if gfirst[gi] == usize::MAX {
            gfirst[gi] = 0; // only views of external memory, or nothing written: not in the arena
        }
        glast[gi] = glast[gi].max(gfirst[gi]);
    }
    fn find(p: &mut [usize], mut x: usize) -> usize {
        while p[x] != x {
            p[x] = p[p[x]];
            x = p[x];
        }
        x
    }
    let mut set: Vec<usize> = (0..ng).collect();
    let root: Vec<Root> = placed.iter().map(|p| p.root).collect();
    let (mut sfirst, mut slast) = (gfirst, glast);
    let mut inplace = vec![None; nodes.len()];
    let whole = |t: TensorId| {
        let gi = group_of[t.index()];
        let l = &lay[t.index()];
        l.off == 0
            && is_contiguous(g.shape(t), &l.strides)
            && placed[gi].extent == g.tensor(t).numel()
    };
    for (i, n) in nodes.iter().enumerate() {
        if fold[i] || n.outputs.len() != 1 {
            continue;
        }
        let o = n.outputs[0];
        for slot in k.inplace(g, i) {
            let Some(&a) = n.inputs.get(slot) else { continue };
            if !g.tensor(a).elem.is_float() || g.tensor(a).numel() != g.tensor(o).numel() {
                continue;
            }
            let (sa, so) =
                (find(&mut set, group_of[a.index()]), find(&mut set, group_of[o.index()]));
            let other_inputs_alias = n
                .inputs
                .iter()
                .enumerate()
                .any(|(s, &x)| s != slot && find(&mut set, group_of[x.index()]) == sa);
            let ok = sa != so
                && root[sa] == Root::Arena
                && matches!(root[so], Root::Arena | Root::Grad)
                && whole(a)
                && whole(o)
                && slast[sa] == i
                && sfirst[so] == i
                && !other_inputs_alias;
            if ok {
                // Merge a's set into o's (o's root wins: the gradient buffer when o is a
                // parameter's gradient).
                set[sa] = so;
                sfirst[so] = sfirst[so].min(sfirst[sa]);
                slast[so] = slast[so].max(slast[sa]);
                inplace[i] = Some(slot);
                break;
            }
        }
    }
    let set = (0..ng).map(|gi| find(&mut set, gi)).collect();
    Sets {
        set,
        root,
        base: placed.iter().map(|p| p.base).collect(),
        first: sfirst,
        last: slast,
        inplace,
    }
}

/// The arena's contents.
struct Arena {
    buffers: Vec<Buffer>,
    buffer_of: Vec<Option<usize>>,
    len: usize,
    /// Per node with scratch: (offset, len) in the arena.
    workspace_of: HashMap<usize, (usize, usize)>,
}

/// Step 6: buffer sets rooted in the arena and the kernels' workspaces get arena offsets
/// (best fit over lifetimes, [`allocate`]); sets' base offsets are filled in.
fn lay_out_arena(ctx: &Ctx, groups: &Groups, sets: &mut Sets) -> Arena {
    let (g, k, nt) = (ctx.g, ctx.k, ctx.g.tensors().len());
    struct Item {
        len: usize,
        first: usize,
        last: usize,
        tensors: Vec<TensorId>,
        workspace: Option<usize>,
        set: Option<usize>,
    }
    let mut items: Vec<Item> = Vec::new();
    let mut item_of_set: HashMap<usize, usize> = HashMap::new();
    for gi in 0..groups.placed.len() {
        let s = sets.set[gi];
        if sets.root[s] != Root::Arena {
            continue;
        }
        let it = *item_of_set.entry(s).or_insert_with(|| {
            items.push(Item {
                len: 0,
                first: sets.first[s],
                last: sets.last[s],
                tensors: Vec::new(),
                workspace: None,
                set: Some(s),
            });
            items.len() - 1
        });
        // In 4-byte units: a half tensor needs half the units of its elements.
        let eb = groups.members[gi].iter().map(|&t| k.elem_bytes(g, t)).max().unwrap_or(4);
        let stored = match &groups.members[gi][..] {
            [t] => k.stored_elems(g, *t),
            _ => None,
        };
        let extent = stored.map_or(groups.placed[gi].extent, |n| n.min(groups.placed[gi].extent));
        items[it].len = items[it].len.max((extent * eb).div_ceil(4));
        items[it].tensors.extend(groups.members[gi].iter().copied());
    }
    for i in 0..g.nodes().len() {
        if groups.fold[i] {
            continue;
        }
        let w = k.workspace(g, i);
        if w > 0 {
            items.push(Item {
                len: w,
                first: i,
                last: i,
                tensors: Vec::new(),
                workspace: Some(i),
                set: None,
            });
        }
    }
    for it in &mut items {
        it.len = it.len.max(1).next_multiple_of(ALIGN_ELEMS);
        it.tensors.sort();
    }
    let offsets = allocate(&items.iter().map(|it| (it.len, it.first, it.last)).collect::<Vec<_>>());
    let len = items.iter().zip(&offsets).map(|(it, &o)| o + it.len).max().unwrap_or(0);
    let mut workspace_of = HashMap::new();
    let mut buffers = Vec::with_capacity(items.len());
    let mut buffer_of = vec![None; nt];
    for (bi, (it, &off)) in items.iter().zip(&offsets).enumerate() {
        if let Some(s) = it.set {
            sets.base[s] = off;
        }
        if let Some(node) = it.workspace {
            workspace_of.insert(node, (off, it.len));
        }
        for &t in &it.tensors {
            buffer_of[t.index()] = Some(bi);
        }
        buffers.push(Buffer {
            offset: off,
            len: it.len,
            first: it.first,
            last: it.last,
            tensors: it.tensors.clone(),
            workspace: it.workspace.is_some(),
        });
    }
    Arena { buffers, buffer_of, len, workspace_of }
}

/// Offsets for (len, first, last) items: largest first, each at the smallest gap among the
/// items already placed whose lifetimes intersect its own (best fit), else after them.
pub fn allocate(items: &[(usize, usize, usize)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(items[i].0), items[i].1, i));
    let mut offsets = vec![0usize; items.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(items.len());
    for &i in &order {
        let (len, first, last) = items[i];
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| items[j].1 <= last && first <= items[j].2)
            .map(|&j| (offsets[j], offsets[j] + items[j].0))
            .collect();
        busy.sort_unstable();
        let mut best: Option<(usize, usize)> = None; // (gap size, offset)
        let mut prev_end = 0;
        for &(s, e) in &busy {
            if s > prev_end {
                let gap = s - prev_end;
                if gap >= len && best.is_none_or(|(b, _)| gap < b) {
                    best = Some((gap, prev_end));
                }
            }
            prev_end = prev_end.max(e);
        }
        offsets[i] = best.map_or(prev_end, |(_, o)| o).next_multiple_of(ALIGN_ELEMS);
        placed.push(i);
    }
    offsets
}
