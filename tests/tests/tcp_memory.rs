//! The TCP group's collectives cost no memory beyond the ranks' own buffers, measured: ranks
//! as threads joined over loopback TCP (as rank processes are), a counting allocator giving
//! each rank thread its heap high-water mark during an all-reduce, an in-place reduce-scatter
//! and an in-place all-gather of a 12 MiB buffer — DDP's and ZeRO-1's collectives. Rank 0,
//! which reduces, may hold N−1 streamed chunks of 1 MiB and one reduced chunk; the other ranks
//! nothing. (Before the streaming, rank 0 held every rank's whole buffer: 2·12 MiB at 2 ranks.)
//!
//! `cargo test --release -p ortbench-tests --test tcp_memory -- --nocapture` prints the peaks.

use std::time::Duration;

use ortbench_engine::collective::{chunk, Collective, ReduceOp, Sharding, TcpGroup};
use ortbench_tests::counting::{live, peak, reset_peak, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

const N: usize = 3 << 20; // f32: 12 MiB
const MIB: f64 = 1024.0 * 1024.0;

#[test]
fn tcp_collectives_hold_no_copy_of_the_buffers() {
    for world in [2, 4] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let t = Duration::from_secs(30);
        let extra: Vec<(isize, f32)> = std::thread::scope(|s| {
            let root = s.spawn(move || TcpGroup::root(listener, world, t).unwrap());
            let others: Vec<_> = (1..world)
                .map(|r| {
                    let addr = addr.clone();
                    s.spawn(move || TcpGroup::connect(r, world, &addr, t).unwrap())
                })
                .collect();
            let groups: Vec<TcpGroup> = std::iter::once(root.join().unwrap())
                .chain(others.into_iter().map(|h| h.join().unwrap()))
                .collect();
            let hs: Vec<_> = groups
                .into_iter()
                .map(|g| {
                    s.spawn(move || {
                        let r = g.rank();
                        let mut buf: Vec<f32> =
                            (0..N).map(|i| ((i * 7 + r * 13) % 29) as f32 - 14.0).collect();
                        let k = Sharding::new(N, world, 16).shard;
                        let before = live();
                        reset_peak();
                        g.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                        g.reduce_scatter_in_place(&mut buf, k, ReduceOp::Sum).unwrap();
                        g.all_gather_in_place(&mut buf, k).unwrap();
                        let used = peak() - before;
                        // Element 5 after: all-reduce sums the ranks' values (exact in f32:
                        // small integers); the reduce-scatter sums the world identical sums; the
                        // all-gather leaves them.
                        let first: f32 =
                            (0..world).map(|q| ((5 * 7 + q * 13) % 29) as f32 - 14.0).sum();
                        assert_eq!(buf[5], first * world as f32, "rank {r}: wrong result");
                        assert!(chunk(N, k, r).len() <= k);
                        (used, buf[5])
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, (used, _)) in extra.iter().enumerate() {
            println!(
                "{world} ranks, rank {r}: {:.2} MiB beyond its {:.0} MiB buffer",
                *used as f64 / MIB,
                (N * 4) as f64 / MIB
            );
            // Rank 0: N−1 streamed chunks and one reduced chunk of 1 MiB, plus small change.
            let bound = if r == 0 { world as isize * (1 << 20) + (64 << 10) } else { 64 << 10 };
            assert!(
                *used <= bound,
                "{world} ranks, rank {r}: {used} bytes beyond its buffer (bound {bound})"
            );
        }
    }
}
