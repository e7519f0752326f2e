//! Linear + cross-entropy without the logits: the labelled rows of x are taken a chunk at a
//! time; each chunk's logits (chunk, V) are made by one GEMM into the workspace, reduced to
//! their log-sum-exp and loss, and — when gradients are asked for — turned in place into
//! g = dloss/count·(softmax − onehot) (the logits soft-capped first when the op says so, g then
//! times the cap's derivative), from which two more GEMMs give the chunk's dx rows and
//! add its part of dw (f32 accumulation in the GEMM), and a column sum its part of dbias.
//! The chunk's buffer is then reused: the workspace holds one chunk, never the (R, V) logits.
//!
//! One sweep gives the loss and every gradient: the unfused graph's three head GEMMs (logits,
//! dx, dw), not the four of a forward that keeps only the log-sum-exp and a backward that
//! recomputes the logits (`Op::LinearCrossEntropyBackward` is that sweep; the training pass
//! `fuse_linear_cross_entropy_backward` makes it give the loss too). Rows whose label is the
//! ignore index are never gathered (a masked LM's 85 %): dx is zero there.
//!
//! Chunks are `chunk_rows(V, threads)` rows: about [`CHUNK_LOGITS_BYTES`] of logits, at least
//! 8 rows per thread, at most [`MAX_CHUNK`]. Per-row losses are summed in row order, so the loss does not
//! depend on the thread count; dw and dbias add chunk after chunk in row order too.
//!
//! References: `ops::linear_cross_entropy` (tested against); Liger-Kernel's
//! `fused_linear_cross_entropy_forward` (chunks of rows, gradients in the same pass); Apple's
//! Cut Cross-Entropy.

use super::cross_entropy::{check_labels, lse};
use super::linear_cross_entropy as lce;
use super::simd::{self, multiversion};
use crate::backend::cpu::blas::{gemm_par, GemmKind};
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::exec::planned::CpuSupport;
use crate::graph::op::{LinearCrossEntropy, LinearCrossEntropyBackward};
use crate::graph::Graph;
use crate::graph::Op;
use crate::ops::linear_cross_entropy::SoftCap;
use crate::ops::OpError;

/// The most rows one chunk holds (its row indices live on the stack).
pub const MAX_CHUNK: usize = 1024;

/// The f32 logits of one chunk: 128 MiB (672 rows at gpt2's vocabulary). Each chunk's dw GEMM
/// re-reads and re-writes dw (V, C), and a small K runs that GEMM below its peak, so the fused
/// kernel's time falls towards the unfused kernels' as chunks grow; past this size little is
/// left to gain for the memory (the former `bench_lm_head` test at several sizes:
/// docs/measurements.md, "Fused LM head"; now `cargo bench -p ortbench --bench kernels --
/// lm_head`, at this size).
pub const CHUNK_LOGITS_BYTES: usize = 128 << 20;

/// Rows per chunk for a vocabulary of `v` on `threads`: the logits chunk near
/// [`CHUNK_LOGITS_BYTES`], at least 8 rows per thread so the row pass splits, a multiple of 8,
/// at most [`MAX_CHUNK`].
pub fn chunk_rows(v: usize, threads: usize) -> usize {
    let by_bytes = crate::ops::linear_cross_entropy::rows_of_logits(CHUNK_LOGITS_BYTES, v);
    by_bytes.max(8 * threads.max(1)).next_multiple_of(8).min(MAX_CHUNK)
}

/// Workspace elements (f32) for `rows` rows of width `c` over a vocabulary of `v` in chunks of
/// `chunk`: logits (chunk, V), gathered x (chunk, C), dx rows (chunk, C), row losses (chunk).
pub fn workspace(rows: usize, c: usize, v: usize, chunk: usize) -> usize {
    let k = chunk.min(rows.max(1));
    k * v + 2 * k * c + k
}

