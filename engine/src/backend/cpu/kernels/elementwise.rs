//! Elementwise kernels over contiguous f32 buffers, split over the pool in cache-line-aligned
//! ranges: fill, add (with a broadcast operand), scale, GELU (erf, tanh) and its backward, tanh
//! and its backward, dropout. Each op is a small `Map1`/`Map2` impl (the formula) run by one of
//! five drivers (out = f(x); x = f(x) in place; out = f(a, b); a = f(a, b); b = f(a, b)).
//!
//! References: `ops::add`, `ops::gelu`, `ops::tanh`, `ops::dropout` (the reference ops these
//! are tested against); llm.c `gelu_forward` / `gelu_backward`; ATen `GeluKernel.cpp`.

use super::simd::{self, multiversion};
use super::{copy, elementwise as ew};
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::graph::op;
use crate::ops::gelu::GeluApprox;
use crate::ops::OpError;

/// Elements per task below which an elementwise kernel stays on one thread (a pool wake-up
/// costs about as much as the work on 32K f32; figures: docs/measurements.md).
pub const MIN_CHUNK: usize = 1 << 15;

/// A unary formula y = f(x).
pub trait Map1: Copy + Sync {
    fn f(&self, x: f32) -> f32;
}

/// A binary formula y = f(a, b), b broadcast when shorter.
pub trait Map2: Copy + Sync {
    fn f(&self, a: f32, b: f32) -> f32;
}

#[inline(always)]
fn map1_body<F: Map1>(out: &mut [f32], x: &[f32], f: F) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f.f(v);
    }
}
#[inline(always)]
fn map1_inplace_body<F: Map1>(xo: &mut [f32], f: F) {
    for v in xo.iter_mut() {
        *v = f.f(*v);
    }
}
#[inline(always)]
fn map2_body<F: Map2>(out: &mut [f32], a: &[f32], b: &[f32], f: F) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f.f(x, y);
    }
}
#[inline(always)]
fn map2_a_body<F: Map2>(ao: &mut [f32], b: &[f32], f: F) {
    for (o, &y) in ao.iter_mut().zip(b) {
        *o = f.f(*o, y);
    }
}
#[inline(always)]
fn map2_b_body<F: Map2>(a: &[f32], bo: &mut [f32], f: F) {
    for (&x, o) in a.iter().zip(bo.iter_mut()) {
        *o = f.f(x, *o);
    }
}
multiversion!(fn map1_chunk<F: Map1>(out: &mut [f32], x: &[f32], f: F) => map1_body);
multiversion!(fn map1_inplace_chunk<F: Map1>(xo: &mut [f32], f: F) => map1_inplace_body);
multiversion!(pub(crate) fn map2_chunk<F: Map2>(out: &mut [f32], a: &[f32], b: &[f32], f: F) => map2_body);
multiversion!(pub(crate) fn map2_a_chunk<F: Map2>(ao: &mut [f32], b: &[f32], f: F) => map2_a_body);
multiversion!(pub(crate) fn map2_b_chunk<F: Map2>(a: &[f32], bo: &mut [f32], f: F) => map2_b_body);

/// out = f(x)
// out, x: (N)
pub fn map1<F: Map1>(pool: &Pool, out: &mut [f32], x: &[f32], f: F) {
    assert_eq!(out.len(), x.len());
    let o = SyncPtr(out.as_mut_ptr());
    pool.for_ranges(x.len(), MIN_CHUNK, 16, &|r| {
        // SAFETY: ranges are disjoint and inside `out`.
        map1_chunk(unsafe { o.slice(r.clone()) }, &x[r], f)
    });
}

/// xo = f(xo)
// xo: (N)
pub fn map1_inplace<F: Map1>(pool: &Pool, xo: &mut [f32], f: F) {
    let o = SyncPtr(xo.as_mut_ptr());
    pool.for_ranges(xo.len(), MIN_CHUNK, 16, &|r| {
        // SAFETY: ranges are disjoint and inside `xo`.
        map1_inplace_chunk(unsafe { o.slice(r) }, f)
    });
}

