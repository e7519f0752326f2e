//! engine/kernels/elementwise.cu and reduce.cu against the CPU kernels
//! (engine/src/backend/cpu/kernels/{elementwise,reduce}.rs), in f32/f16/bf16, on the devices of
//! `kernel_harness::devices` (SIMT warp 32/64 × both thread orders; or the GPU).
//!
//! Tolerances: f32 1e-5 relative for the transcendental ones (GELU, tanh: the CPU kernels use
//! their own polynomial erf/tanh/exp, the kernels libm's or the GPU's, both within a few ulp),
//! 1e-6 for add/scale/dropout (one rounding each, identical formula), on top of one unit
//! roundoff of the half dtypes (both sides round nearly equal f32 values), all of each element.
//! GELU, its derivative and the column sums also get 1e-6 of the largest element: they cancel
//! near zero ([`GELU_OF_LARGEST`], the column-sum test).

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::{elementwise as ew, reduce};
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::exec::gpu::launch::{elementwise as launch, reduce as rlaunch};
use ortbench_engine::exec::gpu::support::chunks;
use ortbench_engine::exec::gpu::StepBlock;
use ortbench_engine::ops::gelu::GeluApprox;
use ortbench_simt::Buf;

/// GELU and its derivative, per element, also get 1e-6 of the largest element (module
/// comment): x·Φ(x) for x < 0 is 1 + erf(x/√2) cancelling, so a few-ulp difference between
/// the two erf (or tanh) implementations, of order 1, is absolute. Measured worst on the SIMT
/// harness: 8.6e-8 of the largest element (f32).
const GELU_OF_LARGEST: f32 = 1e-6;
// Sizes that are not multiples of the block (or of 64).
const ROWS: usize = 37;
const C: usize = 61;

#[test]
fn bias_gelu_matches_the_cpu_epilogue() {
    let pool = Pool::new(2);
    for dt in FLOATS {
        for (ai, approx) in [GeluApprox::Erf, GeluApprox::Tanh].into_iter().enumerate() {
            let mut rng = Rng::new(1 + ai as u64);
            let pre = rng.vec(ROWS * C, -3.0, 3.0, dt);
            let bias = rng.vec(C, -1.0, 1.0, dt);
            let (mut y0, mut p0) = (vec![0f32; ROWS * C], pre.clone());
            ew::bias_gelu(&pool, &mut y0, &mut p0, &bias, approx);
            for dev in devices() {
                let (mut y, mut p, mut b) = (
                    Buf::poisoned(ROWS * C, dt),
                    Buf::from_f32(&pre, dt),
                    Buf::from_f32(&bias, dt),
                );
                let dtype = dtype(dt);
                let (y_, pre, bias) = (&mut y, &mut p, &mut b);
                let l = launch::BiasGelu { dtype, y: y_, pre, bias, rows: ROWS, c: C, approx };
                dev.run(l.launch(dev.geometry())).unwrap();
                check(
                    &format!("bias_gelu {dt:?} {approx:?} y on {dev}"),
                    &y.to_f32(),
                    &y0,
                    dt,
                    Tol { of_largest: GELU_OF_LARGEST, ..tol(dt, 1e-5) },
                );
                check(
                    &format!("bias_gelu {dt:?} {approx:?} pre on {dev}"),
                    &p.to_f32(),
                    &p0,
                    dt,
                    tol(dt, 1e-6),
                );
            }
        }
    }
}

