//! The SIMT harness's own checks, on its self-test kernels (engine/kernels/simt/selftest.cu):
//! barriers and shuffles compute what a GPU computes at warp sizes 32 and 64 and in any thread
//! order; a missing barrier, a divergent collective and an out-of-bounds write are each caught;
//! deadlocks are reported with who waits where; threads take turns in the same order as when
//! they were OS threads; launches from several threads at once stay whole.

use ortbench_simt::{launch, Buf, Dtype, Order};

const ORDERS: [Order; 4] = [Order::Forward, Order::Reverse, Order::Shuffled(7), Order::Greedy];

fn data(n: usize) -> Vec<f32> {
    // Small integers: every summation order gives the exact same f32 sum.
    (0..n).map(|i| ((i * 37 + 11) % 19) as f32 - 9.0 + 0.5).collect()
}

fn block_sums(x: &[f32], b: usize) -> Vec<f32> {
    x.chunks(b).map(|c| c.iter().sum()).collect()
}

fn run_sum(
    kernel: &str,
    x: &[f32],
    grid: u32,
    block: u32,
    warp: u32,
    order: Order,
    extra: &[ortbench_simt::Arg],
) -> Result<Vec<f32>, String> {
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
                let got = run_sum(
                    "selftest_tree_sum",
                    &x,
                    grid,
                    block,
                    warp,
                    order,
                    &[ortbench_simt::Arg::I32(1)],
                )
                .unwrap();
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
        .filter(|&&o| {
            run_sum("selftest_tree_sum", &x, grid, block, 32, o, &[ortbench_simt::Arg::I32(0)])
                .unwrap()
                != want
        })
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
            unsafe {
                launch(
                    "selftest_two_rows",
                    (1, 1, 1),
                    (block, 1, 1),
                    0,
                    warp,
                    order,
                    &[xb.ptr(), out.ptr(), ortbench_simt::Arg::I32(guard)],
                )
            }
            .unwrap();
            out.check_guards().unwrap();
            out.to_f32()
        };
        for order in ORDERS {
            assert_eq!(run(order, 1), want, "guarded, warp {warp} {order:?}");
        }
        assert_ne!(
            run(Order::Greedy, 0),
            want,
            "warp {warp}: the unguarded reuse went unseen by the greedy order"
        );
    }
}

#[test]
fn a_warp_collective_in_divergent_code_is_a_deadlock_error() {
    for warp in [32, 64] {
        let x = data(128);
        let mut xb = Buf::from_f32(&x, Dtype::F32);
        let mut out = Buf::poisoned(128, Dtype::F32);
        // SAFETY: both buffers hold 128 elements.
        let err = unsafe {
            launch(
                "selftest_divergent_shuffle",
                (1, 1, 1),
                (128, 1, 1),
                0,
                warp,
                Order::Forward,
                &[xb.ptr(), out.ptr()],
            )
        }
        .unwrap_err();
        assert!(err.contains("deadlock") && err.contains("warp collective"), "{err}");
    }
}

