//! Batched matrix multiply with transpose flags: out = op(a) · op(b), op(x) = xᵀ when flagged.
//!
//! Mirrors `torch.matmul` on (…, M, K) × (K, N) or (…, K, N) operands (with `.mT` folded into the
//! flags, as cuBLAS's transa/transb) and llm.c's `matmul_forward`. Its backward needs no kernel of
//! its own: autodiff writes dA and dB as two more matmuls with other flags.

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::Real;
use crate::graph::builder::shape_err;
use crate::graph::{ElemType, Op};
use crate::graph::{Graph, GraphError, TensorId};
use crate::plan::Req;

/// (a (…, M, K), b (…, K, N) or (K, N)) → (…, M, N); a is (…, K, M) when `ta`, b is
/// (…, N, K) / (N, K) when `tb`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatMul {
    pub ta: bool,
    pub tb: bool,
}

impl Reference for MatMul {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let (sa, sb) = (a.shape(0), a.shape(1));
        let (ta, tb) = (self.ta, self.tb);
        let r = sa.len();
        let (m, k) = if ta { (sa[r - 1], sa[r - 2]) } else { (sa[r - 2], sa[r - 1]) };
        let n = if tb { sb[sb.len() - 2] } else { sb[sb.len() - 1] };
        let batch = sa[..r - 2].iter().product();
        let dims = MatMulDims { batch, m, n, k, ta, tb, b_batched: sb.len() > 2 };
        matmul_forward(&mut outs[0], a.f(0), a.f(1), &dims);
        Ok(())
    }
}

impl OpDef for MatMul {
    fn name(&self) -> &'static str {
        "matmul"
    }

    fn attrs(&self) -> String {
        format!("ta={} tb={}", self.ta, self.tb)
    }

    fn read_req(&self, _slot: usize) -> Req {
        // GEMM operands: transposes fold into the GEMM's flags.
        Req::Matrix
    }

    fn write_req(&self, _slot: usize) -> Req {
        // The GEMM writes its output with a leading dimension.
        Req::Rows
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let (ins, dy) = (cx.ins(), cx.gy()?);
        matmul_grads(cx.g, ins[0], ins[1], dy, self.ta, self.tb, cx.need)
    }
}

/// Sizes of one matmul: `batch` products of (M, K) × (K, N); `b_batched == false` shares one b
/// (a weight) across the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatMulDims {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ta: bool,
    pub tb: bool,
    pub b_batched: bool,
}

/// `out[i] = op(a[i]) · op(b[i or 0])`, accumulated in `T`.
// out: (batch, M, N)
// a: (batch, M, K), or (batch, K, M) when ta
// b: (batch or 1, K, N), or (batch or 1, N, K) when tb
pub fn matmul_forward<T: Real>(out: &mut [T], a: &[T], b: &[T], d: &MatMulDims) {
    if T::matmul_fast(out, a, b, d) {
        return;
    }
    matmul_loops(out, a, b, d);
}

/// The same product on the CPU GEMM library (one strided batched sgemm).
// out: (batch, M, N); a: (batch, M, K) or (batch, K, M); b: (batch or 1, K, N) or (…, N, K)
pub fn matmul_sgemm(out: &mut [f32], a: &[f32], b: &[f32], d: &MatMulDims) {
    use crate::backend::cpu::gemm::{sgemm_batched, Transpose};
    let MatMulDims { batch, m, n, k, ta, tb, b_batched } = *d;
    let flag = |t: bool| if t { Transpose::Yes } else { Transpose::No };
    let lda = if ta { m } else { k };
    let ldb = if tb { k } else { n };
    let stride_b = if b_batched { k * n } else { 0 };
    // A failing provider (e.g. ORTBENCH_GEMM=mkl without MKL) is a configuration error the
    // user must see, never a silent fall back to the slow loops.
    sgemm_batched(
        flag(ta),
        flag(tb),
        m,
        n,
        k,
        1.0,
        a,
        lda,
        b,
        ldb,
        0.0,
        out,
        n,
        batch,
        m * k,
        stride_b,
        m * n,
    )
    .unwrap_or_else(|e| panic!("matmul: {e}"));
}