/// The operands of one call.
// x: (R, C); w: (V, C); labels: (R); bias: (V)
pub struct Lce<'a> {
    pub x: &'a [f32],
    pub w: &'a [f32],
    pub labels: &'a [i64],
    pub bias: Option<&'a [f32]>,
    pub c: usize,
    pub v: usize,
    pub ignore_index: i64,
    /// The logits soft-capped before the loss.
    pub softcap: Option<SoftCap>,
    pub chunk: usize,
    /// Whether rows with an ignored label are left out of the GEMMs (the row skip,
    /// `plan::rows`); when not, they are computed and their loss and gradient zeroed — the
    /// same results, the unskipped work (`ORTBENCH_ROW_SKIP=0`).
    pub skip_ignored: bool,
    /// `Bf16` when x and w are bf16: the logits GEMM runs on the bf16 kernel, and the two
    /// gradient GEMMs read the logits' gradient rounded to bf16, as autocast's bf16 head
    /// backward does (HF's `logits.float()` hands a bf16 gradient to the bf16 matmul).
    pub kind: GemmKind,
}

/// Where the gradients go.
// dx: (R, C); dw: (V, C); db: (V)
pub struct LceGrads<'a> {
    pub dloss: f32,
    pub dx: &'a mut [f32],
    pub dw: &'a mut [f32],
    pub db: Option<&'a mut [f32]>,
}

/// One chunk's logits rows: bias added, soft-capped (z ← cap·tanh(inv·z), as the unfused
/// scale, tanh and scale kernels compute it), per-row loss lse − z[y], and with `g` the row
/// overwritten by g·softmax − g·onehot (times the cap's derivative, t recovered as z/cap).
#[inline(always)]
fn rows_pass(
    logits: &mut [f32],
    losses: &mut [f32],
    labels: &[i64],
    bias: Option<&[f32]>,
    v: usize,
    g: Option<f32>,
    LinearCrossEntropy { ignore_index, softcap }: LinearCrossEntropy,
) {
    for ((row, loss), &y) in logits.chunks_exact_mut(v).zip(losses.iter_mut()).zip(labels) {
        if y == ignore_index {
            // A row computed without the row skip: no loss, no gradient.
            *loss = 0.0;
            row.fill(0.0);
            continue;
        }
        if let Some(b) = bias {
            for (z, &bj) in row.iter_mut().zip(b) {
                *z += bj;
            }
        }
        if let Some(s) = softcap {
            for z in row.iter_mut() {
                *z = s.cap * simd::tanh(*z * s.inv);
            }
        }
        let l = lse(row);
        *loss = l - row[y as usize];
        let Some(g) = g else { continue };
        match softcap {
            None => {
                for z in row.iter_mut() {
                    *z = g * simd::exp(*z - l);
                }
                row[y as usize] -= g;
            }
            Some(s) => {
                for (j, z) in row.iter_mut().enumerate() {
                    let mut d = g * simd::exp(*z - l);
                    if j == y as usize {
                        d -= g;
                    }
                    *z = s.grad(d, *z / s.cap);
                }
            }
        }
    }
}
multiversion!(fn rows_chunk<>(logits: &mut [f32], losses: &mut [f32], labels: &[i64], bias: Option<&[f32]>, v: usize, g: Option<f32>, head: LinearCrossEntropy) => rows_pass);

/// dbias[j] += Σ_rows g[row, j] over columns `cols`.
#[inline(always)]
fn colsum_pass(db: &mut [f32], g: &[f32], n: usize, v: usize, cols: std::ops::Range<usize>) {
    for r in 0..n {
        let row = &g[r * v + cols.start..r * v + cols.end];
        for (d, &x) in db.iter_mut().zip(row) {
            *d += x;
        }
    }
}
multiversion!(fn colsum_chunk<>(db: &mut [f32], g: &[f32], n: usize, v: usize, cols: std::ops::Range<usize>) => colsum_pass);

