//! Steps 4–6 of the plan: liveness, the gradient buffer's slots, in-place merges, and the
//! arena's offsets (greedy by size, best fit: [`allocate`]).

use std::collections::HashMap;

use super::layout::is_contiguous;
use super::views::Groups;
use super::{Buffer, Ctx, GradCopy, GradZeros, Root, ALIGN_ELEMS};
use crate::graph::TensorId;

/// Step 5: per tensor, the last executed node that uses it, extended through folded views
/// (in reverse order); the loss lives to the end.
pub(super) fn liveness(ctx: &Ctx, fold: &[bool], loss: TensorId) -> Vec<Option<usize>> {
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
pub(super) fn gradient_slots(
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
pub(super) struct Sets {
    /// Per group: the representative group of its set.
    pub(super) set: Vec<usize>,
    /// Per set representative: root, base offset (arena: assigned by [`lay_out_arena`]),
    /// first and last node that needs its memory.
    pub(super) root: Vec<Root>,
    pub(super) base: Vec<usize>,
    first: Vec<usize>,
    last: Vec<usize>,
    /// Per node: the input slot its output 0 overwrites.
    pub(super) inplace: Vec<Option<usize>>,
}

/// Step 4: when each group's memory is needed, then the in-place merges (union of groups into
/// buffer sets, in schedule order) the kernels allow.
pub(super) fn merge_in_place(
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
pub(super) struct Arena {
    pub(super) buffers: Vec<Buffer>,
    pub(super) buffer_of: Vec<Option<usize>>,
    pub(super) len: usize,
    /// Per node with scratch: (offset, len) in the arena.
    pub(super) workspace_of: HashMap<usize, (usize, usize)>,
}

/// Step 6: buffer sets rooted in the arena and the kernels' workspaces get arena offsets
/// (best fit over lifetimes, [`allocate`]); sets' base offsets are filled in.
pub(super) fn lay_out_arena(ctx: &Ctx, groups: &Groups, sets: &mut Sets) -> Arena {
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