/// out = f(a, b), b of a's length or broadcast over a's rows (b.len() divides a.len()).
// out, a: (R, N); b: (R, N) or (N)
pub fn map2<F: Map2>(pool: &Pool, out: &mut [f32], a: &[f32], b: &[f32], f: F) {
    assert!(out.len() == a.len() && !b.is_empty() && a.len().is_multiple_of(b.len()));
    let o = SyncPtr(out.as_mut_ptr());
    let nb = b.len();
    if nb == a.len() {
        pool.for_ranges(a.len(), MIN_CHUNK, 16, &|r| {
            // SAFETY: ranges are disjoint and inside `out`.
            map2_chunk(unsafe { o.slice(r.clone()) }, &a[r.clone()], &b[r], f)
        });
    } else {
        // Whole rows per task, then the broadcast operand row by row.
        let rows = a.len() / nb;
        pool.for_ranges(rows, (MIN_CHUNK / nb).max(1), 1, &|r| {
            for row in r {
                let s = row * nb..(row + 1) * nb;
                // SAFETY: rows are disjoint and inside `out`.
                map2_chunk(unsafe { o.slice(s.clone()) }, &a[s], b, f)
            }
        });
    }
}

/// ao = f(ao, b), b as in [`map2`].
// ao: (R, N); b: (R, N) or (N)
pub fn map2_inplace_a<F: Map2>(pool: &Pool, ao: &mut [f32], b: &[f32], f: F) {
    assert!(!b.is_empty() && ao.len().is_multiple_of(b.len()));
    let o = SyncPtr(ao.as_mut_ptr());
    let nb = b.len();
    if nb == ao.len() {
        pool.for_ranges(nb, MIN_CHUNK, 16, &|r| {
            // SAFETY: ranges are disjoint and inside `ao`.
            map2_a_chunk(unsafe { o.slice(r.clone()) }, &b[r], f)
        });
    } else {
        let rows = ao.len() / nb;
        pool.for_ranges(rows, (MIN_CHUNK / nb).max(1), 1, &|r| {
            for row in r {
                // SAFETY: rows are disjoint and inside `ao`.
                map2_a_chunk(unsafe { o.slice(row * nb..(row + 1) * nb) }, b, f)
            }
        });
    }
}

/// bo = f(a, bo) (same lengths).
// a, bo: (N)
pub fn map2_inplace_b<F: Map2>(pool: &Pool, a: &[f32], bo: &mut [f32], f: F) {
    assert_eq!(a.len(), bo.len());
    let o = SyncPtr(bo.as_mut_ptr());
    pool.for_ranges(a.len(), MIN_CHUNK, 16, &|r| {
        // SAFETY: ranges are disjoint and inside `bo`.
        map2_b_chunk(&a[r.clone()], unsafe { o.slice(r) }, f)
    });
}

/// out = value
// out: (N)
pub fn fill(pool: &Pool, out: &mut [f32], value: f32) {
    let o = SyncPtr(out.as_mut_ptr());
    pool.for_ranges(out.len(), MIN_CHUNK * 4, 16, &|r| {
        // SAFETY: ranges are disjoint and inside `out`.
        unsafe { o.slice(r) }.fill(value)
    });
}

// ---------------------------------------------------------------- linear epilogue

#[inline(always)]
fn bias_gelu_body(y: &mut [f32], pre: &mut [f32], bias: &[f32], g: Gelu) {
    let n = bias.len();
    for (yr, pr) in y.chunks_exact_mut(n).zip(pre.chunks_exact_mut(n)) {
        for ((o, p), &b) in yr.iter_mut().zip(pr.iter_mut()).zip(bias) {
            *p += b;
            *o = g.f(*p);
        }
    }
}
multiversion!(fn bias_gelu_chunk<>(y: &mut [f32], pre: &mut [f32], bias: &[f32], g: Gelu) => bias_gelu_body);

