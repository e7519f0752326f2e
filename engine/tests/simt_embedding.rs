//! engine/kernels/embedding.cu (`embedding_forward`, `embedding_backward`) against the CPU
//! kernels in engine/src/backend/cpu/kernels/embedding.rs, tables and gradients in f32/f16/bf16
//! on every test device (SIMT warp 32/64 × both thread orders; or the GPU).
//!
//! Cases: widths 61 (one partial column block of 128), 200 (a full block and a partial one)
//! and 13; 37 ids with duplicates (every third id is 5) over vocabularies of 50 (most rows
//! unused: their gradient must be 0) and 7 (every row hit many times), gathered by a grid of 3
//! blocks (the grid-stride loop over rows); the backward with P = 1, 3 and 8 id residues (the
//! ownership split; 7 over a vocabulary of 7: the launcher's rule, at most one residue per
//! row), reached through the device's grid size as the executor's launcher sizes P; ids out of range (V, −1, 2^40: the last
//! would fault if it were used as an index) set the error flag, give a NaN output row and
//! are left out of the gradient, without a write out of bounds.
//!
//! Tolerance: none — both results are compared bit for bit. The gather copies storage; the
//! scatter adds, per table element, the same f32 values (dout as stored, widened exactly) from
//! 0 in the same row order as the CPU, and the gradient is f32 in every dtype.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::embedding as cpu;
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::exec::gpu::launch::{embedding as launch, Device};
use ortbench_engine::exec::gpu::support::ROW_BLOCK;
use ortbench_simt::{Buf, Dtype};

const SHAPES: [(usize, usize, usize); 3] = [(50, 61, 37), (7, 200, 37), (50, 13, 23)];

fn ids_for(n: usize, v: usize, rng: &mut Rng) -> Vec<i64> {
    (0..n).map(|i| if i % 3 == 0 { 5 % v as i64 } else { rng.below(v as u64) as i64 }).collect()
}

/// The gathered rows and the error flag.
fn gather(dev: &Dev, dt: Dtype, table: &[f32], ids: &[i64], c: usize) -> (Vec<f32>, i64) {
    let n = ids.len();
    let (mut out, mut err, mut ib, mut tb) = (
        Buf::poisoned(n * c, dt),
        Buf::from_i32(&[0]),
        Buf::from_i64(ids),
        Buf::from_f32(table, dt),
    );
    let l = launch::EmbeddingForward {
        dtype: dtype(dt),
        out: &mut out,
        err: Some(&mut err),
        ids: &mut ib,
        table: &mut tb,
        n,
        c,
        v: table.len() / c,
    };
    dev.run(l.launch(dev.geometry())).unwrap();
    (out.to_f32(), err.to_i64()[0])
}

