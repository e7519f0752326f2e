//! Batched matmul on strided operands: transposes folded into GEMM flags, heads and batch dims
//! as per-matrix offsets, one big GEMM when the batch flattens into rows.
//!
//! The planner hands this kernel the operands' strides (a permute it folded becomes a
//! column-major operand, i.e. a transpose flag; a (B, H, T, D) view inside a (B, T, C) row
//! becomes a leading dimension and per-head offsets). A [`MatMulPlan`] is built once per node
//! at plan time, so a step only reads it.
//!
//! References: `ops::matmul` (tested against), cuBLAS/BLAS `gemm` semantics, llm.c
//! `matmul_forward`.

use super::super::blas::{gemm_par, gemm_st, GemmKind};
use super::elementwise as ew;
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::ResolveCx;
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::exec::planned::Aux;
use crate::exec::planned::{CpuSupport, PlannedExecutor, Resolved};
use crate::graph::op::{Linear, MatMul};
use crate::graph::{Graph, TensorId};
use crate::ops::OpError;
use crate::plan::layout::reshape_strides;
use crate::plan::rows::RowUse;
use crate::plan::PlanError;

/// Selected rows per gather chunk of a row-restricted matmul ([`RowUse::Dead`] / `Zero`).
pub const ROW_CHUNK: usize = 128;
/// Columns per gather chunk of a row-restricted contraction ([`RowUse::SparseK`]).
pub const SPARSE_K_COLS: usize = 4096;

/// The most selected rows (of `rows`) for which the row-restricted kernels run; above it the
/// gathers cost more than they save and the dense kernel runs.
pub fn row_cap(rows: usize) -> usize {
    rows / 2
}

/// Workspace (f32) a row-restricted matmul needs: `m`, `n`, `k` of the dense product
/// (for `SparseK`, `k` is the row count).
pub fn rows_workspace(use_: RowUse, m: usize, n: usize, k: usize) -> usize {
    match use_ {
        RowUse::Dead | RowUse::Zero => ROW_CHUNK * (k + n),
        RowUse::SparseK => {
            let (big, other) = if m >= n { (m, n) } else { (n, m) };
            row_cap(k) * (big.min(SPARSE_K_COLS) + other)
        }
        RowUse::Skip => 0,
    }
}

/// dst[i, :w] = src[rows[i], c0..c0 + w] (rows `ld` apart), split over the pool.
unsafe fn gather(
    pool: &Pool,
    dst: *mut f32,
    src: *const f32,
    ld: usize,
    rows: &[u32],
    c0: usize,
    w: usize,
) {
    let (d, s) = (SyncPtr(dst), SyncPtr(src as *mut f32));
    pool.for_ranges(rows.len(), ((1 << 14) / w.max(1)).max(1), 1, &|r| {
        for i in r {
            // SAFETY: row i of dst is this task's; the source rows are only read.
            std::ptr::copy_nonoverlapping(
                s.ptr().add(rows[i] as usize * ld + c0),
                d.ptr().add(i * w),
                w,
            );
        }
    });
}

/// dst[rows[i], :w] = src[i, :w], split over the pool.
unsafe fn scatter(pool: &Pool, dst: *mut f32, ld: usize, src: *const f32, rows: &[u32], w: usize) {
    let (d, s) = (SyncPtr(dst), SyncPtr(src as *mut f32));
    pool.for_ranges(rows.len(), ((1 << 14) / w.max(1)).max(1), 1, &|r| {
        for i in r {
            // SAFETY: the selected rows are distinct, so each destination row is one task's.
            std::ptr::copy_nonoverlapping(
                s.ptr().add(i * w),
                d.ptr().add(rows[i] as usize * ld),
                w,
            );
        }
    });
}

/// One matmul node, resolved: `batch` GEMMs of op(A) (M, K) · op(B) (K, N) → C (M, N).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatMulPlan {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// A is stored (K, M) / B is stored (N, K), rows `lda` / `ldb` apart.
    pub ta: bool,
    pub tb: bool,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    /// Element offsets of each matrix of A, B, C from the operands' starts.
    pub offs: Vec<(usize, usize, usize)>,
    /// f32 operands, or bf16 values on the bf16 kernel (set from the operands' dtypes).
    pub kind: GemmKind,
}

