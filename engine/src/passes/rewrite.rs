//! The shared machinery of the passes: who uses a tensor, a rewrite that removes nodes,
//! inserts new ones and substitutes tensors, then rebuilds a valid graph (topological order,
//! unreferenced tensors dropped and the rest renumbered), and a validity check.

use crate::graph::{Graph, GraphError, Node, Op, TensorId, TensorKind};
use std::collections::HashMap;

/// Who reads each tensor of a graph.
pub(crate) struct Uses {
    /// Per tensor: the nodes reading it (a node reading it twice appears twice).
    pub consumers: Vec<Vec<usize>>,
    /// Per tensor: the node producing it.
    pub producer: Vec<Option<usize>>,
    /// Per tensor: the loss or a parameter's gradient (read after the last node).
    pub root: Vec<bool>,
}

impl Uses {
    pub fn new(g: &Graph) -> Uses {
        let nt = g.tensors.len();
        let mut consumers = vec![Vec::new(); nt];
        for (i, n) in g.nodes.iter().enumerate() {
            for &x in &n.inputs {
                consumers[x.index()].push(i);
            }
        }
        let mut root = vec![false; nt];
        for t in g.loss.iter().chain(g.param_grads.iter().flatten()) {
            root[t.index()] = true;
        }
        Uses { consumers, producer: g.producers(), root }
    }

    /// `t` is read by exactly one node and is not a root: a pattern may absorb it.
    pub fn single_use(&self, t: TensorId) -> bool {
        self.consumers[t.index()].len() == 1 && !self.root[t.index()]
    }

    /// The node producing `t` if it has op `pred`.
    pub fn producer_if<'g>(
        &self,
        g: &'g Graph,
        t: TensorId,
        pred: impl Fn(&Op) -> bool,
    ) -> Option<(usize, &'g Node)> {
        let p = self.producer[t.index()]?;
        let n = &g.nodes[p];
        pred(&n.op).then_some((p, n))
    }
}

/// Which tensors depend on a parameter (through any output: a mask built from parameters
/// would need a gradient the fused ops do not give).
pub(crate) fn param_dependent(g: &Graph) -> Vec<bool> {
    let mut dep = vec![false; g.tensors.len()];
    for p in &g.params {
        dep[p.tensor.index()] = true;
    }
    for n in &g.nodes {
        if n.inputs.iter().any(|t| dep[t.index()]) {
            for &o in &n.outputs {
                dep[o.index()] = true;
            }
        }
    }
    dep
}

/// One pass's edits of a graph, applied by [`Rewrite::finish`].
pub(crate) struct Rewrite {
    /// The working graph: its first `n` nodes are the original ones (edit them in place with
    /// [`Rewrite::node_mut`]); new nodes are built on it with the builder and moved aside.
    g: Graph,
    n: usize,
    dead: Vec<bool>,
    /// Nodes to insert before original node i (i = n: at the end).
    before: Vec<Vec<Node>>,
    subst: HashMap<TensorId, TensorId>,
    /// Rewrites done (what the pass reports).
    pub count: usize,
}

impl Rewrite {
    pub fn new(g: &Graph) -> Rewrite {
        let n = g.nodes.len();
        Rewrite {
            g: g.clone(),
            n,
            dead: vec![false; n],
            before: vec![Vec::new(); n + 1],
            subst: HashMap::new(),
            count: 0,
        }
    }

    /// Original node `i`, to edit its op or inputs in place.
    pub fn node_mut(&mut self, i: usize) -> &mut Node {
        assert!(i < self.n, "only original nodes are edited in place");
        &mut self.g.nodes[i]
    }

    /// Builds new nodes with the graph builder (`build` checks shapes as for any graph) and
    /// schedules them before original node `at`: the caller guarantees that their inputs are
    /// computed before `at` and that every reader of their outputs comes at or after it.
    pub fn insert_before<T>(
        &mut self,
        at: usize,
        build: impl FnOnce(&mut Graph) -> Result<T, GraphError>,
    ) -> Result<T, GraphError> {
        let len = self.g.nodes.len();
        let r = build(&mut self.g);
        let new: Vec<Node> = self.g.nodes.drain(len..).collect();
        let r = r?;
        self.before[at].extend(new);
        Ok(r)
    }

    /// Moves original node `i` (as edited) before original node `at`: the caller guarantees
    /// that its inputs are computed before `at` and every reader of its outputs comes after.
    pub fn move_before(&mut self, i: usize, at: usize) {
        assert!(i < self.n && at <= self.n, "only original nodes are moved");
        let node = self.g.nodes[i].clone();
        self.dead[i] = true;
        self.before[at].push(node);
    }

