//! What the GPU kernels (`engine/kernels/*.cu`) accept, for the planner ([`KernelSupport`]), and the
//! launch geometry the executor gives them.
//!
//! Differences from the CPU kernels that the plan must know:
//! - attention's second output holds the rows' softmax statistics (m, log l), (B, H, Tq, 2) f32,
//!   instead of the probabilities, and its buffer is sized for that ([`KernelSupport::stored_elems`]); its backward
//!   reads the forward's output and mask (`ops::attention::backward_slot` OUT, MASK);
//! - reductions without atomics need scratch: column partials for bias and layer-norm weight
//!   gradients, per-row losses for the cross-entropy, the rows' D = rowsum(dO ∘ O) for the
//!   attention backward; the linear cross-entropy's chunk of logits, gathered rows, compacted
//!   row indices and per-row losses ([`LceWorkspace`]);
//! - attention with fewer K/V heads than query heads (grouped-query) reads K/V head h / (H/Hkv)
//!   for query head h, and its dK/dV kernel runs one block per K/V head summing over the group;
//! - there is no standalone GELU kernel: the passes fuse GELU into its linear layer (`Op::Linear`),
//!   and an unfused one is a [`PlanError::NoKernel`] naming the node, never a silent fallback.

use super::kernel::GpuKernel;
use crate::graph::{ElemType, Graph, Op};
use crate::plan::{KernelSupport, PlanError};
use crate::DType;

/// Rows of a column reduction one block walks (reduce.cu `column_sum_partial`, layernorm.cu
/// `layernorm_backward_dwdb`): 32 rows keeps R/32 · ⌈C/128⌉ blocks for bert's 4096 × 768.
pub const ROWS_PER_CHUNK: usize = 32;
/// Threads of a column-reduction block (one column each).
pub const COLUMN_BLOCK: u32 = 128;
/// Threads of a grid-stride elementwise block.
pub const EW_BLOCK: u32 = 256;
/// Warps per block of the one-warp-per-row kernels (layer_norm, softmax).
pub const ROW_WARPS: u32 = 4;
/// Threads of a one-block-per-row kernel (cross-entropy, embedding) and of attention blocks.
pub const ROW_BLOCK: u32 = 128;
/// Threads of a single-block reduction (cross-entropy's mean and count of labelled rows).
pub const ONE_BLOCK: u32 = 256;
/// Most blocks of the gradient-norm partials (adamw.cu `grad_sumsq_partial`): fills an H100
/// (132 SMs) several times over; the single-block finish adds them in order.
pub const NORM_BLOCKS: u32 = 512;

/// Number of row chunks of a column reduction over `rows` rows.
pub fn chunks(rows: usize) -> usize {
    rows.div_ceil(ROWS_PER_CHUNK).max(1)
}

/// The attention tile sizes (bq, bk) for head sizes d, dv: the largest of 64/32/16 whose three
/// kernels fit `max_shared` bytes of shared memory (attention.cu's formulas, in floats).
pub fn attention_tiles(d: usize, dv: usize, max_shared: u32) -> Option<(usize, usize)> {
    [(64, 64), (64, 32), (32, 32), (16, 16), (8, 8)]
        .into_iter()
        .find(|&(bq, bk)| attention_smem(bq, bk, d, dv).iter().all(|&b| b <= max_shared))
}

/// Dynamic shared memory of attention_forward, attention_backward_dq, attention_backward_dkdv,
/// bytes (attention.cu).
pub fn attention_smem(bq: usize, bk: usize, d: usize, dv: usize) -> [u32; 3] {
    let fwd = bq * d + bk * (d + 1) + bk * dv + bq * bk + bq * dv + 3 * bq;
    let dq = 2 * bq * d + bq * dv + bk * (d + 1) + bk * (dv + 1) + bq * bk + 3 * bq;
    let dkdv =
        bk * (d + 1) + bk * (dv + 1) + bk * d + bk * dv + bq * d + bq * dv + 2 * bq * bk + 3 * bq;
    [fwd, dq, dkdv].map(|f| (4 * f) as u32)
}

