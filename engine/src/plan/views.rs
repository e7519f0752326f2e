//! Steps 2–3 of the plan: alias groups of tensors joined by folded views, each placed from one
//! anchor laid out densely with every other member's strides derived through the views
//! ([`super::layout`]); a group that does not place has a view materialised ([`choose_cut`])
//! and is split.

use super::layout::{
    contiguous_strides, extent, non_overlapping, permute_strides, reshape_strides, satisfies,
    unpermute_strides,
};
use super::{is_view, Ctx, Root};
use crate::graph::op::{Permute, Split};
use crate::graph::{Graph, Op, TensorId, TensorKind};
use std::collections::HashMap;

/// A tensor's layout during planning: offset relative to its group, strides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Lay {
    pub(super) off: isize,
    pub(super) strides: Vec<isize>,
}

/// A placed alias group.
#[derive(Debug, Clone)]
pub(super) struct GroupPlace {
    pub(super) root: Root,
    /// Offset of the group's element 0 in the root (arena: assigned later).
    pub(super) base: usize,
    pub(super) extent: usize,
    lays: Vec<(TensorId, Lay)>,
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

/// Alias groups (tensors sharing memory through folded views) and where each is laid out.
pub(super) struct Groups {
    /// Per node: a view folded into its neighbours' memory.
    pub(super) fold: Vec<bool>,
    pub(super) members: Vec<Vec<TensorId>>,
    pub(super) placed: Vec<GroupPlace>,
    /// Per tensor: its group, and its layout inside the group.
    pub(super) group_of: Vec<usize>,
    pub(super) lay: Vec<Lay>,
}

impl Groups {
    /// Steps 2–3: alias groups and their layouts, materialising views (unfolding the one
    /// [`choose_cut`] picks) until every group places.
    pub(super) fn place(ctx: &Ctx) -> Groups {
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