    /// Drops original node `i` (its outputs must be unused once substitutions apply).
    pub fn remove(&mut self, i: usize) {
        self.dead[i] = true;
    }

    pub fn is_removed(&self, i: usize) -> bool {
        self.dead[i]
    }

    /// Every read of `from` (by nodes, the loss, parameter gradients) reads `to` instead.
    pub fn replace(&mut self, from: TensorId, to: TensorId) {
        self.subst.insert(from, to);
    }

    /// The rewritten graph, renumbered and checked.
    pub fn finish(self) -> Result<Graph, GraphError> {
        let Rewrite { mut g, n, dead, mut before, subst, .. } = self;
        let resolve = |mut t: TensorId| {
            while let Some(&u) = subst.get(&t) {
                t = u;
            }
            t
        };
        let old: Vec<Node> = std::mem::take(&mut g.nodes);
        let mut nodes = Vec::with_capacity(old.len());
        for (i, node) in old.into_iter().enumerate().take(n) {
            nodes.append(&mut before[i]);
            if !dead[i] {
                nodes.push(node);
            }
        }
        nodes.append(&mut before[n]);
        for node in &mut nodes {
            for x in &mut node.inputs {
                *x = resolve(*x);
            }
        }
        g.nodes = nodes;
        g.loss = g.loss.map(resolve);
        for pg in g.param_grads.iter_mut().flatten() {
            *pg = resolve(*pg);
        }
        let g = compact(g);
        validate(&g)?;
        Ok(g)
    }
}

/// Drops tensors nothing refers to and renumbers the rest in order.
fn compact(mut g: Graph) -> Graph {
    let nt = g.tensors.len();
    let mut keep = vec![false; nt];
    let refs = g
        .inputs
        .iter()
        .chain(g.params.iter().map(|p| &p.tensor))
        .chain(g.nodes.iter().flat_map(|n| n.inputs.iter().chain(&n.outputs)))
        .chain(g.loss.iter())
        .chain(g.param_grads.iter().flatten());
    for t in refs {
        keep[t.index()] = true;
    }
    let mut map = vec![None; nt];
    let mut tensors = Vec::with_capacity(nt);
    for (i, info) in g.tensors.iter().enumerate() {
        if keep[i] {
            map[i] = Some(TensorId(tensors.len() as u32));
            tensors.push(info.clone());
        }
    }
    let m = |t: TensorId| map[t.index()].expect("referenced tensors are kept");
    for info in &mut tensors {
        if let TensorKind::Grad(of) = info.kind {
            // The gradient of a tensor a pass removed is still a gradient; the label is lost.
            info.kind = map[of.index()].map_or(TensorKind::Activation, TensorKind::Grad);
        }
    }
    g.tensors = tensors;
    for t in g.inputs.iter_mut().chain(g.params.iter_mut().map(|p| &mut p.tensor)) {
        *t = m(*t);
    }
    for node in &mut g.nodes {
        for t in node.inputs.iter_mut().chain(node.outputs.iter_mut()) {
            *t = m(*t);
        }
    }
    g.loss = g.loss.map(m);
    for t in g.param_grads.iter_mut().flatten() {
        *t = m(*t);
    }
    g
}

/// A graph the executors and the planner accept: every node input computed before it (or an
/// input or parameter), every tensor produced at most once, the loss and the gradients
/// computed.
pub fn validate(g: &Graph) -> Result<(), GraphError> {
    let err = |msg: String| Err(GraphError::Attr { op: "passes", msg });
    let mut ready = vec![false; g.tensors.len()];
    for &t in &g.inputs {
        ready[t.index()] = true;
    }
    for p in &g.params {
        ready[p.tensor.index()] = true;
    }
    for (i, n) in g.nodes.iter().enumerate() {
        if let Some(t) = n.inputs.iter().find(|t| !ready[t.index()]) {
            return err(format!("node {i} ({}) reads {t} before it is computed", n.op.name()));
        }
        for &o in &n.outputs {
            if std::mem::replace(&mut ready[o.index()], true) {
                return err(format!(
                    "node {i} ({}) writes {o}, which is already defined",
                    n.op.name()
                ));
            }
        }
    }
    for t in g.loss.iter().chain(g.param_grads.iter().flatten()) {
        if !ready[t.index()] {
            return err(format!("{t} (the loss or a gradient) is never computed"));
        }
    }
    Ok(())
}