#[test]
fn deadlock_messages_name_the_block_and_who_waits_where() {
    // A barrier one thread of block 1 returns before: block 0 ran to completion, block 1 is
    // reported, block 2 never ran (blocks run one at a time and the launch stops at the error).
    let (grid, block) = (3u32, 128u32);
    let x = data((grid * block) as usize);
    let mut xb = Buf::from_f32(&x, Dtype::F32);
    let mut y = Buf::poisoned(x.len(), Dtype::F32);
    for order in ORDERS {
        // SAFETY: both buffers hold grid·block elements.
        let err = unsafe {
            launch(
                "selftest_early_return",
                (grid, 1, 1),
                (block, 1, 1),
                0,
                32,
                order,
                &[xb.ptr(), y.ptr(), ortbench_simt::Arg::I32(1)],
            )
        }
        .unwrap_err();
        assert_eq!(
            err,
            "selftest_early_return: deadlock in block 1: 127 thread(s) wait at __syncthreads, 0 at a warp collective, 1 exited — a barrier or warp collective that not every thread of the block/warp reaches",
            "{order:?}"
        );
        let got = y.to_f32();
        assert_eq!(got[..block as usize], x[..block as usize], "{order:?}: block 0 ran");
        assert!(
            got[block as usize..].iter().all(|v| v.is_nan()),
            "{order:?}: blocks 1 and 2 wrote nothing"
        );
    }
    // The divergent shuffle: half of every warp waits at the collective, the other half exited.
    let x = data(128);
    let mut xb = Buf::from_f32(&x, Dtype::F32);
    let mut out = Buf::poisoned(128, Dtype::F32);
    // SAFETY: both buffers hold 128 elements.
    let err = unsafe {
        launch(
            "selftest_divergent_shuffle",
            (1, 1, 1),
            (128, 1, 1),
            0,
            32,
            Order::Reverse,
            &[xb.ptr(), out.ptr()],
        )
    }
    .unwrap_err();
    assert_eq!(
        err,
        "selftest_divergent_shuffle: deadlock in block 0: 0 thread(s) wait at __syncthreads, 64 at a warp collective, 64 exited — a barrier or warp collective that not every thread of the block/warp reaches"
    );
    // And the harness runs the next launch normally.
    let want = block_sums(&data(256), 128);
    assert_eq!(
        run_sum("selftest_block_sum", &data(256), 2, 128, 32, Order::Forward, &[]).unwrap(),
        want
    );
}