/// The mean loss over labelled rows (NaN when none is); with `grads`, dx (zero on ignored
/// rows), dw and dbias of dloss × that mean, overwritten.
pub fn linear_cross_entropy(
    pool: &Pool,
    p: &Lce<'_>,
    ws: &mut [f32],
    mut grads: Option<LceGrads<'_>>,
) -> Result<f32, OpError> {
    let (c, v) = (p.c, p.v);
    let count = check_labels(p.labels, v, p.ignore_index).map_err(|e| match e {
        OpError::IndexOutOfRange { index, position, limit, .. } => {
            OpError::IndexOutOfRange { op: "linear_cross_entropy", index, position, limit }
        }
    })?;
    let chunk = p.chunk.clamp(1, MAX_CHUNK);
    let k = chunk.min(p.labels.len().max(1));
    let (logits, rest) = ws.split_at_mut(k * v);
    let (xs, rest) = rest.split_at_mut(k * c);
    let (dxs, rest) = rest.split_at_mut(k * c);
    let losses = &mut rest[..k];
    let g = grads.as_ref().map(|gr| gr.dloss / count.max(1) as f32);
    if let Some(gr) = grads.as_mut() {
        gr.dx.fill(0.0);
        gr.dw.fill(0.0);
        if let Some(db) = gr.db.as_deref_mut() {
            db.fill(0.0);
        }
    }
    let mut idx = [0u32; MAX_CHUNK];
    let mut sum = 0f32;
    let skip = p.skip_ignored;
    let mut rows = p.labels.iter().enumerate().filter(|(_, &y)| !skip || y != p.ignore_index);
    loop {
        // The next chunk of labelled rows, gathered.
        let mut n = 0;
        for (r, _) in rows.by_ref().take(k) {
            idx[n] = r as u32;
            xs[n * c..(n + 1) * c].copy_from_slice(&p.x[r * c..(r + 1) * c]);
            n += 1;
        }
        if n == 0 {
            break;
        }
        let labels: [i64; MAX_CHUNK] =
            std::array::from_fn(|i| if i < n { p.labels[idx[i] as usize] } else { 0 });
        // logits (n, V) = xs (n, C) · wᵀ
        // SAFETY: xs (n, C), w (V, C) and logits (n, V) are valid and disjoint.
        unsafe {
            gemm_par(
                pool,
                p.kind,
                false,
                true,
                n,
                v,
                c,
                1.0,
                xs.as_ptr(),
                c,
                p.w.as_ptr(),
                c,
                0.0,
                logits.as_mut_ptr(),
                v,
            )
        };
        let lp = SyncPtr(logits.as_mut_ptr());
        let sp = SyncPtr(losses.as_mut_ptr());
        pool.for_ranges(n, ((1 << 14) / v).max(1), 1, &|r| {
            // SAFETY: row ranges are disjoint and inside the chunk's logits and losses.
            rows_chunk(
                unsafe { lp.slice(r.start * v..r.end * v) },
                unsafe { sp.slice(r.clone()) },
                &labels[r],
                p.bias,
                v,
                g,
                LinearCrossEntropy { ignore_index: p.ignore_index, softcap: p.softcap },
            )
        });
        for &l in &losses[..n] {
            sum += l;
        }
        let Some(gr) = grads.as_mut() else { continue };
        // dx rows (n, C) = g (n, V) · w (V, C), scattered to the chunk's rows.
        // dw (V, C) += gᵀ (V, n) · xs (n, C).
        // SAFETY: all operands valid at these sizes; outputs disjoint from inputs.
        unsafe {
            gemm_par(
                pool,
                p.kind,
                false,
                false,
                n,
                c,
                v,
                1.0,
                logits.as_ptr(),
                v,
                p.w.as_ptr(),
                c,
                0.0,
                dxs.as_mut_ptr(),
                c,
            );
            gemm_par(
                pool,
                p.kind,
                true,
                false,
                v,
                c,
                n,
                1.0,
                logits.as_ptr(),
                v,
                xs.as_ptr(),
                c,
                1.0,
                gr.dw.as_mut_ptr(),
                c,
            );
        }
        for (i, &r) in idx[..n].iter().enumerate() {
            let r = r as usize;
            gr.dx[r * c..(r + 1) * c].copy_from_slice(&dxs[i * c..(i + 1) * c]);
        }
        if let Some(db) = gr.db.as_deref_mut() {
            let dp = SyncPtr(db.as_mut_ptr());
            let gl = &*logits;
            pool.for_ranges(v, 1024, 16, &|cols| {
                // SAFETY: column ranges are disjoint and inside dbias.
                colsum_chunk(unsafe { dp.slice(cols.clone()) }, gl, n, v, cols)
            });
        }
    }
    Ok(sum / count as f32)
}