/// A matrix (rows, cols) with strides (sr, sc): Some((stored transposed, ld)).
fn matrix(rows: usize, cols: usize, sr: usize, sc: usize) -> Option<(bool, usize)> {
    if rows <= 1 && cols <= 1 {
        return Some((false, cols.max(1)));
    }
    if cols == 1 || sc == 1 {
        let ld = if rows == 1 { cols } else { sr };
        if ld >= cols.max(1) {
            return Some((false, ld));
        }
    }
    if rows == 1 || sr == 1 {
        let ld = if cols == 1 { rows } else { sc };
        if ld >= rows.max(1) {
            return Some((true, ld));
        }
    }
    None
}

/// Offsets of every index of `dims` (row-major order) with `strides`.
fn batch_offsets(dims: &[usize], strides: &[usize]) -> Vec<usize> {
    let n: usize = dims.iter().product();
    (0..n)
        .map(|mut flat| {
            let mut off = 0;
            for d in (0..dims.len()).rev() {
                off += (flat % dims[d]) * strides[d];
                flat /= dims[d];
            }
            off
        })
        .collect()
}

impl MatMulPlan {
    /// The plan of `op(a)·op(b)` for a (…, Ra, Ca), b (Rb, Cb) or (…, Rb, Cb), c (…, M, N) with
    /// these strides; None when an operand is not a (row- or column-major) matrix or C's rows
    /// are not contiguous.
    #[allow(
        clippy::too_many_arguments,
        reason = "a MatMul node's shapes, strides and transposes, each a GEMM argument"
    )]
    pub fn new(
        ta: bool,
        tb: bool,
        a: (&[usize], &[usize]),
        b: (&[usize], &[usize]),
        c: (&[usize], &[usize]),
    ) -> Option<Self> {
        let (ra, rb, rc) = (a.0.len(), b.0.len(), c.0.len());
        let (m, n) = (c.0[rc - 2], c.0[rc - 1]);
        let k = if ta { a.0[ra - 2] } else { a.0[ra - 1] };
        let (a_t, lda) = matrix(a.0[ra - 2], a.0[ra - 1], a.1[ra - 2], a.1[ra - 1])?;
        let (b_t, ldb) = matrix(b.0[rb - 2], b.0[rb - 1], b.1[rb - 2], b.1[rb - 1])?;
        let (c_t, ldc) = matrix(m, n, c.1[rc - 2], c.1[rc - 1])?;
        if c_t && !(m == 1 && n == 1) {
            return None;
        }
        let (ta, tb) = (ta ^ a_t, tb ^ b_t);
        let batch_dims = &a.0[..ra - 2];
        let batch: usize = batch_dims.iter().product();
        let b_shared = rb == 2;
        // One GEMM over all rows: A not transposed, B shared, and (batch…, M) of A and C each
        // one arithmetic progression of rows.
        if batch > 1 && b_shared && !ta {
            let rows = |shape: &[usize], strides: &[usize], ld: usize| {
                let r = shape.len();
                let st: Vec<isize> = strides[..r - 1].iter().map(|&s| s as isize).collect();
                reshape_strides(&shape[..r - 1], &st, &[batch * m])
                    .is_some_and(|s| batch * m == 1 || s[0] == ld as isize)
            };
            if rows(a.0, a.1, lda) && rows(c.0, c.1, ldc) {
                return Some(MatMulPlan {
                    m: batch * m,
                    n,
                    k,
                    ta,
                    tb,
                    lda,
                    ldb,
                    ldc,
                    offs: vec![(0, 0, 0)],
                    kind: GemmKind::F32,
                });
            }
        }
        let ao = batch_offsets(batch_dims, &a.1[..ra - 2]);
        let bo =
            if b_shared { vec![0; batch] } else { batch_offsets(&b.0[..rb - 2], &b.1[..rb - 2]) };
        let co = batch_offsets(&c.0[..rc - 2], &c.1[..rc - 2]);
        let offs = (0..batch).map(|i| (ao[i], bo[i], co[i])).collect();
        Some(MatMulPlan { m, n, k, ta, tb, lda, ldb, ldc, offs, kind: GemmKind::F32 })
    }

    fn small(&self) -> bool {
        self.m * self.n * self.k <= 4096
    }

    /// C = op(A)·op(B) for every matrix of the batch.
    ///
    /// # Safety
    /// The pointers are the operands' starts; every element the plan addresses is valid; C does
    /// not overlap A or B.
    pub unsafe fn run(&self, pool: &Pool, a: *const f32, b: *const f32, c: *mut f32) {
        let batch = self.offs.len();
        let t = pool.threads();
        let flops = 2 * self.m * self.n * self.k;
        let one = |i: usize, par: bool, a: *const f32, b: *const f32, c: *mut f32| {
            let (oa, ob, oc) = self.offs[i];
            let (a, b, c) = (a.add(oa), b.add(ob), c.add(oc));
            if self.small() {
                naive(self, a, b, c);
            } else if par {
                gemm_par(
                    pool, self.kind, self.ta, self.tb, self.m, self.n, self.k, 1.0, a, self.lda, b,
                    self.ldb, 0.0, c, self.ldc,
                );
            } else {
                gemm_st(
                    self.kind, self.ta, self.tb, self.m, self.n, self.k, 1.0, a, self.lda, b,
                    self.ldb, 0.0, c, self.ldc,
                );
            }
        };
        if batch == 1 || (batch < t && flops >= 1 << 22) || t == 1 {
            for i in 0..batch {
                one(i, true, a, b, c);
            }
            return;
        }
        // Matrices spread over the pool, contiguous ranges per task.
        let (ap, bp, cp) = (SyncPtr(a as *mut f32), SyncPtr(b as *mut f32), SyncPtr(c));
        let per = batch.div_ceil(t);
        pool.run(t, &|task| {
            for i in task * per..((task + 1) * per).min(batch) {
                // SAFETY: each matrix of C is written by one task (offsets of distinct batch
                // indices address disjoint C matrices).
                one(i, false, ap.ptr(), bp.ptr(), cp.ptr());
            }
        });
    }
}