/// The epilogue of `Op::Linear` with GELU, after the GEMM wrote x·op(w) into `pre`: one pass
/// over the rows doing pre += bias, y = gelu(pre) (`ops::linear::linear_forward`).
// y, pre: (R, N); bias: (N)
pub fn bias_gelu(pool: &Pool, y: &mut [f32], pre: &mut [f32], bias: &[f32], approx: GeluApprox) {
    let n = bias.len();
    assert!(n > 0 && y.len() == pre.len() && y.len().is_multiple_of(n));
    let (yp, pp) = (SyncPtr(y.as_mut_ptr()), SyncPtr(pre.as_mut_ptr()));
    pool.for_ranges(y.len() / n, (MIN_CHUNK / n).max(1), 1, &|r| {
        let e = r.start * n..r.end * n;
        // SAFETY: row ranges are disjoint and inside both buffers.
        bias_gelu_chunk(unsafe { yp.slice(e.clone()) }, unsafe { pp.slice(e) }, bias, Gelu(approx))
    });
}

// ---------------------------------------------------------------- formulas

/// a + b (`ops::add::add_forward`, bias add, residual add, gradient sums).
#[derive(Clone, Copy)]
pub struct Add;
impl Map2 for Add {
    #[inline(always)]
    fn f(&self, a: f32, b: f32) -> f32 {
        a + b
    }
}