#[test]
fn gelu_and_tanh_backward_and_forward_match() {
    let pool = Pool::new(2);
    let n = ROWS * C;
    for dt in FLOATS {
        let mut rng = Rng::new(7);
        let x = rng.vec(n, -3.0, 3.0, dt);
        let dy = rng.vec(n, -1.0, 1.0, dt);
        let yt: Vec<f32> = x.iter().map(|v| dt.round(v.tanh())).collect();
        for approx in [GeluApprox::Erf, GeluApprox::Tanh] {
            // The standalone forward (a GELU outside a linear layer: Gemma's GeGLU gate).
            let mut fwd = vec![0f32; n];
            ew::map1(&pool, &mut fwd, &x, ew::Gelu(approx));
            // Aligned (16-byte packs, then the n mod V tail) and one input an element off.
            for (dev, mis) in devices().iter().flat_map(|d| [(d, false), (d, true)]) {
                let xb = Buf::from_f32(&x, dt);
                let (mut y, mut xb) =
                    (Buf::poisoned(n, dt), if mis { xb.misaligned() } else { xb });
                let l = launch::GeluForward { dtype: dtype(dt), y: &mut y, x: &mut xb, n, approx };
                dev.run(l.launch(dev.geometry())).unwrap();
                check(
                    &format!("gelu_forward {dt:?} {approx:?} (misaligned x: {mis}) on {dev}"),
                    &y.to_f32(),
                    &fwd,
                    dt,
                    Tol { of_largest: GELU_OF_LARGEST, ..tol(dt, 1e-5) },
                );
            }
            let mut want = vec![0f32; n];
            ew::map2(&pool, &mut want, &x, &dy, ew::GeluBackward(approx));
            for (dev, mis) in devices().iter().flat_map(|d| [(d, false), (d, true)]) {
                let dyb = Buf::from_f32(&dy, dt);
                let dyb = if mis { dyb.misaligned() } else { dyb };
                let (mut dx, mut xb, mut dyb) = (Buf::poisoned(n, dt), Buf::from_f32(&x, dt), dyb);
                let (dtype, dx_, x, dy) = (dtype(dt), &mut dx, &mut xb, &mut dyb);
                let l = launch::GeluBackward { dtype, dx: dx_, x, dy, n, approx };
                dev.run(l.launch(dev.geometry())).unwrap();
                check(
                    &format!("gelu_backward {dt:?} {approx:?} (misaligned dy: {mis}) on {dev}"),
                    &dx.to_f32(),
                    &want,
                    dt,
                    Tol { of_largest: GELU_OF_LARGEST, ..tol(dt, 1e-5) },
                );
            }
        }
        let mut tanh_want = vec![0f32; n];
        ew::map1(&pool, &mut tanh_want, &x, ew::Tanh);
        let mut tanh_bwd_want = vec![0f32; n];
        ew::map2(&pool, &mut tanh_bwd_want, &yt, &dy, ew::TanhBackward);
        for (dev, mis) in devices().iter().flat_map(|d| [(d, false), (d, true)]) {
            let off = |b: Buf| if mis { b.misaligned() } else { b };
            let (mut y, mut xb) = (Buf::poisoned(n, dt), off(Buf::from_f32(&x, dt)));
            let l = launch::TanhForward { dtype: dtype(dt), y: &mut y, x: &mut xb, n };
            dev.run(l.launch(dev.geometry())).unwrap();
            let what = format!("tanh {dt:?} (misaligned: {mis}) on {dev}");
            check(&what, &y.to_f32(), &tanh_want, dt, tol(dt, 1e-5));
            let (mut dx, mut yb, mut dyb) =
                (Buf::poisoned(n, dt), off(Buf::from_f32(&yt, dt)), Buf::from_f32(&dy, dt));
            let (dtype, dx_, y, dy) = (dtype(dt), &mut dx, &mut yb, &mut dyb);
            let l = launch::TanhBackward { dtype, dx: dx_, y, dy, n };
            dev.run(l.launch(dev.geometry())).unwrap();
            check(
                &format!("tanh_backward {dt:?} (misaligned y: {mis}) on {dev}"),
                &dx.to_f32(),
                &tanh_bwd_want,
                dt,
                tol(dt, 1e-6),
            );
        }
    }
}