impl MatMulPlan {
    /// Whether this product can run restricted to rows as `use_` says (one flattened GEMM with
    /// `rows` rows, or a contraction over `rows`).
    pub fn supports_rows(&self, use_: RowUse, rows: usize) -> bool {
        self.offs.len() == 1
            && match use_ {
                RowUse::Dead | RowUse::Zero => !self.ta && self.m == rows,
                RowUse::SparseK => self.ta && !self.tb && self.k == rows,
                RowUse::Skip => false,
            }
    }

    /// The product restricted to the selected rows `sel` (ascending, distinct): `Dead` computes
    /// only C's selected rows (the others are left as they are), `Zero` also zeroes the others,
    /// `SparseK` contracts over the selected rows of A and B only.
    ///
    /// # Safety
    /// As [`MatMulPlan::run`]; [`MatMulPlan::supports_rows`] holds; `ws` has
    /// [`rows_workspace`] elements.
    #[allow(clippy::too_many_arguments, reason = "as `run`, plus the row range and its workspace")]
    pub unsafe fn run_rows(
        &self,
        pool: &Pool,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        sel: &[u32],
        use_: RowUse,
        ws: &mut [f32],
    ) {
        let (m, n, k) = (self.m, self.n, self.k);
        let w = ws.as_mut_ptr();
        match use_ {
            RowUse::Dead | RowUse::Zero => {
                if use_ == RowUse::Zero {
                    // The unselected rows of C.
                    let cp = SyncPtr(c);
                    pool.for_ranges(m, ((1 << 15) / n.max(1)).max(1), 1, &|r| {
                        let mut j = sel.partition_point(|&s| (s as usize) < r.start);
                        for row in r {
                            if j < sel.len() && sel[j] as usize == row {
                                j += 1;
                            } else {
                                // SAFETY: row `row` of C is this task's.
                                std::slice::from_raw_parts_mut(cp.ptr().add(row * self.ldc), n)
                                    .fill(0.0);
                            }
                        }
                    });
                }
                let (wa, wc) = (w, w.add(ROW_CHUNK * k));
                for chunk in sel.chunks(ROW_CHUNK) {
                    gather(pool, wa, a, self.lda, chunk, 0, k);
                    gemm_par(
                        pool,
                        self.kind,
                        false,
                        self.tb,
                        chunk.len(),
                        n,
                        k,
                        1.0,
                        wa,
                        k,
                        b,
                        self.ldb,
                        0.0,
                        wc,
                        n,
                    );
                    scatter(pool, c, self.ldc, wc, chunk, n);
                }
            }
            RowUse::SparseK => {
                let nnz = sel.len();
                if nnz == 0 {
                    for i in 0..m {
                        std::slice::from_raw_parts_mut(c.add(i * self.ldc), n).fill(0.0);
                    }
                    return;
                }
                let cap = row_cap(k);
                if m >= n {
                    // Gather B's selected rows once, A's in column blocks of C's rows.
                    let (wb, wa) = (w, w.add(cap * n));
                    gather(pool, wb, b, self.ldb, sel, 0, n);
                    let mut m0 = 0;
                    while m0 < m {
                        let mc = SPARSE_K_COLS.min(m - m0);
                        gather(pool, wa, a, self.lda, sel, m0, mc);
                        gemm_par(
                            pool,
                            self.kind,
                            true,
                            false,
                            mc,
                            n,
                            nnz,
                            1.0,
                            wa,
                            mc,
                            wb,
                            n,
                            0.0,
                            c.add(m0 * self.ldc),
                            self.ldc,
                        );
                        m0 += mc;
                    }
                } else {
                    let (wa, wb) = (w, w.add(cap * m));
                    gather(pool, wa, a, self.lda, sel, 0, m);
                    let mut n0 = 0;
                    while n0 < n {
                        let nc = SPARSE_K_COLS.min(n - n0);
                        gather(pool, wb, b, self.ldb, sel, n0, nc);
                        gemm_par(
                            pool,
                            self.kind,
                            true,
                            false,
                            m,
                            nc,
                            nnz,
                            1.0,
                            wa,
                            m,
                            wb,
                            nc,
                            0.0,
                            c.add(n0),
                            self.ldc,
                        );
                        n0 += nc;
                    }
                }
            }
            RowUse::Skip => unreachable!("a sum over rows is not a matmul"),
        }
    }
}