/// s·x (`ops::add::scale_forward`).
#[derive(Clone, Copy)]
pub struct Scale(pub f32);
impl Map1 for Scale {
    #[inline(always)]
    fn f(&self, x: f32) -> f32 {
        x * self.0
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const KAPPA: f32 = 0.044715;
const INV_SQRT_2PI: f32 = 0.398_942_3;
const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;

/// 0.5·x·(1 + erf(x/√2)) or 0.5·x·(1 + tanh(√(2/π)(x + κx³))) (`ops::gelu::gelu_forward`).
#[derive(Clone, Copy)]
pub struct Gelu(pub GeluApprox);
impl Map1 for Gelu {
    #[inline(always)]
    fn f(&self, x: f32) -> f32 {
        let core = match self.0 {
            GeluApprox::Erf => simd::erf(x * FRAC_1_SQRT_2),
            GeluApprox::Tanh => simd::tanh(SQRT_2_OVER_PI * (KAPPA * x * x).mul_add(x, x)),
        };
        0.5 * x * (1.0 + core)
    }
}

/// dx = dy·gelu'(x), as f(x, dy) (`ops::gelu::gelu_backward`).
#[derive(Clone, Copy)]
pub struct GeluBackward(pub GeluApprox);
impl Map2 for GeluBackward {
    #[inline(always)]
    fn f(&self, x: f32, dy: f32) -> f32 {
        let local = match self.0 {
            GeluApprox::Erf => {
                let cdf = 0.5 * (1.0 + simd::erf(x * FRAC_1_SQRT_2));
                let pdf = INV_SQRT_2PI * simd::exp(-0.5 * x * x);
                x.mul_add(pdf, cdf)
            }
            GeluApprox::Tanh => {
                let t = simd::tanh(SQRT_2_OVER_PI * (KAPPA * x * x).mul_add(x, x));
                let du = SQRT_2_OVER_PI * (3.0 * KAPPA * x).mul_add(x, 1.0);
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
            }
        };
        dy * local
    }
}

/// tanh(x) (`ops::tanh::tanh_forward`).
#[derive(Clone, Copy)]
pub struct Tanh;
impl Map1 for Tanh {
    #[inline(always)]
    fn f(&self, x: f32) -> f32 {
        simd::tanh(x)
    }
}

/// dx = dy·(1 − y²), as f(y, dy) (`ops::tanh::tanh_backward`).
#[derive(Clone, Copy)]
pub struct TanhBackward;
impl Map2 for TanhBackward {
    #[inline(always)]
    fn f(&self, y: f32, dy: f32) -> f32 {
        dy * (1.0 - y * y)
    }
}

// ---------------------------------------------------------------- dropout

/// The dropout mask of `ops::dropout`, bit for bit: element `counter` is kept iff
/// `uniform(seed, counter) >= p`, i.e. iff the top 24 bits of `hash(seed, counter)` are
/// ≥ ⌈p·2²⁴⌉ (exact: uniform is those bits times 2⁻²⁴), with `hash`'s seed half hoisted.
#[derive(Clone, Copy, Debug)]
pub struct DropMask {
    key: u64,
    threshold: u64,
    /// 1/(1−p), or 0 when p = 1 (`ops::dropout::keep_scale`).
    pub scale: f32,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl DropMask {
    pub fn new(p: f32, seed: u64) -> Self {
        DropMask {
            key: mix(seed.wrapping_add(GOLDEN)),
            threshold: (p as f64 * (1u64 << 24) as f64).ceil() as u64,
            scale: crate::ops::dropout::keep_scale::<f32>(p),
        }
    }

    /// Whether element `counter` is kept.
    #[inline(always)]
    pub fn keep(&self, counter: u64) -> bool {
        (mix(self.key ^ counter.wrapping_mul(GOLDEN)) >> 40) >= self.threshold
    }

    /// The factor of element `counter`: scale or 0.
    #[inline(always)]
    pub fn factor(&self, counter: u64) -> f32 {
        if self.keep(counter) {
            self.scale
        } else {
            0.0
        }
    }
}

#[inline(always)]
fn dropout_body(out: &mut [f32], x: &[f32], m: DropMask, first: u64) {
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = if m.keep(first + i as u64) { v * m.scale } else { 0.0 };
    }
}
#[inline(always)]
fn dropout_inplace_body(xo: &mut [f32], m: DropMask, first: u64) {
    for (i, o) in xo.iter_mut().enumerate() {
        *o = if m.keep(first + i as u64) { *o * m.scale } else { 0.0 };
    }
}
multiversion!(fn dropout_chunk<>(out: &mut [f32], x: &[f32], m: DropMask, first: u64) => dropout_body);
multiversion!(fn dropout_inplace_chunk<>(xo: &mut [f32], m: DropMask, first: u64) => dropout_inplace_body);

/// out[i] = x[i]/(1−p) if kept(seed, offset + i) else 0 (`ops::dropout::dropout_forward`; its
/// backward is the same call on the gradient).
// out, x: (N)
pub fn dropout(pool: &Pool, out: &mut [f32], x: &[f32], p: f32, seed: u64, offset: u64) {
    assert_eq!(out.len(), x.len());
    let m = DropMask::new(p, seed);
    let o = SyncPtr(out.as_mut_ptr());
    pool.for_ranges(x.len(), MIN_CHUNK, 16, &|r| {
        let first = offset + r.start as u64;
        // SAFETY: ranges are disjoint and inside `out`.
        dropout_chunk(unsafe { o.slice(r.clone()) }, &x[r], m, first)
    });
}

/// [`dropout`] in place.
// xo: (N)
pub fn dropout_inplace(pool: &Pool, xo: &mut [f32], p: f32, seed: u64, offset: u64) {
    let m = DropMask::new(p, seed);
    let o = SyncPtr(xo.as_mut_ptr());
    pool.for_ranges(xo.len(), MIN_CHUNK, 16, &|r| {
        let first = offset + r.start as u64;
        // SAFETY: ranges are disjoint and inside `xo`.
        dropout_inplace_chunk(unsafe { o.slice(r) }, m, first)
    });
}

impl CpuKernel for op::Fill {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let op::Fill { value } = self;
        let value = &if k.x.seed_node == Some(k.r.node) { value * k.x.loss_scale } else { *value };
        let o = k.node.outputs[0];
        let p = k.pl(o);
        if crate::exec::planned::is_contig(k.g.shape(o), &p.strides) {
            ew::fill(k.pool, k.wr(0), *value);
        } else {
            copy::fill_strided(k.pool, k.ptr(o), k.g.shape(o), &p.strides, *value);
        }

        Ok(())
    }
}

impl CpuKernel for op::BiasAdd {
    // The bias is a broadcast addend: the add kernel.
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        op::Add.exec(k)
    }
}