/// The f32 table gradient (over a poisoned buffer: every element must be written) and the flag,
/// on a device whose grid size makes the launcher split the ids into `parts` residues.
fn scatter(
    dev: &Dev,
    dt: Dtype,
    dout: &[f32],
    ids: &[i64],
    v: usize,
    c: usize,
    parts: u32,
) -> (Vec<f32>, i64) {
    let n = ids.len();
    let (mut dtab, mut err, mut ib, mut db) = (
        Buf::poisoned(v * c, D::F32),
        Buf::from_i32(&[0]),
        Buf::from_i64(ids),
        Buf::from_f32(dout, dt),
    );
    let col_blocks = c.div_ceil(ROW_BLOCK as usize) as u32;
    let geo = Device { max_blocks: parts * col_blocks, ..dev.geometry() };
    let l = launch::EmbeddingBackward {
        dtype: dtype(dt),
        dtable: &mut dtab,
        err: Some(&mut err),
        ids: &mut ib,
        dout: &mut db,
        n,
        c,
        v,
    }
    .launch(geo);
    assert_eq!(l.grid, col_blocks * parts.min(v as u32), "{parts} residues over V {v}");
    dev.run(l).unwrap();
    (dtab.to_f32(), err.to_i64()[0])
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn forward_and_backward_are_bit_identical_to_the_cpu() {
    let pool = Pool::new(2);
    for dt in FLOATS {
        for &(v, c, n) in &SHAPES {
            let mut rng = Rng::new((v * c + n) as u64);
            let table = rng.vec(v * c, -1.0, 1.0, dt);
            let ids = ids_for(n, v, &mut rng);
            let dout = rng.vec(n * c, -1.0, 1.0, dt);
            let mut want_out = vec![0f32; n * c];
            cpu::embedding_forward(&pool, &mut want_out, &ids, &table, c).unwrap();
            let mut want_d = vec![f32::NAN; v * c];
            cpu::embedding_backward(&pool, &mut want_d, &ids, &dout, c).unwrap();
            assert!(want_d.contains(&0.0) || v == 7, "some rows unused");
            for dev in devices() {
                let what = format!("embedding {dt:?} V {v} C {c} N {n} on {dev}");
                let (out, err) = gather(&dev, dt, &table, &ids, c);
                assert_eq!(err, 0, "{what}: forward error flag");
                assert_eq!(bits(&out), bits(&want_out), "{what}: forward");
                for parts in [1, 3, 8] {
                    let (d, err) = scatter(&dev, dt, &dout, &ids, v, c, parts);
                    assert_eq!(err, 0, "{what}: backward error flag");
                    assert_eq!(
                        bits(&d),
                        bits(&want_d),
                        "{what}: backward with {parts} id residues"
                    );
                }
            }
        }
    }
}

#[test]
fn ids_out_of_range_set_the_error_flag_without_out_of_bounds_access() {
    let pool = Pool::new(2);
    let (v, c, n) = (20usize, 61usize, 12usize);
    for dt in FLOATS {
        let mut rng = Rng::new(9);
        let table = rng.vec(v * c, -1.0, 1.0, dt);
        let good = ids_for(n, v, &mut rng);
        let dout = rng.vec(n * c, -1.0, 1.0, dt);
        let bad_rows = [1usize, 4, 10];
        let mut ids = good.clone();
        for (&r, bad) in bad_rows.iter().zip([v as i64, -1, 1i64 << 40]) {
            ids[r] = bad;
        }
        assert!(cpu::check_ids(&ids, v).is_err());
        let mut want_out = vec![0f32; n * c];
        cpu::embedding_forward(&pool, &mut want_out, &good, &table, c).unwrap();
        // The gradient of the valid rows only: what the kernel sums when it skips the bad ones.
        let keep: Vec<usize> = (0..n).filter(|r| !bad_rows.contains(r)).collect();
        let kept_ids: Vec<i64> = keep.iter().map(|&r| ids[r]).collect();
        let kept_dout: Vec<f32> =
            keep.iter().flat_map(|&r| dout[r * c..(r + 1) * c].iter().copied()).collect();
        let mut want_d = vec![0f32; v * c];
        cpu::embedding_backward(&pool, &mut want_d, &kept_ids, &kept_dout, c).unwrap();
        for dev in devices() {
            let what = format!("embedding {dt:?} bad ids on {dev}");
            let (out, err) = gather(&dev, dt, &table, &ids, c);
            assert_eq!(err, 1, "{what}: forward error flag");
            for r in 0..n {
                let (got, want) = (&out[r * c..(r + 1) * c], &want_out[r * c..(r + 1) * c]);
                if bad_rows.contains(&r) {
                    assert!(got.iter().all(|x| x.is_nan()), "{what}: output row {r} of a bad id");
                } else {
                    assert_eq!(bits(got), bits(want), "{what}: output row {r}");
                }
            }
            let (d, err) = scatter(&dev, dt, &dout, &ids, v, c, 3);
            assert_eq!(err, 1, "{what}: backward error flag");
            assert_eq!(bits(&d), bits(&want_d), "{what}: backward without the bad rows");
        }
    }
}
