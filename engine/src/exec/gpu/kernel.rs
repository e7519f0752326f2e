//! The GPU executor's kernel binding: [`GpuKernel`], which every op implements beside its typed
//! launchers (`exec/gpu/launch/<kernel>.rs`), and [`NodeCx`], what resolving one node sees. The
//! executor resolves a step as `op.def().launches(resolver, &cx)`, with no match over ops.

use super::support::GpuSupport;
use super::Resolver;
use super::{Call, PlanError};
use crate::graph::{Graph, Node, TensorId};
use crate::DType;

/// An op's GPU kernels: what the GPU planner and executor need of them besides the op's own
/// [`crate::graph::OpDef`]. The defaults: the kernels run any node the graph builder accepts
/// and need no scratch; and no launches, which an op without GPU kernels keeps while its
/// `check` refuses it.
pub trait GpuKernel {
    /// Why the GPU kernels cannot run node `node` (beyond the op's own shape rules), if they
    /// cannot.
    fn check(&self, _sup: &GpuSupport, _g: &Graph, _node: &Node) -> Result<(), String> {
        Ok(())
    }

    /// The dtype the kernels store output `slot` in, where it is not the graph's.
    fn stored_dtype(&self, _g: &Graph, _node: &Node, _slot: usize) -> Option<DType> {
        None
    }

    /// The elements the kernels store of output `slot`, where fewer than its shape's.
    fn stored_elems(&self, _g: &Graph, _node: &Node, _slot: usize) -> Option<usize> {
        None
    }

    /// Elements (4-byte units) of scratch the kernels need (0 for none).
    fn workspace(&self, _sup: &GpuSupport, _g: &Graph, _node: usize) -> usize {
        0
    }

    /// The node's launches (kernels and GEMMs) with every address, size and stride fixed. The
    /// default is an op without a GPU kernel: a plan error, never a silent fallback
    /// (`GpuSupport::check` refuses such a node before this is asked).
    fn launches(&self, _r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        Err(cx.no(&format!(": {} has no GPU kernel yet", cx.node.op.name())))
    }
}

/// One node being resolved: its operands' device addresses and storage dtypes, its workspace
/// and where a kernel flags a bad id.
pub struct NodeCx<'a> {
    pub g: &'a Graph,
    pub node: &'a Node,
    /// The node's index.
    pub i: usize,
    /// The input slot output 0 overwrites, if the plan put it in place.
    pub inplace: Option<usize>,
    /// The kernel's scratch, if the plan gave it one.
    pub ws: Option<u64>,
    /// Device addresses of the inputs and outputs.
    pub ia: Vec<u64>,
    pub oa: Vec<u64>,
    /// The status word a kernel sets on an out-of-range id or label.
    pub err: u64,
    /// Every tensor's storage dtype.
    pub dts: &'a [DType],
}

impl NodeCx<'_> {
    /// The plan error for a node this backend cannot launch.
    pub fn no(&self, why: &str) -> PlanError {
        PlanError::NoKernel {
            node: self.i,
            op: self.node.op.name(),
            backend: "gpu",
            why: why.to_string(),
        }
    }

    pub fn n(&self, t: TensorId) -> usize {
        self.g.tensor(t).numel()
    }

    /// The last dim of `t` (1 for a scalar).
    pub fn last(&self, t: TensorId) -> usize {
        *self.g.shape(t).last().unwrap_or(&1)
    }

    pub fn ws_at(&self) -> u64 {
        self.ws.expect("the plan gives this kernel its workspace")
    }

    /// The address of input `k`.
    pub fn inp(&self, k: usize) -> u64 {
        self.ia[k]
    }

    /// The address of output `k`.
    pub fn out(&self, k: usize) -> u64 {
        self.oa[k]
    }

    pub fn dt(&self, t: TensorId) -> DType {
        self.dts[t.index()]
    }

    /// Bytes of one element of `t` as stored (ids are i64).
    pub fn es(&self, t: TensorId) -> u64 {
        if self.g.tensor(t).elem.is_float() {
            self.dts[t.index()].size() as u64
        } else {
            8
        }
    }

    /// Elementwise kernels read and write one dtype: an error naming the first float tensor
    /// of `ts` stored otherwise.
    pub fn same(&self, ts: &[TensorId]) -> Result<(), PlanError> {
        let (g, d) = (self.g, self.dt(ts[0]));
        match ts.iter().find(|&&t| g.tensor(t).elem.is_float() && self.dt(t) != d) {
            Some(&t) => Err(self.no(&format!(
                " for {:?} mixed with {d:?} ({t:?}, {:?} {})",
                self.dt(t),
                g.tensor(t).kind,
                g.tensor(t).elem
            ))),
            None => Ok(()),
        }
    }
}
