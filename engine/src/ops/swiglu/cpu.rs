//! SwiGLU's CPU kernels: one pass over the elements each way; in a step, a row of I at a time
//! at the plan's strides, rows split over the pool. The formulas are the pointwise SiLU's own (`kernels::pointwise`'s
//! `Silu`, `SiluBackward`), applied in the unfused graph's order, so in f32 the fused op gives
//! the same bits as `silu` then `mul` and their backwards.
//!
//! References: [`super::swiglu_forward`], [`super::swiglu_backward`] (tested against below).

use super::{backward_slot as bs, slot, SwiGlu, SwiGluBackward};
use crate::backend::cpu::kernels::elementwise::{self as ew, Map1, Map2, MIN_CHUNK};
use crate::backend::cpu::kernels::pointwise::{Silu, SiluBackward};
use crate::backend::cpu::kernels::rows::{for_rows, RowsAt};
use crate::backend::cpu::kernels::simd::multiversion;
use crate::backend::cpu::pool::{Pool, SyncPtr};
use crate::exec::planned::kernel::{CpuKernel, Kernel};
use crate::ops::OpError;

/// h = silu(g)·u as f(g, u).
#[derive(Clone, Copy)]
struct Forward;
impl Map2 for Forward {
    #[inline(always)]
    fn f(&self, g: f32, u: f32) -> f32 {
        Silu.f(g) * u
    }
}

