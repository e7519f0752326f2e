//! The planned executor's kernel binding: [`CpuKernel`], which every op implements beside its
//! CPU kernels (`backend/cpu/kernels/<kernel>.rs`), and [`Kernel`], what one step's kernel call
//! sees — its node, the plan's resolution of it, and its operands as slices of the step's
//! buffers. The executor runs a step as `op.def().exec(&kernel)`, with no match over ops.

use super::{mem_ptr, Aux, CpuSupport, Mem, PlannedExecutor, Resolved};
use crate::backend::cpu::kernels::elementwise as ew;
use crate::backend::cpu::kernels::softmax::MaskMap;
use crate::backend::cpu::pool::Pool;
use crate::graph::{Graph, Node, TensorId};
use crate::ops::OpError;
use crate::plan::{Place, Plan, PlanError, Root};

/// An op's CPU kernel: what the planner and the planned executor need of it besides the op's
/// own [`crate::graph::OpDef`]. The defaults are the common case: the kernel runs any node the
/// graph builder accepts, reads every input, needs no scratch, resolves nothing at build time
/// and does no GEMM or attention FLOPs.
pub trait CpuKernel {
    /// Why the CPU kernel cannot run node `node` (beyond the op's own shape rules), if it
    /// cannot.
    fn check(&self, _g: &Graph, _node: &Node) -> Result<(), String> {
        Ok(())
    }

    /// Whether the kernel reads input `slot` (an operand only another backend reads is left
    /// alone by the plan).
    fn reads(&self, _slot: usize) -> bool {
        true
    }

    /// f32 elements of scratch the kernel needs (0 for none).
    fn workspace(&self, _cpu: &CpuSupport, _g: &Graph, _node: usize) -> usize {
        0
    }

    /// Elements the kernel stores for output `slot` when it stores something else than the
    /// shape holds, fewer and in f32 ([`crate::plan::KernelSupport::stored_elems`]; in the
    /// attention's probabilities' place, two floats per query row from which the backward
    /// rebuilds them). None: the whole shape, in the graph's dtype.
    fn stored_elems(&self, _g: &Graph, _node: &Node, _slot: usize) -> Option<usize> {
        None
    }

    /// The kernel's build-time data: GEMM plans, attention strides, mask maps.
    fn resolve(&self, _cx: &ResolveCx<'_>) -> Result<Aux, PlanError> {
        Ok(Aux::None)
    }

    /// GEMM and attention FLOPs the kernel ran in the executor's last step.
    fn flops(&self, _x: &PlannedExecutor, _r: &Resolved) -> f64 {
        0.0
    }

    /// Runs the node's kernel on the step's buffers.
    ///
    /// # Safety
    /// `k`'s buffers hold this step's operands (the plan's contract): the kernel reads its inputs
    /// and writes its outputs through them.
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError>;
}

/// One step's kernel call: the node, its resolution and the step's buffers.
pub struct Kernel<'a> {
    pub g: &'a Graph,
    pub node: &'a Node,
    pub r: &'a Resolved,
    pub pool: &'static Pool,
    /// The step's dropout seed.
    pub seed: u64,
    /// The executor, for the state a few kernels share across steps (row sets, loss scale).
    pub x: &'a PlannedExecutor,
    pub(super) mem: Mem<'a>,
}

