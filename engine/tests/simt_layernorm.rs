//! engine/kernels/layernorm.cu (with reduce.cu's column_sum_finish for dw/db) against the CPU
//! kernels in engine/src/backend/cpu/kernels/layernorm.rs, in f32/f16/bf16 on every test device.
//!
//! Tolerances: f32 2e-5 of each element (the CPU sums a row in SIMD lanes, the kernel in a warp
//! butterfly: same terms, another order — the CPU kernel's own test uses 2e-5), plus one unit
//! roundoff of the half dtypes; mean and rstd are f32 outputs in every dtype (2e-5). y, dx, dw
//! and db also get 1e-6 of the largest element ([`cancels`]): y = (x − mean)·rstd·w + b and dx
//! cancel where x is near the mean, so the few-ulp difference of the mean is absolute there,
//! and dw, db are sums over rows of both signs. Measured worst on the SIMT harness: 2.4e-8 of
//! the largest element.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::layernorm as norm;
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::exec::gpu::launch::{layernorm as launch, reduce};
use ortbench_engine::exec::gpu::support::chunks;
use ortbench_engine::DType;
use ortbench_simt::Buf;

// Rows not a multiple of the 4 rows per block, widths below / between / above the warp sizes;
// dw/db over 2 and 3 chunks of 32 rows (the last partial), one or two column blocks of 128.
// Width 200 is a multiple of every pack (4 f32, 8 f16/bf16): the row kernels' 16-byte path,
// which `misaligned` (x, or the add's a) turns back to one element at a time; 61 and 13 are not.
const SHAPES: [(usize, usize); 3] = [(37, 61), (9, 13), (70, 200)];
const EPS: f32 = 1e-5;

/// For the outputs that are sums whose terms cancel (module comment): y, dx, dw, db.
fn cancels(dt: D) -> Tol {
    Tol { of_largest: 1e-6, ..tol(dt, 2e-5) }
}

#[test]
fn forward_and_add_forward_match() {
    let pool = Pool::new(2);
    for dt in FLOATS {
        for &(rows, c) in &SHAPES {
            let mut rng = Rng::new((rows * c) as u64);
            let a = rng.vec(rows * c, -1.0, 1.0, dt);
            let b = rng.vec(rows * c, -1.0, 2.0, dt);
            let w = rng.vec(c, 0.5, 1.5, dt);
            let bias = rng.vec(c, -0.5, 0.5, dt);
            let (mut y0, mut m0, mut r0) =
                (vec![0f32; rows * c], vec![0f32; rows], vec![0f32; rows]);
            norm::layernorm_forward(&pool, &mut y0, &mut m0, &mut r0, &b, &w, &bias, EPS);
            let (mut s1, mut y1, mut m1, mut r1) =
                (vec![0f32; rows * c], vec![0f32; rows * c], vec![0f32; rows], vec![0f32; rows]);
            norm::add_layernorm_forward(
                &pool,
                &mut s1,
                &mut y1,
                &mut m1,
                &mut r1,
                Some(&a),
                &b,
                &w,
                &bias,
                EPS,
            );
            let first = devices()[0];
            let cases = devices().into_iter().map(|d| (d, false));
            for (dev, mis) in cases.chain([(first, true)]) {
                let (dtype, geo) = (dtype(dt), dev.geometry());
                let (mut y, mut m, mut r) = (
                    Buf::poisoned(rows * c, dt),
                    Buf::poisoned(rows, D::F32),
                    Buf::poisoned(rows, D::F32),
                );
                let off = |b: Buf| if mis { b.misaligned() } else { b };
                let (mut xb, mut wb, mut bb) =
                    (off(Buf::from_f32(&b, dt)), Buf::from_f32(&w, dt), Buf::from_f32(&bias, dt));
                let l = launch::LayerNormForward {
                    dtype,
                    y: &mut y,
                    mean: &mut m,
                    rstd: &mut r,
                    x: &mut xb,
                    w: &mut wb,
                    b: &mut bb,
                    rows,
                    c,
                    eps: EPS,
                };
                dev.run(l.launch(geo)).unwrap();
                let mis_ = if mis { " (misaligned)" } else { "" };
                let what = format!("layernorm {dt:?} {rows}x{c}{mis_} on {dev}");
                check(&format!("{what} y"), &y.to_f32(), &y0, dt, cancels(dt));
                check(&format!("{what} mean"), &m.to_f32(), &m0, D::F32, tol(D::F32, 2e-5));
                check(&format!("{what} rstd"), &r.to_f32(), &r0, D::F32, tol(D::F32, 2e-5));

                let (mut s, mut y, mut m, mut r) = (
                    Buf::poisoned(rows * c, dt),
                    Buf::poisoned(rows * c, dt),
                    Buf::poisoned(rows, D::F32),
                    Buf::poisoned(rows, D::F32),
                );
                let mut ab = off(Buf::from_f32(&a, dt));
                let l = launch::AddLayerNormForward {
                    dtype,
                    sum: &mut s,
                    y: &mut y,
                    mean: &mut m,
                    rstd: &mut r,
                    a: &mut ab,
                    b: &mut xb,
                    w: &mut wb,
                    bias: &mut bb,
                    rows,
                    c,
                    eps: EPS,
                };
                dev.run(l.launch(geo)).unwrap();
                let what = format!("add_layernorm {dt:?} {rows}x{c}{mis_} on {dev}");
                check(&format!("{what} sum"), &s.to_f32(), &s1, dt, tol(dt, 1e-6));
                check(&format!("{what} y"), &y.to_f32(), &y1, dt, cancels(dt));
                check(&format!("{what} mean"), &m.to_f32(), &m1, D::F32, tol(D::F32, 2e-5));
                check(&format!("{what} rstd"), &r.to_f32(), &r1, D::F32, tol(D::F32, 2e-5));
            }
        }
    }
}