/// h = silu(gate)·up
// h, gate, up: (N)
pub fn forward(pool: &Pool, h: &mut [f32], gate: &[f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    ew::map2(pool, h, gate, up, Forward)
}

/// gate = silu(gate)·up, in place over gate.
// go, up: (N)
pub fn forward_over_gate(pool: &Pool, go: &mut [f32], up: &[f32]) {
    assert_eq!(go.len(), up.len());
    ew::map2_inplace_a(pool, go, up, Forward)
}

/// up = silu(gate)·up, in place over up.
// gate, uo: (N)
pub fn forward_over_up(pool: &Pool, gate: &[f32], uo: &mut [f32]) {
    ew::map2_inplace_b(pool, gate, uo, Forward)
}

#[inline(always)]
fn backward_body(dgate: &mut [f32], dup: &mut [f32], dh: &[f32], gate: &[f32], up: &[f32]) {
    let outs = dgate.iter_mut().zip(dup.iter_mut());
    for ((dg, du), ((&d, &g), &u)) in outs.zip(dh.iter().zip(gate).zip(up)) {
        *dg = SiluBackward.f(g, d * u);
        *du = d * Silu.f(g);
    }
}
#[inline(always)]
fn backward_over_dh_body(dho: &mut [f32], dup: &mut [f32], gate: &[f32], up: &[f32]) {
    for ((dg, du), (&g, &u)) in dho.iter_mut().zip(dup.iter_mut()).zip(gate.iter().zip(up)) {
        let d = *dg;
        *du = d * Silu.f(g);
        *dg = SiluBackward.f(g, d * u);
    }
}
multiversion!(fn backward_chunk<>(dgate: &mut [f32], dup: &mut [f32], dh: &[f32], gate: &[f32], up: &[f32]) => backward_body);
multiversion!(fn backward_over_dh_chunk<>(dho: &mut [f32], dup: &mut [f32], gate: &[f32], up: &[f32]) => backward_over_dh_body);

/// dgate = (dh·up)·silu'(gate), dup = dh·silu(gate)
// dgate, dup, dh, gate, up: (N)
pub fn backward(
    pool: &Pool,
    dgate: &mut [f32],
    dup: &mut [f32],
    dh: &[f32],
    gate: &[f32],
    up: &[f32],
) {
    let n = dh.len();
    assert!(dgate.len() == n && dup.len() == n && gate.len() == n && up.len() == n);
    let (og, ou) = (SyncPtr(dgate.as_mut_ptr()), SyncPtr(dup.as_mut_ptr()));
    pool.for_ranges(n, MIN_CHUNK, 16, &|r| {
        // SAFETY: ranges are disjoint and inside `dgate` and `dup`.
        let (dg, du) = unsafe { (og.slice(r.clone()), ou.slice(r.clone())) };
        backward_chunk(dg, du, &dh[r.clone()], &gate[r.clone()], &up[r])
    });
}

/// [`backward`] with dgate written over dh (each dh read before its dgate is written).
// dho, dup, gate, up: (N)
pub fn backward_over_dh(pool: &Pool, dho: &mut [f32], dup: &mut [f32], gate: &[f32], up: &[f32]) {
    let n = dho.len();
    assert!(dup.len() == n && gate.len() == n && up.len() == n);
    let (og, ou) = (SyncPtr(dho.as_mut_ptr()), SyncPtr(dup.as_mut_ptr()));
    pool.for_ranges(n, MIN_CHUNK, 16, &|r| {
        // SAFETY: ranges are disjoint and inside `dho` and `dup`.
        let (dg, du) = unsafe { (og.slice(r.clone()), ou.slice(r.clone())) };
        backward_over_dh_chunk(dg, du, &gate[r.clone()], &up[r])
    });
}

/// A row of `w` elements at `p`, to read.
///
/// # Safety
/// `p` starts `w` valid elements no one writes while the slice lives.
unsafe fn row<'a>(p: *mut f32, w: usize) -> &'a [f32] {
    std::slice::from_raw_parts(p, w)
}

/// A row of `w` elements at `p`, to write.
///
/// # Safety
/// `p` starts `w` valid elements no one else reads or writes while the slice lives.
unsafe fn row_mut<'a>(p: *mut f32, w: usize) -> &'a mut [f32] {
    std::slice::from_raw_parts_mut(p, w)
}

// Every operand a row at a time at the plan's strides (the op's Req::Rows): Phi-3's gate and up
// are the halves of one (…, 2I) projection, and their gradients the halves of its gradient.
impl CpuKernel for SwiGlu {
    // (gate, up) → h, rows of I
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let (ins, w) = (&k.node.inputs, k.last(k.node.outputs[0]));
        let (g, u) = (RowsAt::of(k, ins[slot::GATE]), RowsAt::of(k, ins[slot::UP]));
        // SAFETY (each arm): rows of distinct r are disjoint; h is written only where planned
        // (over gate or up, read element by element before the write, or its own buffer).
        match k.r.inplace {
            Some(s) if s == slot::GATE => for_rows(k.pool, [g, u], w, &|[g, u]| unsafe {
                ew::map2_a_chunk(row_mut(g, w), row(u, w), Forward)
            }),
            Some(_) => for_rows(k.pool, [g, u], w, &|[g, u]| unsafe {
                ew::map2_b_chunk(row(g, w), row_mut(u, w), Forward)
            }),
            None => {
                let h = RowsAt::of(k, k.node.outputs[0]);
                for_rows(k.pool, [h, g, u], w, &|[h, g, u]| unsafe {
                    ew::map2_chunk(row_mut(h, w), row(g, w), row(u, w), Forward)
                })
            }
        }
        Ok(())
    }
}