#[test]
fn add_with_and_without_broadcast_scale_and_fill_match() {
    let pool = Pool::new(2);
    let n = ROWS * C;
    for dt in FLOATS {
        let mut rng = Rng::new(11);
        let a = rng.vec(n, -2.0, 2.0, dt);
        let b = rng.vec(n, -2.0, 2.0, dt);
        let mut plain = vec![0f32; n];
        ew::map2(&pool, &mut plain, &a, &b, ew::Add);
        // The bias-add form: b broadcast over rows of C.
        let bias = &b[..C];
        let bcast: Vec<f32> = a.iter().enumerate().map(|(i, &v)| v + bias[i % C]).collect();
        let mut scaled = vec![0f32; n];
        ew::map1(&pool, &mut scaled, &a, ew::Scale(0.37));
        for dev in devices() {
            // Aligned operands (16-byte packs, then the n mod V tail) and an output one element
            // off (one element at a time).
            for (nb, want, what, mis) in [
                (n, &plain, "add", false),
                (n, &plain, "add (out misaligned)", true),
                (C, &bcast, "bias add", false),
            ] {
                let out = Buf::poisoned(n, dt);
                let mut out = if mis { out.misaligned() } else { out };
                let (mut ab, mut bb) = (Buf::from_f32(&a, dt), Buf::from_f32(&b[..nb], dt));
                let (dtype, o, a, b) = (dtype(dt), &mut out, &mut ab, &mut bb);
                let l = launch::Add { dtype, to_f32: false, out: o, a, b, n, nb };
                dev.run(l.launch(dev.geometry())).unwrap();
                check(&format!("{what} {dt:?} on {dev}"), &out.to_f32(), want, dt, tol(dt, 1e-6));
            }
            // A bias 40 wide (a multiple of every pack: the broadcast in 16-byte packs), and an
            // element off.
            let n40 = ROWS * 40;
            let want40: Vec<f32> =
                a[..n40].iter().enumerate().map(|(i, &v)| v + b[i % 40]).collect();
            for mis in [false, true] {
                let bb = Buf::from_f32(&b[..40], dt);
                let (mut out, mut ab, mut bb) = (
                    Buf::poisoned(n40, dt),
                    Buf::from_f32(&a[..n40], dt),
                    if mis { bb.misaligned() } else { bb },
                );
                let (dtype, o, a, b) = (dtype(dt), &mut out, &mut ab, &mut bb);
                let l = launch::Add { dtype, to_f32: false, out: o, a, b, n: n40, nb: 40 };
                dev.run(l.launch(dev.geometry())).unwrap();
                let what = format!("bias add of 40 {dt:?} (misaligned bias: {mis}) on {dev}");
                check(&what, &out.to_f32(), &want40, dt, tol(dt, 1e-6));
            }
            if dt != D::F32 {
                // Half operands, f32 sum (not rounded to the half dtype).
                let (mut out, mut ab, mut bb) =
                    (Buf::poisoned(n, D::F32), Buf::from_f32(&a, dt), Buf::from_f32(&b, dt));
                let (dtype, o, a, b) = (dtype(dt), &mut out, &mut ab, &mut bb);
                let l = launch::Add { dtype, to_f32: true, out: o, a, b, n, nb: n };
                dev.run(l.launch(dev.geometry())).unwrap();
                check(
                    &format!("add_to_f32 {dt:?} on {dev}"),
                    &out.to_f32(),
                    &plain,
                    D::F32,
                    tol(D::F32, 1e-6),
                );
            }
            for mis in [false, true] {
                let x = Buf::from_f32(&a, dt);
                let (mut out, mut xb) =
                    (Buf::poisoned(n, dt), if mis { x.misaligned() } else { x });
                let l = launch::Scale { dtype: dtype(dt), out: &mut out, x: &mut xb, n, s: 0.37 };
                dev.run(l.launch(dev.geometry())).unwrap();
                let what =
                    format!("scale {dt:?}{} on {dev}", if mis { " (x misaligned)" } else { "" });
                check(&what, &out.to_f32(), &scaled, dt, tol(dt, 1e-6));
            }
            // The value alone, and times the step block's loss scale (autodiff's seed).
            let mut sb = step_block(&StepBlock { loss_scale: 3.0, ..StepBlock::default() });
            for (value, scaled_by, want) in [(-0.3, None, -0.3), (-0.1, Some(&mut sb), -0.3f32)] {
                let mut out = Buf::poisoned(n, dt);
                let what = format!("fill {dt:?} (step block: {}) on {dev}", scaled_by.is_some());
                let l = launch::Fill { dtype: dtype(dt), out: &mut out, n, value, scaled_by };
                dev.run(l.launch(dev.geometry())).unwrap();
                check(&what, &out.to_f32(), &vec![want; n], dt, tol(dt, 1e-6));
            }
        }
    }
}

#[test]
fn dropout_keeps_the_cpu_mask_bit_for_bit() {
    let pool = Pool::new(2);
    let n = 3 * 1000 + 17;
    for dt in FLOATS {
        let mut rng = Rng::new(13);
        let x = rng.vec(n, -2.0, 2.0, dt);
        for (p, seed, offset) in
            [(0.1f32, 42u64, 0u64), (0.5, 7, 123_456_789_012), (0.0, 1, 5), (1.0, 3, 0)]
        {
            let mut want = vec![0f32; n];
            ew::dropout(&pool, &mut want, &x, p, seed, offset);
            // Aligned (16-byte packs and a tail: n mod 8 = 1), x one element off, and the seed
            // read from a step block (as the executor's launches read it).
            let cases = devices().into_iter().map(|d| (d, false, false));
            let first = devices()[0];
            for (dev, mis, block) in cases.chain([(first, true, false), (first, false, true)]) {
                let xb = Buf::from_f32(&x, dt);
                let (mut out, mut xb) =
                    (Buf::poisoned(n, dt), if mis { xb.misaligned() } else { xb });
                let mut sb = step_block(&StepBlock { seed, ..StepBlock::default() });
                let seed =
                    if block { launch::Seed::Block(&mut sb) } else { launch::Seed::Value(seed) };
                let (dtype, o, x) = (dtype(dt), &mut out, &mut xb);
                let l = launch::Dropout { dtype, out: o, x, n, p, seed, offset };
                dev.run(l.launch(dev.geometry())).unwrap();
                let got = out.to_f32();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        *g == 0.0,
                        *w == 0.0,
                        "dropout {dt:?} p {p}: element {i} kept differently on {dev}"
                    );
                }
                let mis = if mis { " (x misaligned)" } else { "" };
                let block = if block { " (seed from a step block)" } else { "" };
                check(
                    &format!("dropout {dt:?} p {p}{mis}{block} on {dev}"),
                    &got,
                    &want,
                    dt,
                    tol(dt, 1e-6),
                );
            }
        }
    }
}