impl CpuKernel for LinearCrossEntropy {
    fn workspace(&self, cpu: &CpuSupport, g: &Graph, node: usize) -> usize {
        lce_workspace(cpu, g, node, 0)
    }

    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let LinearCrossEntropy { ignore_index, softcap } = self;
        // Operands from x on: the backward's slot 0 is dloss.
        let at = usize::from(matches!(k.node.op, Op::LinearCrossEntropyBackward(_)));
        let (v, c) = (k.g.shape(k.node.inputs[at + 1])[0], k.g.shape(k.node.inputs[at + 1])[1]);
        let labels = k.ids(at + 2);
        let p = lce::Lce {
            x: k.rd(at),
            w: k.rd(at + 1),
            labels,
            bias: (k.node.inputs.len() > at + 3).then(|| k.rd(at + 3)),
            c,
            v,
            ignore_index: *ignore_index,
            softcap: *softcap,
            chunk: lce::chunk_rows(v, k.pool.threads()),
            skip_ignored: k.x.row_skip,
            kind: GemmKind::of(
                k.g.tensor(k.node.inputs[at]).elem,
                k.g.tensor(k.node.inputs[at + 1]).elem,
            ),
        };
        let grads = (at == 1).then(|| lce::LceGrads {
            dloss: k.rd(0)[0],
            dx: k.wr(1),
            dw: k.wr(2),
            db: (k.node.outputs.len() > 3).then(|| k.wr(3)),
        });
        let gemms = if at == 1 { 3 } else { 1 };
        k.wr(0)[0] = lce::linear_cross_entropy(k.pool, &p, k.ws(), grads)?;
        let rows = match k.x.row_skip {
            true => labels.iter().filter(|&&l| l != *ignore_index).count(),
            false => labels.len(),
        };
        k.x.lce_flops
            .fetch_add((gemms * 2 * rows * c * v) as u64, std::sync::atomic::Ordering::Relaxed);

        Ok(())
    }
}

impl CpuKernel for LinearCrossEntropyBackward {
    // Operands from x on: slot 0 is dloss.
    fn workspace(&self, cpu: &CpuSupport, g: &Graph, node: usize) -> usize {
        lce_workspace(cpu, g, node, 1)
    }

    // One kernel call for both directions: it reads which from the node.
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        LinearCrossEntropy { ignore_index: self.ignore_index, softcap: self.softcap }.exec(k)
    }
}