impl CpuKernel for SwiGluBackward {
    // (dh, gate, up) → (dgate, dup), rows of I
    unsafe fn exec(&self, k: &Kernel<'_>) -> Result<(), OpError> {
        let (ins, outs) = (&k.node.inputs, &k.node.outputs);
        let w = k.last(outs[0]);
        let at = |t| unsafe { RowsAt::of(k, t) };
        let (dh, g, u, du) = (at(ins[bs::DH]), at(ins[bs::GATE]), at(ins[bs::UP]), at(outs[1]));
        // SAFETY (each arm): rows of distinct r are disjoint; dgate is written over dh only where
        // planned (each dh read before its dgate is written), dup into its own rows.
        match k.r.inplace {
            Some(_) => for_rows(k.pool, [dh, du, g, u], w, &|[dh, du, g, u]| unsafe {
                backward_over_dh_chunk(row_mut(dh, w), row_mut(du, w), row(g, w), row(u, w))
            }),
            None => {
                let dg = at(outs[0]);
                for_rows(k.pool, [dg, du, dh, g, u], w, &|[dg, du, dh, g, u]| unsafe {
                    backward_chunk(row_mut(dg, w), row_mut(du, w), row(dh, w), row(g, w), row(u, w))
                })
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::pointwise as pw;
    use crate::ops::pointwise::{BinaryFn, UnaryFn};
    use crate::ops::testutil::Rng;

    /// Random f32 in [-scale, scale); n = 70 001 spans several pool tasks and ends in a SIMD
    /// tail.
    fn inputs(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
        rng.vec_f32(n).iter().map(|v| v * scale).collect()
    }

    /// Against the f64 reference: the SIMD exp is within a few ulp of libm's, so 2e-6 relative
    /// plus 1e-7 absolute (values that cancel near zero, silu(g) for g ≪ 0).
    fn assert_near(got: &[f32], want: &[f64], what: &str) {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let tol = 2e-6 * w.abs() + 1e-7;
            assert!((f64::from(g) - w).abs() <= tol, "{what}: element {i} = {g}, want {w}");
        }
    }

    #[test]
    fn kernels_match_the_reference_in_f64_and_in_place_matches_out_of_place() {
        let pool = Pool::new(2);
        let n = 70_001;
        let mut rng = Rng::new(5);
        let (gate, up, dh) =
            (inputs(&mut rng, n, 12.0), inputs(&mut rng, n, 3.0), inputs(&mut rng, n, 2.0));
        let f64s = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
        let (g64, u64_, d64) = (f64s(&gate), f64s(&up), f64s(&dh));
        let mut h_want = vec![0f64; n];
        super::super::swiglu_forward(&mut h_want, &g64, &u64_);
        let (mut dg_want, mut du_want) = (vec![0f64; n], vec![0f64; n]);
        super::super::swiglu_backward(&mut dg_want, &mut du_want, &d64, &g64, &u64_);

        let mut h = vec![f32::NAN; n];
        forward(&pool, &mut h, &gate, &up);
        assert_near(&h, &h_want, "forward");
        let mut go = gate.clone();
        forward_over_gate(&pool, &mut go, &up);
        assert_eq!(go, h, "forward over gate");
        let mut uo = up.clone();
        forward_over_up(&pool, &gate, &mut uo);
        assert_eq!(uo, h, "forward over up");

        let (mut dg, mut du) = (vec![f32::NAN; n], vec![f32::NAN; n]);
        backward(&pool, &mut dg, &mut du, &dh, &gate, &up);
        assert_near(&dg, &dg_want, "dgate");
        assert_near(&du, &du_want, "dup");
        let (mut dho, mut du2) = (dh.clone(), vec![f32::NAN; n]);
        backward_over_dh(&pool, &mut dho, &mut du2, &gate, &up);
        assert_eq!((dho, du2), (dg, du), "backward over dh");
    }

    /// The fused kernels give the unfused CPU kernels' bits: silu then mul forward; mul's then
    /// silu's backward.
    #[test]
    fn kernels_give_the_bits_of_silu_then_mul() {
        let pool = Pool::new(2);
        let n = 4099;
        let mut rng = Rng::new(6);
        let (gate, up, dh) =
            (inputs(&mut rng, n, 12.0), inputs(&mut rng, n, 3.0), inputs(&mut rng, n, 2.0));
        let mut act = vec![0f32; n];
        pw::unary(&pool, &mut act, &gate, UnaryFn::Silu);
        let mut h_unfused = vec![0f32; n];
        pw::binary(&pool, &mut h_unfused, &act, &up, BinaryFn::Mul);
        let (mut dact, mut du_unfused, mut dg_unfused) =
            (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        pw::binary(&pool, &mut dact, &dh, &up, BinaryFn::Mul);
        pw::binary(&pool, &mut du_unfused, &dh, &act, BinaryFn::Mul);
        pw::unary_backward(&pool, &mut dg_unfused, &gate, &dact, UnaryFn::Silu);

        let mut h = vec![0f32; n];
        forward(&pool, &mut h, &gate, &up);
        let (mut dg, mut du) = (vec![0f32; n], vec![0f32; n]);
        backward(&pool, &mut dg, &mut du, &dh, &gate, &up);
        assert_eq!(h, h_unfused, "forward");
        assert_eq!(dg, dg_unfused, "dgate");
        assert_eq!(du, du_unfused, "dup");
    }
}