/// The dtype each tensor is stored in on the GPU (indexed by tensor id): the graph's, except
/// parameters' gradients — f32 in the flat gradient buffer, as the CPU executor keeps them —,
/// and the outputs an op's kernels store otherwise ([`GpuKernel::stored_dtype`]: autodiff's
/// seed and attention's softmax statistics, f32). Id tensors read as f32 here (they are never
/// addressed by dtype). The plan sizes arena buffers by these ([`KernelSupport::elem_bytes`]):
/// a half tensor takes 2 bytes an element.
pub fn storage_dtypes(g: &Graph) -> Vec<DType> {
    let mut d: Vec<DType> = g
        .tensors()
        .iter()
        .map(|t| match t.elem {
            ElemType::Float(d) => d,
            ElemType::I64 => DType::F32,
        })
        .collect();
    for i in 0..g.params().len() {
        if let Some(t) = g.param_grad(i) {
            d[t.index()] = DType::F32;
        }
    }
    for n in g.nodes() {
        for (slot, &o) in n.outputs.iter().enumerate() {
            if let Some(s) = GpuKernel::stored_dtype(n.op.def(), g, n, slot) {
                d[o.index()] = s;
            }
        }
    }
    d
}

/// The kernel-name suffix of a storage dtype (`ORT_FOR_FLOATS`).
pub fn suffix(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
    }
}

/// What the GPU kernels accept (see the module comment), for one graph (its storage dtypes).
#[derive(Debug, Clone)]
pub struct GpuSupport {
    pub dtypes: Vec<DType>,
    /// Rows per chunk of the linear cross-entropy; None: [`lce_chunk_rows`] (tests set a few
    /// rows, to run several chunks at small sizes).
    pub lce_chunk: Option<usize>,
}

impl GpuSupport {
    pub fn for_graph(g: &Graph) -> Self {
        GpuSupport { dtypes: storage_dtypes(g), lce_chunk: None }
    }

    /// The workspace of linear cross-entropy node `node` (forward or backward), laid out.
    pub fn lce_workspace(&self, g: &Graph, node: usize) -> LceWorkspace {
        let n = &g.nodes()[node];
        // Operands from x on: the backward's slot 0 is dloss.
        let at = usize::from(matches!(n.op, Op::LinearCrossEntropyBackward(_)));
        let (x, w, labels) = (n.inputs[at], n.inputs[at + 1], n.inputs[at + 2]);
        let (v, c) = (g.shape(w)[0], g.shape(w)[1]);
        let rows = g.tensor(labels).numel();
        let k = self.lce_chunk.unwrap_or_else(|| lce_chunk_rows(v, rows)).clamp(1, rows.max(1));
        let d = |t: crate::graph::TensorId| self.dtypes[t.index()];
        let grads = (at == 1).then(|| (d(n.outputs[2]), n.outputs.get(3).map(|&t| d(t))));
        LceWorkspace::new(rows, c, v, k, d(x), grads)
    }
}

/// Target size of the linear cross-entropy's f32 logits chunk on the GPU: 64 MiB, with enough
/// rows (320 at V = 50257) that the chunk's GEMMs and its one-block-per-row pass fill a GPU's
/// SMs. Not measured on a GPU yet (the CPU's kernel measured larger chunks faster:
/// `backend::cpu::kernels::linear_cross_entropy::CHUNK_LOGITS_BYTES`).
pub const LCE_CHUNK_BYTES: usize = 64 << 20;

/// Rows per linear cross-entropy chunk over a vocabulary of `v` and `rows` rows: the logits
/// chunk near [`LCE_CHUNK_BYTES`], a multiple of 64 rows (at least 64), at most `rows`.
pub fn lce_chunk_rows(v: usize, rows: usize) -> usize {
    let by_bytes = crate::ops::linear_cross_entropy::rows_of_logits(LCE_CHUNK_BYTES, v) / 64 * 64;
    by_bytes.max(64).min(rows.max(1))
}