/// The reference loops (accumulating in `T`).
pub fn matmul_loops<T: Real>(out: &mut [T], a: &[T], b: &[T], d: &MatMulDims) {
    let MatMulDims { batch, m, n, k, ta, tb, b_batched } = *d;
    // Pack op(a) as rows (M, K) and op(b) as rows (N, K): then every output is a contiguous dot.
    let mut a_rows = vec![T::ZERO; if ta { m * k } else { 0 }];
    let mut b_rows = vec![T::ZERO; if tb { 0 } else { n * k }];
    for bi in 0..batch {
        let a_b = &a[bi * m * k..(bi + 1) * m * k];
        let b_b = if b_batched { &b[bi * k * n..(bi + 1) * k * n] } else { &b[..k * n] };
        let a_r: &[T] = if ta {
            transpose_into(&mut a_rows, a_b, k, m);
            &a_rows
        } else {
            a_b
        };
        let b_r: &[T] = if tb {
            b_b
        } else {
            transpose_into(&mut b_rows, b_b, k, n);
            &b_rows
        };
        let out_b = &mut out[bi * m * n..(bi + 1) * m * n];
        for i in 0..m {
            let ar = &a_r[i * k..(i + 1) * k];
            for j in 0..n {
                let br = &b_r[j * k..(j + 1) * k];
                let mut acc = T::ZERO;
                for p in 0..k {
                    acc += ar[p] * br[p];
                }
                out_b[i * n + j] = acc;
            }
        }
    }
}

/// dst = srcᵀ
// dst: (C, R)
// src: (R, C)
fn transpose_into<T: Real>(dst: &mut [T], src: &[T], r: usize, c: usize) {
    for i in 0..r {
        for j in 0..c {
            dst[j * r + i] = src[i * c + j];
        }
    }
}

