//! The SIMT harness's own checks, on its self-test kernels (engine/kernels/simt/selftest.cu):
//! barriers and shuffles compute what a GPU computes at warp sizes 32 and 64 and in any thread
//! order; a missing barrier, a divergent collective and an out-of-bounds write are each caught.

use ortbench_simt::{launch, Buf, Dtype, Order};

const ORDERS: [Order; 4] = [Order::Forward, Order::Reverse, Order::Shuffled(7), Order::Greedy];

fn data(n: usize) -> Vec<f32> {
    // Small integers: every summation order gives the exact same f32 sum.
    (0..n).map(|i| ((i * 37 + 11) % 19) as f32 - 9.0 + 0.5).collect()
}

fn block_sums(x: &[f32], b: usize) -> Vec<f32> {
    x.chunks(b).map(|c| c.iter().sum()).collect()
}

fn run_sum(kernel: &str, x: &[f32], grid: u32, block: u32, warp: u32, order: Order, extra: &[ortbench_simt::Arg]) -> Result<Vec<f32>, String> {
    let mut xb = Buf::from_f32(x, Dtype::F32);
    let mut out = Buf::poisoned(grid as usize, Dtype::F32);
    let mut args = vec![xb.ptr(), out.ptr()];
    args.extend_from_slice(extra);
    // SAFETY: x holds grid·block elements, out grid.
    unsafe { launch(kernel, (grid, 1, 1), (block, 1, 1), 0, warp, order, &args) }?;
    out.check_guards()?;
    Ok(out.to_f32())
}

#[test]
fn block_reductions_are_exact_at_warp_32_and_64_in_every_order() {
    for warp in [32, 64] {
        for block in [64u32, 128, 256] {
            let grid = 3;
            let x = data((grid * block) as usize);
            let want = block_sums(&x, block as usize);
            for order in ORDERS {
                let got = run_sum("selftest_block_sum", &x, grid, block, warp, order, &[]).unwrap();
                assert_eq!(got, want, "block_sum warp {warp} block {block} {order:?}");
                let got = run_sum("selftest_tree_sum", &x, grid, block, warp, order, &[ortbench_simt::Arg::I32(1)]).unwrap();
                assert_eq!(got, want, "tree_sum warp {warp} block {block} {order:?}");
            }
        }
    }
}

#[test]
fn a_missing_syncthreads_gives_a_wrong_sum_in_some_order() {
    let (grid, block) = (2u32, 128u32);
    let x = data((grid * block) as usize);
    let want = block_sums(&x, block as usize);
    let wrong = ORDERS
        .iter()
        .filter(|&&o| run_sum("selftest_tree_sum", &x, grid, block, 32, o, &[ortbench_simt::Arg::I32(0)]).unwrap() != want)
        .count();
    assert!(wrong > 0, "the race went unseen in every order");
}

#[test]
fn a_missing_barrier_before_shared_memory_reuse_is_caught_by_the_greedy_order() {
    // Round-robin orders let every warp read a phase's shared values before any warp moves
    // on, so only the greedy order (early warps race ahead) shows this race.
    let block = 128u32;
    let x = data(2 * block as usize);
    let want = block_sums(&x, block as usize);
    for warp in [32, 64] {
        let run = |order: Order, guard: i32| {
            let mut xb = Buf::from_f32(&x, Dtype::F32);
            let mut out = Buf::poisoned(2, Dtype::F32);
            // SAFETY: x holds 2·block elements, out 2.
            unsafe { launch("selftest_two_rows", (1, 1, 1), (block, 1, 1), 0, warp, order, &[xb.ptr(), out.ptr(), ortbench_simt::Arg::I32(guard)]) }.unwrap();
            out.check_guards().unwrap();
            out.to_f32()
        };
        for order in ORDERS {
            assert_eq!(run(order, 1), want, "guarded, warp {warp} {order:?}");
        }
        assert_ne!(run(Order::Greedy, 0), want, "warp {warp}: the unguarded reuse went unseen by the greedy order");
    }
}