#[test]
fn launches_from_several_threads_at_once_each_get_their_own_result() {
    // cargo runs tests on parallel threads: launches from them take turns, each whole.
    let handles: Vec<_> = (0..4u32)
        .map(|k| {
            std::thread::spawn(move || {
                for rep in 0..20u32 {
                    let (block, warp) = (
                        [64u32, 128, 256, 1024][((k + rep) % 4) as usize],
                        [32u32, 64][(rep % 2) as usize],
                    );
                    let grid = 1 + (k + rep) % 3;
                    let x: Vec<f32> =
                        data((grid * block) as usize).iter().map(|v| v + k as f32).collect();
                    let order = ORDERS[((k + rep) % 4) as usize];
                    let got = run_sum(
                        "selftest_tree_sum",
                        &x,
                        grid,
                        block,
                        warp,
                        order,
                        &[ortbench_simt::Arg::I32(1)],
                    )
                    .unwrap();
                    assert_eq!(got, block_sums(&x, block as usize), "thread {k} rep {rep}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// The order in which threads ran, as logged by selftest_trace: FNV-1a of the log.
fn trace(warp: u32, order: Order) -> (usize, u64) {
    let (grid, block, rounds) = (2u32, 128u32, 7);
    let mut log = Buf::from_i32(&vec![0; 8192]);
    // SAFETY: the kernel logs grid·block·(rounds + 1) + grid·warp·Σ_w w < 8192 entries.
    unsafe {
        launch(
            "selftest_trace",
            (grid, 1, 1),
            (block, 1, 1),
            0,
            warp,
            order,
            &[log.ptr(), ortbench_simt::Arg::I32(rounds)],
        )
    }
    .unwrap();
    log.check_guards().unwrap();
    let v = log.to_i64();
    let n = v[0] as usize;
    assert!(v[1..=n].iter().all(|&t| t >= 0), "a shuffle gave a NaN");
    let h = v[1..=n]
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &t| (h ^ t as u64).wrapping_mul(0x100_0000_01b3));
    (n, h)
}

#[test]
fn schedules_are_the_same_as_the_thread_based_harness() {
    // Recorded with the harness as it was when each block's threads were OS threads handing a
    // baton through semaphores (before fibers): the fibers take turns in exactly that order.
    const WANT: [(u32, Order, usize, u64); 10] = [
        (32, Order::Forward, 2432, 0xa44f617bc989e4a5),
        (32, Order::Reverse, 2432, 0xf93b0f68e8da6d25),
        (32, Order::Shuffled(7), 2432, 0x837f100bd687edb9),
        (32, Order::Shuffled(12345), 2432, 0xed62c4667029e035),
        (32, Order::Greedy, 2432, 0x63f707ad9d23fca5),
        (64, Order::Forward, 2176, 0x916166c63682b2a5),
        (64, Order::Reverse, 2176, 0x37fef7f2c33da225),
        (64, Order::Shuffled(7), 2176, 0x6e1718f410ca1245),
        (64, Order::Shuffled(12345), 2176, 0x970e7c439946f341),
        (64, Order::Greedy, 2176, 0x82181d12ddafd2a5),
    ];
    for (warp, order, n, h) in WANT {
        assert_eq!(trace(warp, order), (n, h), "warp {warp} {order:?}");
    }
}

#[test]
fn an_out_of_bounds_write_trips_the_guard_band() {
    let x = data(64);
    let mut xb = Buf::from_f32(&x, Dtype::F32);
    // The kernel writes out[1..=64]: give it 64 elements.
    let mut out = Buf::poisoned(64, Dtype::F32);
    // SAFETY: the overrun is one element, inside the 64-byte guard band.
    unsafe {
        launch(
            "selftest_off_by_one",
            (1, 1, 1),
            (64, 1, 1),
            0,
            32,
            Order::Forward,
            &[xb.ptr(), out.ptr()],
        )
    }
    .unwrap();
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
        unsafe {
            launch(
                "selftest_copy",
                (3, 1, 1),
                (64, 1, 1),
                0,
                32,
                Order::Reverse,
                &[xb.ptr(), y.ptr(), ortbench_simt::Arg::I64(n as i64)],
            )
        }
        .unwrap();
        y.check_guards().unwrap();
        assert_eq!(y.to_f32(), x);
    }
}

#[test]
fn bad_launches_are_errors() {
    // SAFETY: none of these launches runs a kernel.
    unsafe {
        assert!(launch("no_such_kernel", (1, 1, 1), (32, 1, 1), 0, 32, Order::Forward, &[])
            .unwrap_err()
            .contains("no kernel named"));
        assert!(launch("selftest_copy", (1, 1, 1), (48, 1, 1), 0, 32, Order::Forward, &[])
            .unwrap_err()
            .contains("not a multiple of warp size"));
        assert!(launch("selftest_copy", (1, 1, 1), (2048, 1, 1), 0, 32, Order::Forward, &[])
            .unwrap_err()
            .contains("1..1024"));
    }
}

#[test]
fn half_conversions_match_the_half_crate() {
    // The host f16/bf16 types round like half::f16/bf16 (checked through the cast kernels).
    let mut vals: Vec<f32> = (0..4000).map(|i| ((i as f32) - 2000.0) * 0.37 + 1e-3).collect();
    vals.extend([
        65519.0,
        65520.0,
        65536.0,
        1e-7,
        6e-8,
        3e-8,
        -5.96e-8,
        1e30,
        -1e30,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
    ]);
    for (kernel, dt) in [("cast_f32_f16", Dtype::F16), ("cast_f32_bf16", Dtype::BF16)] {
        let mut x = Buf::from_f32(&vals, Dtype::F32);
        let mut y = Buf::poisoned(vals.len(), dt);
        // SAFETY: both hold vals.len() elements.
        unsafe {
            launch(
                kernel,
                (4, 1, 1),
                (128, 1, 1),
                0,
                32,
                Order::Forward,
                &[y.ptr(), x.ptr(), ortbench_simt::Arg::I64(vals.len() as i64)],
            )
        }
        .unwrap();
        let want: Vec<f32> = vals.iter().map(|&v| dt.round(v)).collect();
        let got = y.to_f32();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits(),
                "{kernel}: {} → {g}, half crate {w} (#{i})",
                vals[i]
            );
        }
    }
}

/// Runs `selftest_mma_<dtype>` (selftest.cu) on one warp: d = a·b + c, the fragments built as
/// `mode` says. a: 16×16, b: 16×8 (k × n), c: 16×8, all row-major.
fn run_mma(
    dtype: Dtype,
    mode: i32,
    warp: u32,
    a: &[f32],
    b: &[f32],
    c: &[f32],
) -> Result<Vec<f32>, String> {
    let (mut ab, mut bb) = (Buf::from_f32(a, dtype), Buf::from_f32(b, dtype));
    let mut cb = Buf::from_f32(c, Dtype::F32);
    let mut d = Buf::poisoned(16 * 8, Dtype::F32);
    let args = [ab.ptr(), bb.ptr(), cb.ptr(), d.ptr(), ortbench_simt::Arg::I32(mode)];
    let name = format!("selftest_mma_{}", dtype.suffix());
    let smem = (16 * 16 + 2 * 16 * 8) * 2;
    // SAFETY: the buffers hold the sizes above; the kernel reads/writes nothing else.
    unsafe { launch(&name, (1, 1, 1), (warp, 1, 1), smem, warp, Order::Reverse, &args) }?;
    d.check_guards()?;
    Ok(d.to_f32())
}

/// Pseudo-random values in (−1, 1), never zero (an LCG: the harness crate has no rand).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f32 + 0.5) / (1u64 << 24) as f32;
            2.0 * u - 1.0
        })
        .collect()
}