#[test]
fn backward_matches_dx_dw_db() {
    let pool = Pool::new(2);
    for dt in FLOATS {
        for &(rows, c) in &SHAPES {
            let mut rng = Rng::new(3 + (rows * c) as u64);
            let x = rng.vec(rows * c, -1.0, 2.0, dt);
            let dy = rng.vec(rows * c, -1.0, 1.0, dt);
            let w = rng.vec(c, 0.5, 1.5, dt);
            let bias = rng.vec(c, -0.5, 0.5, dt);
            let (mut y0, mut m0, mut r0) =
                (vec![0f32; rows * c], vec![0f32; rows], vec![0f32; rows]);
            norm::layernorm_forward(&pool, &mut y0, &mut m0, &mut r0, &x, &w, &bias, EPS);
            let (mut dx0, mut dw0, mut db0) = (vec![0f32; rows * c], vec![0f32; c], vec![0f32; c]);
            let mut ws = vec![0f32; norm::backward_workspace(pool.threads(), c)];
            norm::layernorm_backward(
                &pool, &mut dx0, &mut dw0, &mut db0, &dy, &x, &w, &m0, &r0, &mut ws,
            );
            let chunks = chunks(rows);
            let first = devices()[0];
            let cases = devices().into_iter().map(|d| (d, false));
            for (dev, mis) in cases.chain([(first, true)]) {
                let (dtype, geo) = (dtype(dt), dev.geometry());
                let xb = Buf::from_f32(&x, dt);
                let (mut dx, mut dyb, mut xb, mut wb) = (
                    Buf::poisoned(rows * c, dt),
                    Buf::from_f32(&dy, dt),
                    if mis { xb.misaligned() } else { xb },
                    Buf::from_f32(&w, dt),
                );
                let (mut mb, mut rb) = (Buf::from_f32(&m0, D::F32), Buf::from_f32(&r0, D::F32));
                let l = launch::LayerNormBackwardDx {
                    dtype,
                    dx: &mut dx,
                    dy: &mut dyb,
                    x: &mut xb,
                    w: &mut wb,
                    mean: &mut mb,
                    rstd: &mut rb,
                    rows,
                    c,
                };
                dev.run(l.launch(geo)).unwrap();
                let mis_ = if mis { " (x misaligned)" } else { "" };
                let what = format!("layernorm backward {dt:?} {rows}x{c}{mis_} on {dev}");
                check(&format!("{what} dx"), &dx.to_f32(), &dx0, dt, cancels(dt));

                let mut part = Buf::poisoned(2 * chunks * c, D::F32);
                let l = launch::LayerNormBackwardDwdb {
                    dtype,
                    ws: &mut part,
                    dy: &mut dyb,
                    x: &mut xb,
                    mean: &mut mb,
                    rstd: &mut rb,
                    rows,
                    c,
                };
                dev.run(l.launch(geo)).unwrap();
                // dw, db are parameter gradients: f32 in every precision.
                let all = part.to_f32();
                for (k, want, name) in [(0usize, &dw0, "dw"), (1, &db0, "db")] {
                    let mut half =
                        Buf::from_f32(&all[k * chunks * c..(k + 1) * chunks * c], D::F32);
                    let mut out = Buf::poisoned(c, D::F32);
                    let (dtype, out_, ws) = (DType::F32, &mut out, &mut half);
                    let l = reduce::ColumnSumFinish { dtype, out: out_, ws, chunks, c };
                    dev.run(l.launch(geo)).unwrap();
                    check(&format!("{what} {name}"), &out.to_f32(), want, D::F32, cancels(D::F32));
                }
            }
        }
    }
}