/// The gradients of a matmul as two more matmuls. With a shared 2-D b and a batched a, dB sums
/// over the batch, which the row-flattened a and dC express as one 2-D matmul (the builder
/// rejects ta=true in that case, where flattening would not be a reshape).
pub(crate) fn matmul_grads(
    g: &mut Graph,
    a: TensorId,
    b: TensorId,
    dc: TensorId,
    ta: bool,
    tb: bool,
    need: &[bool],
) -> Result<Vec<Option<TensorId>>, GraphError> {
    let da = if need[0] {
        Some(match (ta, tb) {
            (false, false) => g.matmul(dc, b, false, true)?,
            (false, true) => g.matmul(dc, b, false, false)?,
            (true, false) => g.matmul(b, dc, false, true)?,
            (true, true) => g.matmul(b, dc, true, true)?,
        })
    } else {
        None
    };
    let db = if need[1] {
        let (sa, sb) = (g.shape(a).to_vec(), g.shape(b).to_vec());
        let (a2, dc2) = if sb.len() == 2 && sa.len() > 2 {
            let k = sa[sa.len() - 1];
            let rows = sa.iter().product::<usize>() / k;
            let n = *g.shape(dc).last().expect("matmul output is >= 2-D");
            (g.reshape(a, &[rows, k])?, g.reshape(dc, &[rows, n])?)
        } else {
            (a, dc)
        };
        Some(match (ta, tb) {
            (false, false) => g.matmul(a2, dc2, true, false)?,
            (false, true) => g.matmul(dc2, a2, true, false)?,
            (true, false) => g.matmul(a2, dc2, false, false)?,
            (true, true) => g.matmul(dc2, a2, true, true)?,
        })
    } else {
        None
    };
    Ok(vec![da, db])
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// op(a) · op(b) over the last two dims, op = transpose when the flag is set. b is either a
    /// shared 2-D matrix (a weight) or has exactly a's batch dims.
    pub fn matmul(
        &mut self,
        a: TensorId,
        b: TensorId,
        ta: bool,
        tb: bool,
    ) -> Result<TensorId, GraphError> {
        let op = "matmul";
        let (sa, dt) = self.float_arg(op, "a", a)?;
        let (sb, _) = self.float_arg(op, "b", b)?;
        let named: &[(&str, &[usize])] = &[("a", &sa), ("b", &sb)];
        let (ra, rb) = (sa.len(), sb.len());
        if ra < 2 || rb < 2 {
            return Err(shape_err(op, "both operands must be at least 2-D", named));
        }
        let (m, ka) = if ta { (sa[ra - 1], sa[ra - 2]) } else { (sa[ra - 2], sa[ra - 1]) };
        let (kb, n) = if tb { (sb[rb - 1], sb[rb - 2]) } else { (sb[rb - 2], sb[rb - 1]) };
        if ka != kb {
            return Err(shape_err(
                op,
                format!("inner dims differ: K={ka} from a (ta={ta}), K={kb} from b (tb={tb})"),
                named,
            ));
        }
        let (batch_a, batch_b) = (&sa[..ra - 2], &sb[..rb - 2]);
        if !batch_b.is_empty() && batch_b != batch_a {
            return Err(shape_err(
                op,
                "b must be 2-D (shared across the batch) or have exactly a's batch dims",
                named,
            ));
        }
        if ta && batch_b.is_empty() && !batch_a.is_empty() {
            return Err(shape_err(
                op,
                "ta=true with a shared 2-D b is not supported (its gradient needs a batched reduction); permute a first",
                named,
            ));
        }
        let mut out = batch_a.to_vec();
        out.extend([m, n]);
        Ok(self.push(Op::MatMul(MatMul { ta, tb }), vec![a, b], vec![(out, ElemType::Float(dt))])
            [0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    /// Naive definition, index by index.
    fn naive(a: &[f64], b: &[f64], d: &MatMulDims) -> Vec<f64> {
        let MatMulDims { batch, m, n, k, ta, tb, b_batched } = *d;
        let mut out = vec![0.0; batch * m * n];
        for bi in 0..batch {
            let bb = if b_batched { bi } else { 0 };
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0.0;
                    for p in 0..k {
                        let av =
                            if ta { a[bi * m * k + p * m + i] } else { a[bi * m * k + i * k + p] };
                        let bv =
                            if tb { b[bb * k * n + j * k + p] } else { b[bb * k * n + p * n + j] };
                        s += av * bv;
                    }
                    out[bi * m * n + i * n + j] = s;
                }
            }
        }
        out
    }

    #[test]
    fn all_transpose_flags_and_shared_b_match_the_definition() {
        let mut rng = Rng::new(7);
        for ta in [false, true] {
            for tb in [false, true] {
                for b_batched in [false, true] {
                    let d = MatMulDims { batch: 3, m: 4, n: 5, k: 6, ta, tb, b_batched };
                    let a = rng.vec(3 * 4 * 6);
                    let b = rng.vec(if b_batched { 3 } else { 1 } * 5 * 6);
                    let mut out = vec![0.0; 3 * 4 * 5];
                    matmul_forward(&mut out, &a, &b, &d);
                    assert_close(&out, &naive(&a, &b, &d), 1e-14, &format!("{d:?}"));
                }
            }
        }
    }

    #[test]
    fn f32_path_through_the_gemm_library_matches_the_loops() {
        let mut rng = Rng::new(77);
        for &(batch, m, n, k) in &[(1, 1, 1, 1), (3, 5, 7, 9), (2, 33, 17, 65)] {
            for ta in [false, true] {
                for tb in [false, true] {
                    for b_batched in [false, true] {
                        let d = MatMulDims { batch, m, n, k, ta, tb, b_batched };
                        let a = rng.vec_f32(batch * m * k);
                        let b = rng.vec_f32(if b_batched { batch } else { 1 } * k * n);
                        let mut fast = vec![f32::NAN; batch * m * n];
                        let mut slow = vec![0f32; batch * m * n];
                        matmul_forward(&mut fast, &a, &b, &d);
                        matmul_loops(&mut slow, &a, &b, &d);
                        // f32 sums of K terms of magnitude < 1: differences from summation order
                        // stay below K·2^-23·max|term|.
                        let tol = 4.0 * k as f32 * f32::EPSILON;
                        for (x, y) in fast.iter().zip(&slow) {
                            assert!((x - y).abs() <= tol, "{d:?}: {x} vs {y}");
                        }
                    }
                }
            }
        }
    }
}