#[test]
fn a_warp_collective_in_divergent_code_is_a_deadlock_error() {
    for warp in [32, 64] {
        let x = data(128);
        let mut xb = Buf::from_f32(&x, Dtype::F32);
        let mut out = Buf::poisoned(128, Dtype::F32);
        // SAFETY: both buffers hold 128 elements.
        let err = unsafe { launch("selftest_divergent_shuffle", (1, 1, 1), (128, 1, 1), 0, warp, Order::Forward, &[xb.ptr(), out.ptr()]) }.unwrap_err();
        assert!(err.contains("deadlock") && err.contains("warp collective"), "{err}");
    }
}

#[test]
fn an_out_of_bounds_write_trips_the_guard_band() {
    let x = data(64);
    let mut xb = Buf::from_f32(&x, Dtype::F32);
    // The kernel writes out[1..=64]: give it 64 elements.
    let mut out = Buf::poisoned(64, Dtype::F32);
    // SAFETY: the overrun is one element, inside the 64-byte guard band.
    unsafe { launch("selftest_off_by_one", (1, 1, 1), (64, 1, 1), 0, 32, Order::Forward, &[xb.ptr(), out.ptr()]) }.unwrap();
    let err = out.check_guards().unwrap_err();
    assert!(err.contains("past the end"), "{err}");
}

#[test]
fn grid_stride_loops_cover_sizes_that_are_not_multiples_of_the_block() {
    for n in [1usize, 63, 64, 65, 1000] {
        let x = data(n);
        let mut xb = Buf::from_f32(&x, Dtype::F32);
        let mut y = Buf::poisoned(n, Dtype::F32);
        // SAFETY: both hold n elements; the kernel bounds-checks i < n.
        unsafe { launch("selftest_copy", (3, 1, 1), (64, 1, 1), 0, 32, Order::Reverse, &[xb.ptr(), y.ptr(), ortbench_simt::Arg::I64(n as i64)]) }.unwrap();
        y.check_guards().unwrap();
        assert_eq!(y.to_f32(), x);
    }
}

#[test]
fn bad_launches_are_errors() {
    // SAFETY: none of these launches runs a kernel.
    unsafe {
        assert!(launch("no_such_kernel", (1, 1, 1), (32, 1, 1), 0, 32, Order::Forward, &[]).unwrap_err().contains("no kernel named"));
        assert!(launch("selftest_copy", (1, 1, 1), (48, 1, 1), 0, 32, Order::Forward, &[]).unwrap_err().contains("not a multiple of warp size"));
        assert!(launch("selftest_copy", (1, 1, 1), (2048, 1, 1), 0, 32, Order::Forward, &[]).unwrap_err().contains("1..1024"));
    }
}

#[test]
fn half_conversions_match_the_half_crate() {
    // The host f16/bf16 types round like half::f16/bf16 (checked through the cast kernels).
    let mut vals: Vec<f32> = (0..4000).map(|i| ((i as f32) - 2000.0) * 0.37 + 1e-3).collect();
    vals.extend([65519.0, 65520.0, 65536.0, 1e-7, 6e-8, 3e-8, -5.96e-8, 1e30, -1e30, 1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0]);
    for (kernel, dt) in [("cast_f32_f16", Dtype::F16), ("cast_f32_bf16", Dtype::BF16)] {
        let mut x = Buf::from_f32(&vals, Dtype::F32);
        let mut y = Buf::poisoned(vals.len(), dt);
        // SAFETY: both hold vals.len() elements.
        unsafe { launch(kernel, (4, 1, 1), (128, 1, 1), 0, 32, Order::Forward, &[y.ptr(), x.ptr(), ortbench_simt::Arg::I64(vals.len() as i64)]) }.unwrap();
        let want: Vec<f32> = vals.iter().map(|&v| dt.round(v)).collect();
        let got = y.to_f32();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g.to_bits() == w.to_bits(), "{kernel}: {} → {g}, half crate {w} (#{i})", vals[i]);
        }
    }
}