impl CpuKernel for op::Add {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        match k.r.inplace {
            Some(0) => ew::map2_inplace_a(k.pool, k.rw(0), k.rd(1), Add),
            Some(_) => ew::map2_inplace_b(k.pool, k.rd(0), k.rw(1), Add),
            None => ew::map2(k.pool, k.wr(0), k.rd(0), k.rd(1), Add),
        };
        Ok(())
    }
}

impl CpuKernel for op::Scale {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let op::Scale { s } = self;
        k.unary(ew::Scale(*s));
        Ok(())
    }
}

impl CpuKernel for op::Gelu {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let op::Gelu { approx } = self;
        k.unary(ew::Gelu(*approx));
        Ok(())
    }
}

impl CpuKernel for op::Tanh {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        k.unary(Tanh);
        Ok(())
    }
}

impl CpuKernel for op::GeluBackward {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let op::GeluBackward { approx } = self;
        k.binary_b(ew::GeluBackward(*approx));
        Ok(())
    }
}

impl CpuKernel for op::TanhBackward {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        k.binary_b(TanhBackward);
        Ok(())
    }
}

impl CpuKernel for op::Dropout {
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let op::Dropout { p, offset } = self;
        match k.r.inplace {
            Some(_) => ew::dropout_inplace(k.pool, k.rw(0), *p, k.seed, *offset),
            None => ew::dropout(k.pool, k.wr(0), k.rd(0), *p, k.seed, *offset),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::Rng;
    use crate::ops::{add, dropout as rdrop, gelu as rgelu, tanh as rtanh};

    fn pool() -> Pool {
        Pool::new(2)
    }

    /// Large enough to be split over the pool, odd so that chunks have tails.
    const N: usize = 3 * MIN_CHUNK + 77;

    fn close(a: &[f32], b: &[f32], atol: f32, rtol: f32, what: &str) {
        assert_eq!(a.len(), b.len());
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= atol + rtol * y.abs(), "{what}[{i}]: {x} vs {y}");
        }
    }

    #[test]
    fn add_scale_and_broadcast_are_exact() {
        let p = pool();
        let mut rng = Rng::new(1);
        let (a, b, bias) = (rng.vec_f32(N), rng.vec_f32(N), rng.vec_f32(N / 17));
        let rows_len = bias.len() * 17;
        let mut want = vec![0.0; N];
        add::add_forward(&mut want, &a, &b);
        let mut out = vec![0.0; N];
        map2(&p, &mut out, &a, &b, Add);
        assert_eq!(out, want);
        let mut ao = a.clone();
        map2_inplace_a(&p, &mut ao, &b, Add);
        assert_eq!(ao, want);
        let mut bo = b.clone();
        map2_inplace_b(&p, &a, &mut bo, Add);
        assert_eq!(bo, want);
        // Broadcast over rows (bias add).
        let mut want = vec![0.0; rows_len];
        add::add_forward(&mut want, &a[..rows_len], &bias);
        let mut out = vec![0.0; rows_len];
        map2(&p, &mut out, &a[..rows_len], &bias, Add);
        assert_eq!(out, want);
        let mut ao = a[..rows_len].to_vec();
        map2_inplace_a(&p, &mut ao, &bias, Add);
        assert_eq!(ao, want);
        let mut want = vec![0.0; N];
        add::scale_forward(&mut want, &a, 0.37);
        let mut xo = a.clone();
        map1_inplace(&p, &mut xo, Scale(0.37));
        assert_eq!(xo, want);
        let mut f = vec![0.0; N];
        fill(&p, &mut f, 2.5);
        assert!(f.iter().all(|&v| v == 2.5));
    }

    /// GELU and tanh against the reference ops (libm erf/tanh) on x in ±[0.1, 4): erf to
    /// 1.5e-7, so |Δ| ≤ 3e-7·(1 + |x|).
    #[test]
    fn gelu_tanh_and_backwards_match_the_reference() {
        let p = pool();
        let mut rng = Rng::new(2);
        let x: Vec<f32> = rng.vec_f32(N).iter().map(|v| 4.0 * v).collect();
        let dy = rng.vec_f32(N);
        for approx in [GeluApprox::Erf, GeluApprox::Tanh] {
            let (mut want, mut got) = (vec![0.0; N], vec![0.0; N]);
            rgelu::gelu_forward(&mut want, &x, approx);
            map1(&p, &mut got, &x, Gelu(approx));
            close(&got, &want, 1.2e-6, 3e-7, "gelu");
            rgelu::gelu_backward(&mut want, &x, &dy, approx);
            map2(&p, &mut got, &x, &dy, GeluBackward(approx));
            close(&got, &want, 1.2e-6, 1e-6, "gelu_backward");
            let mut dyo = dy.clone();
            map2_inplace_b(&p, &x, &mut dyo, GeluBackward(approx));
            assert_eq!(dyo, got);
        }
        let (mut want, mut got) = (vec![0.0; N], vec![0.0; N]);
        rtanh::tanh_forward(&mut want, &x);
        map1(&p, &mut got, &x, Tanh);
        close(&got, &want, 1e-7, 4.0 * f32::EPSILON, "tanh");
        let y = want.clone();
        rtanh::tanh_backward(&mut want, &y, &dy);
        map2(&p, &mut got, &y, &dy, TanhBackward);
        assert_eq!(got, want);
    }

    #[test]
    fn dropout_mask_and_values_are_bit_identical_to_the_reference() {
        let p = pool();
        let x = Rng::new(3).vec_f32(N);
        for (prob, seed, offset) in [
            (0.1f32, 42u64, 0u64),
            (0.5, 7, 12345),
            (0.0, 1, 0),
            (1.0, 1, 5),
            (0.3333, u64::MAX, 1 << 40),
        ] {
            let mut want = vec![0.0; N];
            rdrop::dropout_forward(&mut want, &x, prob, seed, offset);
            let mut got = vec![f32::NAN; N];
            dropout(&p, &mut got, &x, prob, seed, offset);
            assert_eq!(got, want, "p={prob} seed={seed}");
            let mut xo = x.clone();
            dropout_inplace(&p, &mut xo, prob, seed, offset);
            assert_eq!(xo, want);
            let m = DropMask::new(prob, seed);
            for c in [0u64, 1, 99, 1 << 33] {
                assert_eq!(m.keep(offset + c), rdrop::keep(seed, offset + c, prob));
            }
        }
    }

    /// The linear epilogue (bias + GELU, keeping the pre-activation) against the reference
    /// add and GELU: the pre-activation exact, y within the GELU kernel's tolerance (2e-6
    /// relative + 3e-7: the vectorised erf/tanh).
    #[test]
    fn bias_gelu_matches_the_reference() {
        let pool = pool();
        let mut rng = Rng::new(21);
        for &(rows, n) in &[(3usize, 7usize), (200, 3072)] {
            let (x, bias) = (
                rng.vec_f32(rows * n).iter().map(|v| 3.0 * v).collect::<Vec<f32>>(),
                rng.vec_f32(n),
            );
            for approx in [GeluApprox::Erf, GeluApprox::Tanh] {
                let mut want_pre = vec![0f32; rows * n];
                add::add_forward(&mut want_pre, &x, &bias);
                let mut want = vec![0f32; rows * n];
                rgelu::gelu_forward(&mut want, &want_pre, approx);
                let (mut pre, mut y) = (x.clone(), vec![f32::NAN; rows * n]);
                bias_gelu(&pool, &mut y, &mut pre, &bias, approx);
                assert_eq!(pre, want_pre);
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() <= 2e-6 * b.abs() + 3e-7, "{approx:?} [{i}]: {a} vs {b}");
                }
            }
        }
    }
}