/// Plain loops for tiny matrices (BERT's per-token 1×1·1×C padding products): an MKL call
/// costs more than the arithmetic.
unsafe fn naive(p: &MatMulPlan, a: *const f32, b: *const f32, c: *mut f32) {
    for i in 0..p.m {
        for j in 0..p.n {
            let mut acc = 0f32;
            for q in 0..p.k {
                let av = if p.ta { *a.add(q * p.lda + i) } else { *a.add(i * p.lda + q) };
                let bv = if p.tb { *b.add(j * p.ldb + q) } else { *b.add(q * p.ldb + j) };
                acc += av * bv;
            }
            *c.add(i * p.ldc + j) = acc;
        }
    }
}

impl CpuKernel for MatMul {
    fn workspace(&self, cpu: &CpuSupport, g: &Graph, node: usize) -> usize {
        let Some((_, u)) = cpu.row_use(node) else { return 0 };
        let n = &g.nodes()[node];
        let (sa, so) = (g.shape(n.inputs[0]), g.shape(n.outputs[0]));
        let (m, nn) = (so[so.len() - 2], so[so.len() - 1]);
        let k = if self.ta { sa[sa.len() - 2] } else { sa[sa.len() - 1] };
        // Dead/Zero run on the flattened rows of the output; SparseK contracts over k rows.
        let rows = g.tensor(n.outputs[0]).numel() / nn.max(1);
        rows_workspace(u, if u == RowUse::SparseK { m } else { rows }, nn, k)
    }

    fn resolve(&self, cx: &ResolveCx<'_>) -> Result<Aux, PlanError> {
        let node = cx.node;
        gemm_plan(cx, (self.ta, self.tb), [node.inputs[0], node.inputs[1], node.outputs[0]])
    }

    fn flops(&self, x: &PlannedExecutor, r: &Resolved) -> f64 {
        gemm_flops(x, r)
    }

    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let Aux::MatMul(m, rows) = &k.r.aux else { unreachable!("resolved at build") };
        let (a, b, c) =
            (k.ptr(k.node.inputs[0]), k.ptr(k.node.inputs[1]), k.ptr(k.node.outputs[0]));
        match rows.and_then(|(set, u)| Some((k.selected_rows(set)?, u))) {
            Some((sel, u)) => m.run_rows(k.pool, a, b, c, sel, u, k.ws()),
            None => m.run(k.pool, a, b, c),
        }