#[test]
fn casts_widen_exactly_and_narrow_as_the_cpu_rounds() {
    // 1003 elements: 125 packs of 8 and a tail of 3 (250 of 4 and 3 for f32); then the input
    // one element off (one element at a time).
    let n = 1000 + 3;
    for dt in [D::F16, D::BF16] {
        let mut rng = Rng::new(17);
        let x = rng.vec(n, -100.0, 100.0, dt);
        // f32 values with bits below the half types' precision: narrowing rounds them (to
        // nearest even, as the CPU's DType::round).
        let wide = rng.vec(n, -100.0, 100.0, D::F32);
        let narrowed: Vec<f32> = wide.iter().map(|&v| dt.round(v)).collect();
        for (dev, mis) in devices().iter().flat_map(|d| [(d, false), (d, true)]) {
            let off = |b: Buf| if mis { b.misaligned() } else { b };
            let (mut out, mut xb) = (Buf::poisoned(n, D::F32), off(Buf::from_f32(&x, dt)));
            let (from, to, o, xs) = (dtype(dt), dtype(D::F32), &mut out, &mut xb);
            dev.run(launch::Cast { from, to, out: o, x: xs, n }.launch(dev.geometry())).unwrap();
            assert_eq!(out.to_f32(), x, "cast {dt:?} → f32 (misaligned: {mis}) on {dev}");
            let (mut out, mut xb) = (Buf::poisoned(n, dt), off(Buf::from_f32(&wide, D::F32)));
            let (from, to, o, xs) = (dtype(D::F32), dtype(dt), &mut out, &mut xb);
            dev.run(launch::Cast { from, to, out: o, x: xs, n }.launch(dev.geometry())).unwrap();
            assert_eq!(out.to_f32(), narrowed, "cast f32 → {dt:?} (misaligned: {mis}) on {dev}");
        }
    }
}

#[test]
fn column_sums_match_reduce_sum_leading() {
    let pool = Pool::new(2);
    for dt in FLOATS {
        // Chunks of 32 rows (the executor's): 2 with a partial one, 7 over two column blocks
        // (the second partial), and a single chunk of one column.
        for (rows, c) in [(ROWS, C), (200, 130), (5, 1)] {
            let mut rng = Rng::new(rows as u64);
            let x = rng.vec(rows * c, -1.0, 1.0, dt);
            let mut want = vec![0f32; c];
            reduce::reduce_sum_leading(&pool, &mut want, &x);
            let chunks = chunks(rows);
            for dev in devices() {
                let (mut ws, mut xb, mut out) = (
                    Buf::poisoned(chunks * c, D::F32),
                    Buf::from_f32(&x, dt),
                    Buf::poisoned(c, dt),
                );
                let (dtype, ws_, x) = (dtype(dt), &mut ws, &mut xb);
                let l = rlaunch::ColumnSumPartial { dtype, ws: ws_, x, rows, c };
                dev.run(l.launch(dev.geometry())).unwrap();
                let l = rlaunch::ColumnSumFinish { dtype, out: &mut out, ws: &mut ws, chunks, c };
                dev.run(l.launch(dev.geometry())).unwrap();
                // Sums of up to 200 terms of both signs in another order: 1e-5 of each sum,
                // plus 1e-6 of the largest for a column that cancels to near zero (one here
                // reaches 0.99 of the relative part alone).
                check(
                    &format!("column sums {dt:?} {rows}x{c} on {dev}"),
                    &out.to_f32(),
                    &want,
                    dt,
                    Tol { of_largest: 1e-6, ..tol(dt, 1e-5) },
                );
            }
        }
    }
}