impl<'a> Kernel<'a> {
    pub fn pl(&self, t: TensorId) -> &'a Place {
        &self.x.plan.places[t.index()]
    }

    pub fn numel(&self, t: TensorId) -> usize {
        self.g.tensor(t).numel()
    }

    /// The last dim of `t` (1 for a scalar).
    pub fn last(&self, t: TensorId) -> usize {
        *self.g.shape(t).last().unwrap_or(&1)
    }

    /// The first element of `t` in the step's buffers.
    ///
    /// # Safety
    /// As [`CpuKernel::exec`].
    pub unsafe fn ptr(&self, t: TensorId) -> *mut f32 {
        mem_ptr(self.mem, self.pl(t))
    }

    /// Input `i`, contiguous (the plan guarantees Contig where the kernel needs it).
    ///
    /// # Safety
    /// As [`CpuKernel::exec`].
    pub unsafe fn rd(&self, i: usize) -> &'a [f32] {
        let t = self.node.inputs[i];
        std::slice::from_raw_parts(self.ptr(t), self.numel(t))
    }

    /// Output `i`, contiguous.
    ///
    /// # Safety
    /// As [`CpuKernel::exec`]; no other slice of it is live.
    #[allow(clippy::mut_from_ref, reason = "a view of the step's buffers, disjoint per operand")]
    pub unsafe fn wr(&self, i: usize) -> &'a mut [f32] {
        let t = self.node.outputs[i];
        std::slice::from_raw_parts_mut(self.ptr(t), self.numel(t))
    }

    /// The input an in-place output overwrites, as the output.
    ///
    /// # Safety
    /// As [`CpuKernel::exec`]; the plan put output 0 over input `i`.
    #[allow(clippy::mut_from_ref, reason = "a view of the step's buffers, disjoint per operand")]
    pub unsafe fn rw(&self, i: usize) -> &'a mut [f32] {
        let t = self.node.inputs[i];
        std::slice::from_raw_parts_mut(self.ptr(t), self.numel(t))
    }

    /// Id input `i` (a step input).
    ///
    /// # Safety
    /// As [`CpuKernel::exec`].
    pub unsafe fn ids(&self, i: usize) -> &'a [i64] {
        match self.pl(self.node.inputs[i]).root {
            Root::Input(k) => match self.mem.inputs[k] {
                super::In::Ids(p, n) => std::slice::from_raw_parts(p, n),
                super::In::Floats(_) => unreachable!("ids input bound as floats"),
            },
            _ => unreachable!("i64 tensors are step inputs"),
        }
    }

    /// The kernel's scratch in the arena.
    ///
    /// # Safety
    /// As [`CpuKernel::exec`].
    #[allow(clippy::mut_from_ref, reason = "the kernel's own scratch in the arena")]
    pub unsafe fn ws(&self) -> &'a mut [f32] {
        let (o, l) = self.r.ws.expect("the plan gives this kernel its workspace");
        std::slice::from_raw_parts_mut(self.mem.arena.add(o), l)
    }

    /// The additive mask at input `i` with its broadcast map, when the node has one.
    ///
    /// # Safety
    /// As [`CpuKernel::exec`].
    pub unsafe fn mask(&self, i: usize) -> Option<(&'a [f32], &'a MaskMap)> {
        match (&self.r.aux, self.node.inputs.get(i)) {
            (Aux::Mask(m), Some(_)) => Some((self.rd(i), m)),
            _ => None,
        }
    }

    /// The rows of row set `set` this step selected, when few enough for a row-restricted
    /// kernel to pay (`plan::rows`).
    pub fn selected_rows(&self, set: usize) -> Option<&'a [u32]> {
        let x = self.x;
        let sel = &x.sel[set];
        (sel.len() <= crate::backend::cpu::kernels::matmul::row_cap(x.row_sets[set].rows))
            .then_some(&sel[..])
    }

    /// out = f(x), in place when planned so.
    ///
    /// # Safety
    /// As [`CpuKernel::exec`].
    pub unsafe fn unary<F: ew::Map1>(&self, f: F) {
        match self.r.inplace {
            Some(_) => ew::map1_inplace(self.pool, self.rw(0), f),
            None => ew::map1(self.pool, self.wr(0), self.rd(0), f),
        }
    }

    /// out = f(a, b), in place over b (the incoming gradient) when planned so.
    ///
    /// # Safety
    /// As [`CpuKernel::exec`].
    pub unsafe fn binary_b<F: ew::Map2>(&self, f: F) {
        match self.r.inplace {
            Some(_) => ew::map2_inplace_b(self.pool, self.rd(0), self.rw(1), f),
            None => ew::map2(self.pool, self.wr(0), self.rd(0), self.rd(1), f),
        }
    }
}

/// What a kernel's build-time resolution sees: the graph, the plan and the node.
pub struct ResolveCx<'a> {
    pub g: &'a Graph,
    pub plan: &'a Plan,
    /// The node's index.
    pub i: usize,
    pub node: &'a Node,
}

impl<'a> ResolveCx<'a> {
    pub fn pl(&self, t: TensorId) -> &'a Place {
        &self.plan.places[t.index()]
    }

    /// The plan error for a node the CPU has no kernel for.
    pub fn no(&self, why: &str) -> PlanError {
        PlanError::NoKernel {
            node: self.i,
            op: self.node.op.name(),
            backend: "cpu",
            why: why.to_string(),
        }
    }
}