        Ok(())
    }
}

impl CpuKernel for Linear {
    fn resolve(&self, cx: &ResolveCx<'_>) -> Result<Aux, PlanError> {
        // The GEMM writes x·op(w) into y, or into the saved pre-activation with GELU.
        let node = cx.node;
        let c = node.outputs[usize::from(self.gelu.is_some())];
        gemm_plan(cx, (false, self.tb), [node.inputs[0], node.inputs[1], c])
    }

    fn flops(&self, x: &PlannedExecutor, r: &Resolved) -> f64 {
        gemm_flops(x, r)
    }

    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let Linear { gelu, .. } = self;
        let Aux::MatMul(m, _) = &k.r.aux else { unreachable!("resolved at build") };
        let (x, w) = (k.ptr(k.node.inputs[0]), k.ptr(k.node.inputs[1]));
        match gelu {
            Some(approx) => {
                m.run(k.pool, x, w, k.ptr(k.node.outputs[1]));
                ew::bias_gelu(k.pool, k.wr(0), k.wr(1), k.rd(2), *approx);
            }
            None => {
                m.run(k.pool, x, w, k.ptr(k.node.outputs[0]));
                ew::map2_inplace_a(k.pool, k.wr(0), k.rd(2), ew::Add);
            }
        }

        Ok(())
    }
}

/// The GEMM plan of c = op(a)·op(b) over the operands' planned layouts.
fn gemm_plan(
    cx: &ResolveCx<'_>,
    (ta, tb): (bool, bool),
    [a, b, c]: [TensorId; 3],
) -> Result<Aux, PlanError> {
    let (g, pl) = (cx.g, |t: TensorId| &cx.pl(t).strides);
    MatMulPlan::new(ta, tb, (g.shape(a), pl(a)), (g.shape(b), pl(b)), (g.shape(c), pl(c)))
        .map(|m| MatMulPlan { kind: GemmKind::of(g.tensor(a).elem, g.tensor(b).elem), ..m })
        .map(|m| Aux::MatMul(m, None))
        .ok_or_else(|| cx.no(" for these operand layouts"))
}