/// The linear cross-entropy's workspace (linear_cross_entropy.cu): where each part starts, in
/// f32 words from the workspace's start, each 64 words (256 bytes) aligned for cuBLASLt.
/// k rows per chunk; T is x's (and w's) storage dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LceWorkspace {
    /// Rows per chunk.
    pub k: usize,
    /// (k, V) f32: the chunk's logits, then g in place.
    pub logits: usize,
    /// (k, V) T: g in T for the half GEMMs (None in f32, which read the logits buffer).
    pub g16: Option<usize>,
    /// (k, C) T: the gathered x rows.
    pub xs: usize,
    /// (k, C) f32: the chunk's dx rows (the backward).
    pub dxs: Option<usize>,
    /// (R) f32: per-position losses.
    pub losses: usize,
    /// (R) i32: the labelled rows, compacted.
    pub idx: usize,
    /// (1) f32: how many.
    pub count: usize,
    /// (V, C) f32: dw's sum when dw is not stored in f32 (a half part of a tied weight's
    /// gradient), cast at the end.
    pub dw: Option<usize>,
    /// (V) f32: dbias's sum when dbias is not stored in f32.
    pub db: Option<usize>,
    /// Total f32 words.
    pub len: usize,
}

impl LceWorkspace {
    /// `grads`: the backward's (dw, dbias) storage dtypes; None for the forward.
    pub fn new(
        rows: usize,
        c: usize,
        v: usize,
        k: usize,
        t: DType,
        grads: Option<(DType, Option<DType>)>,
    ) -> LceWorkspace {
        let mut len = 0usize;
        let mut take = |words: usize| {
            let at = len;
            len += words.next_multiple_of(64);
            at
        };
        let half = t != DType::F32;
        let logits = take(k * v);
        let g16 = (half && grads.is_some()).then(|| take((k * v).div_ceil(2)));
        let xs = take((k * c * t.size()).div_ceil(4));
        let dxs = grads.map(|_| take(k * c));
        let losses = take(rows);
        let idx = take(rows);
        let count = take(1);
        let dw = grads.and_then(|(dw, _)| (dw != DType::F32).then(|| take(v * c)));
        let db = grads.and_then(|(_, db)| db.filter(|&d| d != DType::F32).map(|_| take(v)));
        LceWorkspace { k, logits, g16, xs, dxs, losses, idx, count, dw, db, len }
    }
}

impl KernelSupport for GpuSupport {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn check(&self, g: &Graph, node: usize) -> Result<(), PlanError> {
        let n = &g.nodes()[node];
        let err = |why: &str| PlanError::NoKernel {
            node,
            op: n.op.name(),
            backend: "gpu",
            why: why.to_string(),
        };
        GpuKernel::check(n.op.def(), self, g, n).map_err(|why| err(&why))?;
        if n.outputs.iter().chain(&n.inputs).any(|&o| g.shape(o).len() > 8) {
            return Err(err(" for tensors of more than 8 dims"));
        }
        Ok(())
    }

    fn inplace(&self, g: &Graph, node: usize) -> Vec<usize> {
        let n = &g.nodes()[node];
        // Not over an input stored in another dtype: a parameter's f32 gradient summed from
        // half parts (tied weights) must not overwrite a half part.
        let grad = (0..g.params().len()).any(|i| g.param_grad(i) == Some(n.outputs[0]));
        if grad
            && n.inputs
                .iter()
                .any(|&t| matches!(g.tensor(t).elem, ElemType::Float(d) if d != DType::F32))
        {
            return vec![];
        }
        n.op.def().inplace_inputs().to_vec()
    }

    fn elem_bytes(&self, g: &Graph, t: crate::graph::TensorId) -> usize {
        if g.tensor(t).elem.is_float() {
            self.dtypes[t.index()].size()
        } else {
            8
        }
    }

    fn stored_elems(&self, g: &Graph, t: crate::graph::TensorId) -> Option<usize> {
        let (n, slot) = g.output_slot(t)?;
        GpuKernel::stored_elems(n.op.def(), g, n, slot)
    }

