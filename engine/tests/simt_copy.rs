//! engine/kernels/copy.cu against the CPU's strided copy and fill
//! (engine/src/backend/cpu/kernels/copy.rs): a permute, a column split out of wider rows and a
//! fill into a strided slice, in every dtype on every test device. Copies move bits: equality.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::copy;
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::exec::gpu::launch::copy::{self as launch, copy_meta, fill_meta};
use ortbench_engine::exec::gpu::StepBlock;
use ortbench_simt::Buf;

fn contiguous(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

#[test]
fn permutes_and_splits_copy_what_the_cpu_copies() {
    let pool = Pool::new(2);
    // (B, T, H, D) = (3, 11, 4, 7) → (B, H, T, D): the attention head split; then the middle
    // 23 columns of rows of 61 (a split piece) into a contiguous (37, 23). Both (924 and 851
    // elements) exceed the SIMT grid of 3 blocks of 256: the grid-stride loop turns.
    let perm_shape = [3usize, 4, 11, 7];
    let src_full = [3usize, 11, 4, 7];
    let cs = contiguous(&src_full);
    let perm_strides = [cs[0], cs[2], cs[1], cs[3]];
    let split_shape = [37usize, 23];
    let split_strides = [61usize, 1];
    for dt in FLOATS {
        let mut rng = Rng::new(21);
        for (shape, strides, src_len, base) in [
            (&perm_shape[..], &perm_strides[..], 3 * 11 * 4 * 7, 0usize),
            (&split_shape[..], &split_strides[..], 37 * 61, 9),
        ] {
            let x = rng.vec(src_len, -1.0, 1.0, dt);
            let n: usize = shape.iter().product();
            let dst_strides = contiguous(shape);
            let mut want = vec![0f32; n];
            // SAFETY: both views stay inside their buffers (base + max offset < src_len).
            unsafe {
                copy::copy_strided(
                    &pool,
                    x.as_ptr().add(base),
                    shape,
                    strides,
                    want.as_mut_ptr(),
                    shape,
                    &dst_strides,
                )
            };
            let m = copy_meta(shape, strides, shape, &dst_strides);
            for dev in devices() {
                let (mut out, mut src, mut mb) =
                    (Buf::poisoned(n, dt), Buf::from_f32(&x[base..], dt), Buf::from_i64(&m));
                let (dtype, dst, src, meta) = (dtype(dt), &mut out, &mut src, &mut mb);
                let l = launch::CopyStrided { dtype, dst, src, n, meta };
                dev.run(l.launch(dev.geometry())).unwrap();
                assert_eq!(out.to_f32(), want, "copy {shape:?}/{strides:?} {dt:?} on {dev}");
            }
        }
        // A fill of the strided (37, 23) piece inside rows of 61: the rest must stay as it was.
        let x = rng.vec(37 * 61, -1.0, 1.0, dt);
        let mut want = x.clone();
        // SAFETY: the piece lies inside `want`.
        unsafe {
            copy::fill_strided(&pool, want.as_mut_ptr().add(9), &split_shape, &split_strides, 0.5)
        };
        let m = fill_meta(&split_shape, &split_strides);
        // The value alone, and times the step block's loss scale (autodiff's seed).
        let block = StepBlock { loss_scale: 4.0, ..StepBlock::default() };
        for (dev, scaled) in devices().into_iter().flat_map(|d| [false, true].map(|s| (d, s))) {
            let mut mb = Buf::from_i64(&m);
            let mut sb = step_block(&block);
            // The piece starts at element 9: the kernel gets the buffer from there on.
            let mut piece = Buf::from_f32(&x[9..], dt);
            let (dtype, dst, meta) = (dtype(dt), &mut piece, &mut mb);
            let (value, scaled_by) = if scaled { (0.125, Some(&mut sb)) } else { (0.5, None) };
            let l = launch::FillStrided { dtype, dst, n: 37 * 23, meta, value, scaled_by };
            dev.run(l.launch(dev.geometry())).unwrap();
            let got: Vec<f32> = x[..9].iter().copied().chain(piece.to_f32()).collect();
            assert_eq!(
                got,
                want.iter().map(|&v| dt.round(v)).collect::<Vec<_>>(),
                "fill_strided {dt:?} (step block: {scaled}) on {dev}"
            );
        }
    }
}