/// GEMM FLOPs of a resolved matmul in the executor's last step: the selected rows only when a
/// row set restricted it.
fn gemm_flops(x: &PlannedExecutor, r: &Resolved) -> f64 {
    let Aux::MatMul(m, rows) = &r.aux else { unreachable!("resolved at build") };
    let dense = 2.0 * (m.m * m.n * m.k * m.offs.len()) as f64;
    match rows {
        Some((set, u)) if x.sel[*set].len() <= row_cap(x.row_sets[*set].rows) => {
            let sel = x.sel[*set].len() as f64;
            match u {
                RowUse::SparseK => 2.0 * (m.m * m.n) as f64 * sel,
                _ => 2.0 * (m.n * m.k) as f64 * sel,
            }
        }
        _ => dense,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::matmul::{matmul_loops, MatMulDims};
    use crate::ops::testutil::Rng;
    use crate::plan::layout::{contiguous_strides, permute_strides};

    fn us(v: &[isize]) -> Vec<usize> {
        v.iter().map(|&x| x as usize).collect()
    }

    /// Contiguous operands, every flag, shared and batched b, against the reference loops:
    /// |Δ| ≤ 4·K·ε·max|term| (summation order).
    #[test]
    fn contiguous_operands_match_the_reference() {
        let pool = Pool::new(2);
        let mut rng = Rng::new(3);
        for &(batch, m, n, k) in &[
            (1usize, 1usize, 1usize, 1usize),
            (3, 5, 7, 9),
            (4, 64, 48, 80),
            (2, 130, 20, 300),
            (16, 1, 32, 1),
            (1, 256, 256, 64),
        ] {
            for ta in [false, true] {
                for tb in [false, true] {
                    for shared in [false, true] {
                        if ta && shared && batch > 1 {
                            continue; // the builder rejects it
                        }
                        let d = MatMulDims { batch, m, n, k, ta, tb, b_batched: !shared };
                        let a = rng.vec_f32(batch * m * k);
                        let b = rng.vec_f32(if shared { 1 } else { batch } * k * n);
                        let mut want = vec![0.0; batch * m * n];
                        matmul_loops(&mut want, &a, &b, &d);
                        let a_shape = [batch, if ta { k } else { m }, if ta { m } else { k }];
                        let b_shape: Vec<usize> = if shared { vec![] } else { vec![batch] }
                            .into_iter()
                            .chain(if tb { [n, k] } else { [k, n] })
                            .collect();
                        let c_shape = [batch, m, n];
                        let plan = MatMulPlan::new(
                            ta,
                            tb,
                            (&a_shape, &us(&contiguous_strides(&a_shape))),
                            (&b_shape, &us(&contiguous_strides(&b_shape))),
                            (&c_shape, &us(&contiguous_strides(&c_shape))),
                        )
                        .unwrap();
                        let mut got = vec![f32::NAN; batch * m * n];
                        unsafe { plan.run(&pool, a.as_ptr(), b.as_ptr(), got.as_mut_ptr()) };
                        let tol = 4.0 * k as f32 * f32::EPSILON;
                        for (x, y) in got.iter().zip(&want) {
                            assert!((x - y).abs() <= tol, "{d:?}: {x} vs {y}");
                        }
                    }
                }
            }
        }
    }

    /// Row-restricted products against the dense ones on the selected rows.
    #[test]
    fn row_restricted_products_match_the_dense_ones() {
        let pool = Pool::new(2);
        let mut rng = Rng::new(8);
        let (r, k, n) = (300usize, 48usize, 700usize);
        let sel: Vec<u32> = (0..r as u32).filter(|i| i % 7 == 2 || *i == 299).collect();
        assert!(sel.len() <= row_cap(r));
        let cs = |s: &[usize]| us(&contiguous_strides(s));
        for tb in [false, true] {
            // Dead and Zero: C (R, N) = A (R, K) · op(B).
            let a = rng.vec_f32(r * k);
            let b = rng.vec_f32(k * n);
            let b_shape = if tb { [n, k] } else { [k, n] };
            let plan = MatMulPlan::new(
                false,
                tb,
                (&[r, k], &cs(&[r, k])),
                (&b_shape, &cs(&b_shape)),
                (&[r, n], &cs(&[r, n])),
            )
            .unwrap();
            assert!(plan.supports_rows(RowUse::Dead, r));
            let mut dense = vec![0.0; r * n];
            unsafe { plan.run(&pool, a.as_ptr(), b.as_ptr(), dense.as_mut_ptr()) };
            let mut ws = vec![0.0; rows_workspace(RowUse::Zero, r, n, k)];
            let mut z = vec![f32::NAN; r * n];
            unsafe {
                plan.run_rows(
                    &pool,
                    a.as_ptr(),
                    b.as_ptr(),
                    z.as_mut_ptr(),
                    &sel,
                    RowUse::Zero,
                    &mut ws,
                )
            };
            for row in 0..r {
                let picked = sel.contains(&(row as u32));
                for j in 0..n {
                    let (x, y) = (z[row * n + j], dense[row * n + j]);
                    if picked {
                        assert!(
                            (x - y).abs() <= 4.0 * k as f32 * f32::EPSILON,
                            "tb={tb} [{row},{j}] {x} vs {y}"
                        );
                    } else {
                        assert_eq!(x, 0.0);
                    }
                }
            }
        }
        // SparseK: C (M, N) = Aᵀ·B over rows, A (R, M) and B (R, N) zero outside the set.
        for (m, n) in [(700usize, 40usize), (40, 5000)] {
            let mut a = rng.vec_f32(r * m);
            let mut b = rng.vec_f32(r * n);
            for row in 0..r {
                if !sel.contains(&(row as u32)) {
                    a[row * m..(row + 1) * m].fill(0.0);
                    b[row * n..(row + 1) * n].fill(0.0);
                }
            }
            let plan = MatMulPlan::new(
                true,
                false,
                (&[r, m], &cs(&[r, m])),
                (&[r, n], &cs(&[r, n])),
                (&[m, n], &cs(&[m, n])),
            )
            .unwrap();
            assert!(plan.supports_rows(RowUse::SparseK, r));
            let mut dense = vec![0.0; m * n];
            unsafe { plan.run(&pool, a.as_ptr(), b.as_ptr(), dense.as_mut_ptr()) };
            let mut ws = vec![0.0; rows_workspace(RowUse::SparseK, m, n, r)];
            let mut s = vec![f32::NAN; m * n];
            unsafe {
                plan.run_rows(
                    &pool,
                    a.as_ptr(),
                    b.as_ptr(),
                    s.as_mut_ptr(),
                    &sel,
                    RowUse::SparseK,
                    &mut ws,
                )
            };
            for (x, y) in s.iter().zip(&dense) {
                assert!(
                    (x - y).abs() <= 4.0 * sel.len() as f32 * f32::EPSILON,
                    "{m}x{n}: {x} vs {y}"
                );
            }
        }
    }

    /// attention-style operands: q·kᵀ with q, k (B, H, T, D) views inside (B, T, 3C) rows and
    /// a transposed (column-major) operand from a folded permute.
    #[test]
    fn strided_views_fold_into_leading_dims_and_flags() {
        let pool = Pool::new(2);
        let (b, t, h, d) = (2usize, 7usize, 3usize, 4usize);
        let c = h * d;
        let mut rng = Rng::new(4);
        let qkv = rng.vec_f32(b * t * 3 * c); // (B, T, 3C)
                                              // q = qkv[..., :C] as (B, H, T, D): strides (T·3C, D, 3C, 1); k at offset C.
        let shape = [b, h, t, d];
        let st = [t * 3 * c, d, 3 * c, 1];
        let gather = |off: usize| -> Vec<f32> {
            let mut v = Vec::new();
            for bi in 0..b {
                for hi in 0..h {
                    for ti in 0..t {
                        for di in 0..d {
                            v.push(qkv[off + bi * st[0] + hi * st[1] + ti * st[2] + di]);
                        }
                    }
                }
            }
            v
        };
        let (q, k) = (gather(0), gather(c));
        let dims =
            MatMulDims { batch: b * h, m: t, n: t, k: d, ta: false, tb: true, b_batched: true };
        let mut want = vec![0.0; b * h * t * t];
        matmul_loops(&mut want, &q, &k, &dims);
        let c_shape = [b, h, t, t];
        let plan = MatMulPlan::new(
            false,
            true,
            (&shape, &st),
            (&shape, &st),
            (&c_shape, &us(&contiguous_strides(&c_shape))),
        )
        .unwrap();
        assert_eq!((plan.lda, plan.ldb, plan.offs.len()), (3 * c, 3 * c, b * h));
        let mut got = vec![0.0; want.len()];
        unsafe { plan.run(&pool, qkv.as_ptr(), qkv.as_ptr().add(c), got.as_mut_ptr()) };
        for (x, y) in got.iter().zip(&want) {
            assert!((x - y).abs() <= 1e-5);
        }
        // kᵀ as a folded permute (B, H, D, T): column-major, so tb flips.
        let kt_strides = us(&permute_strides(
            &st.iter().map(|&s| s as isize).collect::<Vec<_>>(),
            &[0, 1, 3, 2],
        ));
        let kt_shape = [b, h, d, t];
        let plan2 = MatMulPlan::new(
            false,
            false,
            (&shape, &st),
            (&kt_shape, &kt_strides),
            (&c_shape, &us(&contiguous_strides(&c_shape))),
        )
        .unwrap();
        assert!(plan2.tb);
        let mut got2 = vec![0.0; want.len()];
        unsafe { plan2.run(&pool, qkv.as_ptr(), qkv.as_ptr().add(c), got2.as_mut_ptr()) };
        assert_eq!(got, got2);
        // Rows of the batch flatten into one GEMM with a shared weight.
        let w = rng.vec_f32(c * 5);
        let plan3 = MatMulPlan::new(
            false,
            false,
            (&[b, t, c], &[t * 3 * c, 3 * c, 1]),
            (&[c, 5], &[5, 1]),
            (&[b, t, 5], &[t * 5, 5, 1]),
        )
        .unwrap();
        assert_eq!((plan3.m, plan3.offs.len()), (b * t, 1));
        let plan4 = MatMulPlan::new(
            false,
            false,
            (&[b, t, c], &[t * 3 * c + 1, 3 * c, 1]),
            (&[c, 5], &[5, 1]),
            (&[b, t, 5], &[t * 5, 5, 1]),
        )
        .unwrap();
        assert_eq!((plan4.m, plan4.offs.len()), (t, b));
        let _ = w;
    }
}