/// One chunk of logits, gathered rows, dx rows and row losses; `x` is the slot of x (the
/// backward's slot 0 is dloss).
fn lce_workspace(cpu: &CpuSupport, g: &Graph, node: usize, x: usize) -> usize {
    let n = &g.nodes()[node];
    let (c, v) = (g.shape(n.inputs[x + 1])[1], g.shape(n.inputs[x + 1])[0]);
    let rows = g.tensor(n.inputs[x + 2]).numel();
    workspace(rows, c, v, chunk_rows(v, cpu.threads))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::linear_cross_entropy as reference;
    use crate::ops::testutil::Rng;

    fn max_abs(a: &[f32]) -> f32 {
        a.iter().fold(0f32, |m, x| m.max(x.abs()))
    }

    /// The chunked kernel, with the row skip and without, against the row-by-row reference (f64), at row counts that are not
    /// multiples of the chunk (3, 7 and one chunk of everything), vocabularies that are not
    /// multiples of the SIMD width, with a bias and without, some rows ignored: loss within
    /// 2e-6 relative, every gradient within 2e-5 of its largest element (f32 GEMMs over K = V
    /// or K = rows in another order). A chunk boundary off by one drops or repeats a row and
    /// fails these comparisons.
    #[test]
    fn chunked_kernel_matches_the_row_by_row_reference() {
        let pool = Pool::new(2);
        let cap = Some(SoftCap { inv: 1.0 / 1.5, cap: 1.5 });
        for &(r, c, v, chunk, bias, softcap) in &[
            (29usize, 24usize, 131usize, 3usize, true, None),
            (29, 24, 131, 7, false, None),
            (40, 16, 1000, 64, true, None),
            (1, 8, 9, 3, false, None),
            (29, 24, 131, 7, true, cap),
            (40, 16, 1000, 64, false, cap),
        ] {
            let mut rng = Rng::new((r * 1000 + v + chunk) as u64);
            let x: Vec<f32> = rng.vec_f32(r * c).iter().map(|a| 1.5 * a).collect();
            let w: Vec<f32> = rng.vec_f32(v * c).iter().map(|a| 0.8 * a).collect();
            let b: Vec<f32> = rng.vec_f32(v);
            let labels: Vec<i64> =
                (0..r).map(|i| if i % 4 == 1 { -100 } else { rng.below(v) as i64 }).collect();
            let labels = if r == 1 { vec![5] } else { labels };
            let bias = bias.then_some(&b[..]);
            let f64s = |a: &[f32]| a.iter().map(|&x| x as f64).collect::<Vec<f64>>();
            let (x64, w64, b64) = (f64s(&x), f64s(&w), f64s(&b));
            let (mut dx0, mut dw0, mut db0) = (vec![0.0; r * c], vec![0.0; v * c], vec![0.0; v]);
            let want = reference::linear_cross_entropy(
                &x64,
                &w64,
                &labels,
                bias.map(|_| &b64[..]),
                c,
                LinearCrossEntropy { ignore_index: -100, softcap },
                Some(reference::LceGrads {
                    dloss: 0.7,
                    dx: &mut dx0,
                    dw: &mut dw0,
                    db: Some(&mut db0),
                }),
            )
            .unwrap();
            for skip_ignored in [true, false] {
                let p = Lce {
                    x: &x,
                    w: &w,
                    labels: &labels,
                    bias,
                    c,
                    v,
                    ignore_index: -100,
                    softcap,
                    chunk,
                    skip_ignored,
                    kind: GemmKind::F32,
                };
                let mut ws = vec![f32::NAN; workspace(r, c, v, chunk)];
                let (mut dx, mut dw, mut db) =
                    (vec![f32::NAN; r * c], vec![f32::NAN; v * c], vec![f32::NAN; v]);
                let grads = LceGrads { dloss: 0.7, dx: &mut dx, dw: &mut dw, db: Some(&mut db) };
                let got = linear_cross_entropy(&pool, &p, &mut ws, Some(grads)).unwrap() as f64;
                assert!((got - want).abs() <= 2e-6 * want.abs(), "loss {got} vs {want}");
                let fwd = linear_cross_entropy(&pool, &p, &mut ws, None).unwrap() as f64;
                assert_eq!(fwd, got, "the loss without gradients is the same sum");
                let what = format!(
                    "r {r} v {v} chunk {chunk} bias {} skip {skip_ignored} softcap {softcap:?}",
                    bias.is_some()
                );
                for (name, got, want) in
                    [("dx", &dx, &dx0), ("dw", &dw, &dw0), ("dbias", &db, &db0)]
                {
                    if name == "dbias" && bias.is_none() {
                        continue;
                    }
                    let want: Vec<f32> = want.iter().map(|&x| x as f32).collect();
                    let tol = 2e-5 * max_abs(&want);
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= tol,
                            "{what}: {name}[{i}] {a} vs {b} (tol {tol:e})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bad_labels_are_errors_naming_the_op() {
        let pool = Pool::new(1);
        let (x, w) = ([0.5f32; 6], [0.25f32; 12]);
        let p = Lce {
            x: &x,
            w: &w,
            labels: &[4, 0],
            bias: None,
            c: 3,
            v: 4,
            ignore_index: -100,
            softcap: None,
            chunk: 8,
            skip_ignored: true,
            kind: GemmKind::F32,
        };
        let mut ws = vec![0.0; workspace(2, 3, 4, 8)];
        let e = linear_cross_entropy(&pool, &p, &mut ws, None).unwrap_err();
        assert!(e.to_string().starts_with("linear_cross_entropy: index 4"), "{e}");
    }

    #[test]
    fn chunks_hold_about_128_mib_of_logits() {
        assert_eq!(chunk_rows(50257, 2), 672);
        assert_eq!(chunk_rows(49152, 16), 688);
        assert_eq!(chunk_rows(8, 2), MAX_CHUNK);
        assert_eq!(chunk_rows(1 << 24, 4), 32);
    }
}