    fn workspace(&self, g: &Graph, node: usize) -> usize {
        GpuKernel::workspace(g.nodes()[node].op.def(), self, g, node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_tiles_fit_the_shared_memory_they_are_given() {
        // H100: 227 KiB opt-in; d = 64 takes the largest tiles.
        assert_eq!(attention_tiles(64, 64, 227 * 1024), Some((64, 64)));
        // 48 KiB (no opt-in) forces smaller tiles, every kernel within it.
        let (bq, bk) = attention_tiles(64, 64, 48 * 1024).unwrap();
        assert!(bq < 64 || bk < 64);
        assert!(attention_smem(bq, bk, 64, 64).iter().all(|&b| b <= 48 * 1024));
        assert_eq!(attention_tiles(4096, 4096, 48 * 1024), None);
    }

    /// The linear cross-entropy's chunk holds about 64 MiB of f32 logits at real vocabularies
    /// (gpt2's 50257, bert's 30522), never fewer than 64 rows nor more than the rows; the
    /// workspace's parts are 256-byte aligned (cuBLASLt's operands) and do not overlap.
    #[test]
    fn lce_chunks_hold_about_64_mib_and_workspace_parts_are_aligned_and_disjoint() {
        assert_eq!(lce_chunk_rows(50257, 16384), 320);
        assert_eq!(lce_chunk_rows(30522, 16384), 512);
        assert_eq!(lce_chunk_rows(1 << 24, 4096), 64);
        assert_eq!(lce_chunk_rows(131, 37), 37);
        let (k, r, c, v) = (5, 37, 24, 131);
        let w = LceWorkspace::new(r, c, v, k, DType::BF16, Some((DType::BF16, Some(DType::F32))));
        assert!(w.db.is_none(), "an f32 dbias accumulates in place");
        let parts = [
            (w.logits, k * v),
            (w.g16.unwrap(), (k * v).div_ceil(2)),
            (w.xs, (k * c * 2).div_ceil(4)),
            (w.dxs.unwrap(), k * c),
            (w.losses, r),
            (w.idx, r),
            (w.count, 1),
            (w.dw.unwrap(), v * c),
        ];
        for (i, &(at, len)) in parts.iter().enumerate() {
            let end = parts.get(i + 1).map_or(w.len, |p| p.0);
            assert!(at % 64 == 0 && at + len <= end, "part {i} at {at}+{len}, next at {end}");
        }
        let f = LceWorkspace::new(r, c, v, k, DType::F32, None);
        assert!(f.g16.is_none() && f.dxs.is_none() && f.dw.is_none() && f.db.is_none());
    }

    /// The Llama family's ops have GPU kernels: RMSNorm, rotary, and attention with fewer K/V
    /// heads than query heads (grouped-query, forward and backward); none is refused.
    #[test]
    fn rmsnorm_rotary_and_grouped_query_attention_are_accepted() {
        use crate::graph::AttentionOpts;
        let mut g = Graph::new();
        let x = g.param("x", &[2, 3, 5, 4]).unwrap();
        let w = g.param("w", &[4]).unwrap();
        let k = g.param("k", &[2, 1, 5, 4]).unwrap();
        let cos = g.input_float("cos", &[5, 4]).unwrap();
        let sin = g.input_float("sin", &[5, 4]).unwrap();
        let y = g.rms_norm(x, w, 1e-6).unwrap();
        let q = g.rotary(y, cos, sin).unwrap();
        let gqa = g.attention(q, k, k, AttentionOpts::default()).unwrap();
        let mha = g.attention(gqa, q, q, AttentionOpts::default()).unwrap();
        let labels = g.input_ids("labels", &[2, 3, 5]).unwrap();
        let loss = g.cross_entropy(mha, labels).unwrap();
        let g = crate::autodiff::backward(&g, loss).unwrap();
        let sup = GpuSupport::for_graph(&g);
        let refused: Vec<String> = (0..g.nodes().len())
            .filter_map(|i| sup.check(&g, i).err().map(|e| e.to_string()))
            .collect();
        assert!(refused.is_empty(), "{refused:?}");
        for op in ["rms_norm", "rms_norm_backward", "rotary", "attention", "attention_backward"] {
            assert!(g.nodes().iter().any(|n| n.op.name() == op), "the graph has no {op}");
        }
    }
}