/// The largest |got − want| / (Σ_k |a_ik·b_kj| + |c_ij|) over d = a·b + c, in f64 from the
/// inputs as rounded to `dtype`.
fn mma_error(dtype: Dtype, a: &[f32], b: &[f32], c: &[f32], got: &[f32]) -> f64 {
    let r = |x: f32| dtype.round(x) as f64;
    let mut worst = 0.0f64;
    for i in 0..16 {
        for j in 0..8 {
            let (mut want, mut mag) = (c[i * 8 + j] as f64, (c[i * 8 + j] as f64).abs());
            for k in 0..16 {
                want += r(a[i * 16 + k]) * r(b[k * 8 + j]);
                mag += (r(a[i * 16 + k]) * r(b[k * 8 + j])).abs();
            }
            worst = worst.max((got[i * 8 + j] as f64 - want).abs() / mag);
        }
    }
    worst
}

#[test]
fn tensor_core_fragments_compute_the_plain_matrix_product() {
    // Products of two 8-bit (bf16) or 11-bit (f16) significands are exact in f32; 16 of them
    // and c summed in f32 are within 17 units of 2^-24 of the magnitudes' sum.
    let tol = 17.0 * 2f64.powi(-24);
    for dtype in [Dtype::F16, Dtype::BF16] {
        let (a, b, c) = (noise(256, 1), noise(128, 2), noise(128, 3));
        for mode in [0, 1, 2] {
            let got = run_mma(dtype, mode, 32, &a, &b, &c).unwrap();
            let err = mma_error(dtype, &a, &b, &c, &got);
            assert!(err <= tol, "{dtype:?} mode {mode}: error {err:e} > {tol:e}");
        }
    }
}

#[test]
fn a_transposed_fragment_index_gives_a_wrong_product() {
    for dtype in [Dtype::F16, Dtype::BF16] {
        let (a, b, c) = (noise(256, 4), noise(128, 5), noise(128, 6));
        let got = run_mma(dtype, 3, 32, &a, &b, &c).unwrap();
        let err = mma_error(dtype, &a, &b, &c, &got);
        assert!(err > 1e-2, "{dtype:?}: a transposed A fragment went unseen (error {err:e})");
    }
}

#[test]
fn tensor_core_misuse_is_an_error_naming_the_line() {
    let (a, b, c) = (noise(256, 7), noise(128, 8), noise(128, 9));
    let err = run_mma(Dtype::BF16, 4, 32, &a, &b, &c).unwrap_err();
    assert!(
        err.contains("not reached by the whole warp together") && err.contains("selftest.cu:"),
        "{err}"
    );
    let err = run_mma(Dtype::F16, 5, 32, &a, &b, &c).unwrap_err();
    assert!(err.contains("lane 3's row address is not 16-byte aligned"), "{err}");
    let err = run_mma(Dtype::BF16, 0, 64, &a, &b, &c).unwrap_err();
    assert!(err.contains("needs a warp of 32 lanes"), "{err}");
}
