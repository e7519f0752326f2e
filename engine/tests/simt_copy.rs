//! engine/kernels/copy.cu against the CPU's strided copy and fill
//! (engine/src/backend/cpu/kernels/copy.rs): a permute, a column split out of wider rows and a
//! fill into a strided slice, in every dtype on every test device. Copies move bits: equality.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::copy;
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_simt::Buf;

fn contiguous(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

fn meta(parts: &[&[usize]]) -> Vec<i64> {
    parts.iter().flat_map(|p| p.iter().map(|&v| v as i64)).collect()
}

#[test]
fn permutes_and_splits_copy_what_the_cpu_copies() {
    let pool = Pool::new(2);
    // (B, T, H, D) = (2, 5, 3, 7) → (B, H, T, D): the attention head split; then the middle
    // 11 columns of rows of 29 (a split piece) into a contiguous (13, 11).
    let perm_shape = [2usize, 3, 5, 7];
    let src_full = [2usize, 5, 3, 7];
    let cs = contiguous(&src_full);
    let perm_strides = [cs[0], cs[2], cs[1], cs[3]];
    let split_shape = [13usize, 11];
    let split_strides = [29usize, 1];
    for dt in FLOATS {
        let mut rng = Rng::new(21);
        for (shape, strides, src_len, base) in [
            (&perm_shape[..], &perm_strides[..], 2 * 5 * 3 * 7, 0usize),
            (&split_shape[..], &split_strides[..], 13 * 29, 9),
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
            let m = meta(&[&[shape.len(), shape.len()], shape, strides, shape, &dst_strides]);
            for dev in devices() {
                let (mut out, mut src, mut mb) =
                    (Buf::poisoned(n, dt), Buf::from_f32(&x[base..], dt), Buf::from_i64(&m));
                dev.launch(
                    &kname("copy_strided", dt),
                    blocks_for(n, 128),
                    128,
                    0,
                    &mut [A::B(&mut out), A::B(&mut src), A::I64(n as i64), A::B(&mut mb)],
                )
                .unwrap();
                assert_eq!(out.to_f32(), want, "copy {shape:?}/{strides:?} {dt:?} on {dev}");
            }
        }
        // A fill of the strided (13, 11) piece inside rows of 29: the rest must stay as it was.
        let x = rng.vec(13 * 29, -1.0, 1.0, dt);
        let mut want = x.clone();
        // SAFETY: the piece lies inside `want`.
        unsafe {
            copy::fill_strided(&pool, want.as_mut_ptr().add(9), &split_shape, &split_strides, 0.5)
        };
        let m = meta(&[&[2], &split_shape, &split_strides]);
        for dev in devices() {
            let mut mb = Buf::from_i64(&m);
            // The piece starts at element 9: the kernel gets the buffer from there on.
            let mut piece = Buf::from_f32(&x[9..], dt);
            dev.launch(
                &kname("fill_strided", dt),
                2,
                64,
                0,
                &mut [A::B(&mut piece), A::I64(13 * 11), A::B(&mut mb), A::F32(0.5)],
            )
            .unwrap();
            let got: Vec<f32> = x[..9].iter().copied().chain(piece.to_f32()).collect();
            assert_eq!(
                got,
                want.iter().map(|&v| dt.round(v)).collect::<Vec<_>>(),
                "fill_strided {dt:?} on {dev}"
            );
        }
    }
}
