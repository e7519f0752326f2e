//! In-process ranks: threads of one process that share memory.
//!
//! Each collective is three phases separated by a barrier: every rank publishes its buffer's
//! address; every rank computes its slice of the result reading all ranks' inputs; every rank
//! writes/copies what it owns. Reductions sum in rank order 0..N, in f64, so every rank gets
//! bit-identical results and runs are reproducible (as NCCL's ring is not, but as a
//! correctness reference should be).

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::tcp::DEFAULT_COLLECTIVE_TIMEOUT;
use super::{check_chunks, chunk, Abortable, Collective, CollectiveError, Element, ReduceOp};

struct Shared {
    world: usize,
    gate: Gate,
    /// Per rank: (send address, send len, recv address, recv len) of the current collective.
    slots: Mutex<Vec<(usize, usize, usize, usize)>>,
}

/// std's `Barrier`, with an abort ([`Abortable::abort`]). Only the wait for every rank to
/// *enter* a collective gives way to it: a peer that never comes (hung, stopped) is what a
/// watchdog gives up on. Once every rank has entered, the phase barriers are always waited out:
/// every rank in them has only memory work left before it arrives, and a rank must not return
/// while another may still read or write its buffer.
struct Gate {
    world: usize,
    state: Mutex<GateState>,
    turn: Condvar,
}

struct GateState {
    arrived: usize,
    generation: u64,
    aborted: bool,
}

/// Which of a collective's barriers a wait is (see [`Gate`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    Entry,
    Phase,
}

impl Gate {
    fn new(world: usize) -> Self {
        Gate {
            world,
            state: Mutex::new(GateState { arrived: 0, generation: 0, aborted: false }),
            turn: Condvar::new(),
        }
    }

    fn wait(&self, which: Wait, op: &'static str) -> Result<(), CollectiveError> {
        let poisoned = |_| CollectiveError::Poisoned(op);
        let mut s = self.state.lock().map_err(poisoned)?;
        if which == Wait::Entry && s.aborted {
            return Err(CollectiveError::Aborted(op));
        }
        let generation = s.generation;
        s.arrived += 1;
        if s.arrived == self.world {
            s.arrived = 0;
            s.generation += 1;
            self.turn.notify_all();
            return Ok(());
        }
        loop {
            s = self.turn.wait(s).map_err(poisoned)?;
            // A release wins over an abort that came after it (checked first).
            if s.generation != generation {
                return Ok(());
            }
            if which == Wait::Entry && s.aborted {
                s.arrived -= 1;
                return Err(CollectiveError::Aborted(op));
            }
        }
    }

    fn abort(&self) {
        // A poisoned lock means a rank panicked holding it: the group is dead either way.
        if let Ok(mut s) = self.state.lock() {
            s.aborted = true;
        }
        self.turn.notify_all();
    }
}

/// One rank of an in-process group. Make all ranks with [`LocalGroup::new`] and move one to
/// each thread.
pub struct LocalGroup {
    rank: usize,
    shared: Arc<Shared>,
    /// How long a watchdog lets one of this rank's collectives run ([`Abortable`]).
    timeout: Duration,
}

impl LocalGroup {
    /// A group of `world` ranks; element r is rank r.
    pub fn new(world: usize) -> Vec<LocalGroup> {
        assert!(world > 0, "a group needs at least one rank");
        let shared = Arc::new(Shared {
            world,
            gate: Gate::new(world),
            slots: Mutex::new(vec![(0, 0, 0, 0); world]),
        });
        (0..world)
            .map(|rank| LocalGroup {
                rank,
                shared: shared.clone(),
                timeout: DEFAULT_COLLECTIVE_TIMEOUT,
            })
            .collect()
    }

    /// Sets how long a watchdog waits for one of this rank's collectives before it aborts the
    /// group ([`Abortable`]; the collectives themselves wait as long as it takes).
    pub fn with_collective_timeout(self, timeout: Duration) -> Self {
        LocalGroup { timeout, ..self }
    }

    fn phase(&self, op: &'static str) -> Result<(), CollectiveError> {
        self.shared.gate.wait(Wait::Phase, op)
    }

    fn publish(
        &self,
        send: usize,
        send_len: usize,
        recv: usize,
        recv_len: usize,
        op: &'static str,
    ) -> Result<Vec<(usize, usize, usize, usize)>, CollectiveError> {
        {
            let mut s = self.shared.slots.lock().map_err(|_| CollectiveError::Poisoned(op))?;
            s[self.rank] = (send, send_len, recv, recv_len);
        }
        self.shared.gate.wait(Wait::Entry, op)?;
        let s = self.shared.slots.lock().map_err(|_| CollectiveError::Poisoned(op))?.clone();
        Ok(s)
    }

    fn check_equal(
        &self,
        slots: &[(usize, usize, usize, usize)],
        pick: impl Fn(&(usize, usize, usize, usize)) -> usize,
        expected: usize,
        op: &'static str,
    ) -> Result<(), CollectiveError> {
        for (rank, s) in slots.iter().enumerate() {
            if pick(s) != expected {
                // Every rank sees the same slots, so every rank returns this error; the
                // trailing barrier keeps the group in step.
                self.phase(op)?;
                return Err(CollectiveError::Size { op, rank, expected, got: pick(s) });
            }
        }
        Ok(())
    }

    /// Publishes an in-place collective's buffer (address, `len`, chunk size `k`) and checks
    /// that every rank passed the same `len` and `k` and that the chunks hold the buffer.
    fn publish_in_place<T>(
        &self,
        base: *mut T,
        len: usize,
        k: usize,
        op: &'static str,
    ) -> Result<Vec<(usize, usize, usize, usize)>, CollectiveError> {
        let slots = self.publish(base as usize, len, 0, k, op)?;
        self.check_equal(&slots, |s| s.1, len, op)?;
        self.check_equal(&slots, |s| s.3, k, op)?;
        if let Err(e) = check_chunks(op, self.rank, len, k, self.shared.world) {
            // Same len and k everywhere (checked): every rank fails here, in step.
            self.phase(op)?;
            return Err(e);
        }
        Ok(slots)
    }
}

fn reduce<T: Element>(vals: impl Iterator<Item = T>, op: ReduceOp, world: usize) -> T {
    let mut acc: Option<f64> = None;
    for v in vals {
        let x = v.to_f64();
        acc = Some(match (acc, op) {
            (None, _) => x,
            (Some(a), ReduceOp::Max) => a.max(x),
            (Some(a), _) => a + x,
        });
    }
    let a = acc.expect("a group has at least one rank");
    T::from_f64(if op == ReduceOp::Avg { a / world as f64 } else { a })
}

impl Collective for LocalGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CollectiveError> {
        let n = self.shared.world;
        let len = buf.len();
        let slots = self.publish(buf.as_ptr() as usize, len, 0, 0, "all_reduce")?;
        self.check_equal(&slots, |s| s.1, len, "all_reduce")?;
        // Rank r reduces chunk r of the buffer into a private result...
        let chunk = len.div_ceil(n);
        let lo = (self.rank * chunk).min(len);
        let hi = ((self.rank + 1) * chunk).min(len);
        // SAFETY: every rank's buffer has `len` elements (checked) and stays borrowed by its
        // rank until the last barrier below; in this phase all ranks only read.
        let mine: Vec<T> = (lo..hi)
            .map(|i| reduce(slots.iter().map(|s| unsafe { *(s.0 as *const T).add(i) }), op, n))
            .collect();
        self.phase("all_reduce")?;
        // ...then writes it into every rank's buffer (chunks are disjoint across ranks).
        for s in &slots {
            // SAFETY: only rank r writes chunk r of any buffer, and nobody reads in this phase.
            let dst = unsafe { std::slice::from_raw_parts_mut((s.0 as *mut T).add(lo), hi - lo) };
            dst.copy_from_slice(&mine);
        }
        self.phase("all_reduce")?;
        Ok(())
    }

    fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let n = self.shared.world;
        let k = recv.len();
        let slots = self.publish(
            send.as_ptr() as usize,
            send.len(),
            recv.as_mut_ptr() as usize,
            k,
            "reduce_scatter",
        )?;
        self.check_equal(&slots, |s| s.3, k, "reduce_scatter")?;
        self.check_equal(&slots, |s| s.1, n * k, "reduce_scatter")?;
        let base = self.rank * k;
        for (j, out) in recv.iter_mut().enumerate() {
            // SAFETY: every send buffer has N·k elements (checked) and is only read here.
            *out = reduce(slots.iter().map(|s| unsafe { *(s.0 as *const T).add(base + j) }), op, n);
        }
        self.phase("reduce_scatter")?;
        Ok(())
    }

    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollectiveError> {
        let n = self.shared.world;
        let k = send.len();
        let slots = self.publish(
            send.as_ptr() as usize,
            k,
            recv.as_mut_ptr() as usize,
            recv.len(),
            "all_gather",
        )?;
        self.check_equal(&slots, |s| s.1, k, "all_gather")?;
        self.check_equal(&slots, |s| s.3, n * k, "all_gather")?;
        for (r, s) in slots.iter().enumerate() {
            // SAFETY: rank r's send buffer has k elements and is only read in this phase; recv is
            // ours and distinct from every send buffer (a &mut and & cannot alias).
            let src = unsafe { std::slice::from_raw_parts(s.0 as *const T, k) };
            recv[r * k..(r + 1) * k].copy_from_slice(src);
        }
        self.phase("all_gather")?;
        Ok(())
    }

    fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &mut [T],
        k: usize,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let n = self.shared.world;
        // Every access below goes through `base` (and the other ranks' published bases).
        let (base, len) = (buf.as_mut_ptr(), buf.len());
        let slots = self.publish_in_place(base, len, k, "reduce_scatter_in_place")?;
        // Rank r reads chunk r of every buffer and writes chunk r of its own; no other rank
        // reads or writes any buffer's chunk r in this phase, so in place is race-free.
        for j in chunk(len, k, self.rank) {
            // SAFETY: every buffer has `len` elements (checked) and stays borrowed by its rank
            // until the barrier below; element j is in our chunk (see above).
            unsafe {
                *base.add(j) = reduce(slots.iter().map(|s| *(s.0 as *const T).add(j)), op, n)
            };
        }
        self.phase("reduce_scatter_in_place")?;
        Ok(())
    }

    fn all_gather_in_place<T: Element>(
        &self,
        buf: &mut [T],
        k: usize,
    ) -> Result<(), CollectiveError> {
        let (base, len) = (buf.as_mut_ptr(), buf.len());
        let slots = self.publish_in_place(base, len, k, "all_gather_in_place")?;
        for (r, s) in slots.iter().enumerate().filter(|(r, _)| *r != self.rank) {
            let c = chunk(len, k, r);
            // SAFETY: rank r's buffer has `len` elements (checked); its chunk r is only read in
            // this phase (every rank writes only the other ranks' chunks of its own buffer), and
            // we write chunk r of ours, which nobody else reads.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (s.0 as *const T).add(c.start),
                    base.add(c.start),
                    c.len(),
                )
            };
        }
        self.phase("all_gather_in_place")?;
        Ok(())
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CollectiveError> {
        let n = self.shared.world;
        if root >= n {
            return Err(CollectiveError::Root { root, world: n });
        }
        let len = buf.len();
        let slots = self.publish(buf.as_ptr() as usize, len, 0, 0, "broadcast")?;
        self.check_equal(&slots, |s| s.1, len, "broadcast")?;
        if self.rank != root {
            // SAFETY: the root's buffer has `len` elements and the root does not write to it
            // until after the barrier below.
            let src = unsafe { std::slice::from_raw_parts(slots[root].0 as *const T, len) };
            buf.copy_from_slice(src);
        }
        self.phase("broadcast")?;
        Ok(())
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        self.shared.gate.wait(Wait::Entry, "barrier")
    }
}

impl Abortable for LocalGroup {
    fn collective_timeout(&self) -> Duration {
        self.timeout
    }
    fn abort(&self) {
        self.shared.gate.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::super::{chunk, Sharding};
    use super::*;

    /// Random values in ±[0.1, 1), per rank and seed, never zero.
    fn data(rank: usize, n: usize, seed: u64) -> Vec<f32> {
        let mut s = (seed * 1000 + rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = 0.1 + 0.9 * ((s >> 11) as f64 / (1u64 << 53) as f64);
                (if s & 2 == 0 { u } else { -u }) as f32
            })
            .collect()
    }

    /// Runs `f` on every rank of a group of `world` threads and collects the results.
    fn on_ranks<R: Send>(world: usize, f: impl Fn(LocalGroup) -> R + Sync) -> Vec<R> {
        let groups = LocalGroup::new(world);
        std::thread::scope(|s| {
            let hs: Vec<_> = groups.into_iter().map(|g| s.spawn(|| f(g))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_reduce_sum_avg_max_on_1_to_4_ranks() {
        for world in 1..=4 {
            for len in [1, 7, 1000, 1001] {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                    let out = on_ranks(world, |g| {
                        let mut b = data(g.rank(), len, 1);
                        g.all_reduce(&mut b, op).unwrap();
                        b
                    });
                    for i in 0..len {
                        let vals: Vec<f64> =
                            (0..world).map(|r| f64::from(data(r, len, 1)[i])).collect();
                        let want = match op {
                            ReduceOp::Sum => vals.iter().sum::<f64>(),
                            ReduceOp::Avg => vals.iter().sum::<f64>() / world as f64,
                            ReduceOp::Max => vals.iter().cloned().fold(f64::MIN, f64::max),
                        } as f32;
                        for o in &out {
                            assert_eq!(o[i], want, "world {world} len {len} {op:?} i {i}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn reduce_scatter_then_all_gather_is_all_reduce_with_padding() {
        for world in 1..=4 {
            for total in [5, 999, 1024] {
                let sh = Sharding::new(total, world, 4);
                assert!(sh.padded() >= total && sh.padded().is_multiple_of(world * 4));
                let out = on_ranks(world, |g| {
                    let mut send = data(g.rank(), total, 2);
                    send.resize(sh.padded(), 0.0);
                    let mut shard = vec![f32::NAN; sh.shard];
                    g.reduce_scatter(&send, &mut shard, ReduceOp::Avg).unwrap();
                    let mut full = vec![f32::NAN; sh.padded()];
                    g.all_gather(&shard, &mut full).unwrap();
                    let mut reduced = data(g.rank(), total, 2);
                    g.all_reduce(&mut reduced, ReduceOp::Avg).unwrap();
                    (full, reduced, shard)
                });
                for (r, (full, reduced, shard)) in out.iter().enumerate() {
                    assert_eq!(&full[..total], &reduced[..], "world {world} total {total}");
                    assert!(full[total..].iter().all(|&x| x == 0.0), "padding stays zero");
                    assert_eq!(&full[sh.range(r)], &shard[..]);
                }
            }
        }
    }

    #[test]
    fn in_place_reduce_scatter_and_all_gather_on_unpadded_buffers() {
        // The buffers are the unpadded flat length; chunks past the end are short or empty
        // (17 elements on 4 ranks of 16: chunks 0..16, 16..17, and two empty ones).
        for world in 1..=4 {
            for total in [17, 999, 1024] {
                let k = Sharding::new(total, world, 16).shard;
                let out = on_ranks(world, |g| {
                    let mut buf = data(g.rank(), total, 4);
                    g.reduce_scatter_in_place(&mut buf, k, ReduceOp::Sum).unwrap();
                    let after_scatter = buf.clone();
                    g.all_gather_in_place(&mut buf, k).unwrap();
                    let mut reduced = data(g.rank(), total, 4);
                    g.all_reduce(&mut reduced, ReduceOp::Sum).unwrap();
                    (after_scatter, buf, reduced)
                });
                for (r, (scattered, gathered, reduced)) in out.iter().enumerate() {
                    let mine = chunk(total, k, r);
                    assert_eq!(
                        &scattered[mine.clone()],
                        &reduced[mine.clone()],
                        "world {world} total {total} rank {r}"
                    );
                    let local = data(r, total, 4);
                    for i in (0..total).filter(|i| !mine.contains(i)) {
                        assert_eq!(scattered[i], local[i], "other chunks are left as they were");
                    }
                    assert_eq!(gathered, reduced, "world {world} total {total} rank {r}");
                }
            }
        }
    }

    #[test]
    fn in_place_collectives_reject_mismatched_or_overlong_buffers_on_every_rank() {
        let out = on_ranks(3, |g| {
            let mut b = vec![1.0f32; 30 + g.rank()];
            g.reduce_scatter_in_place(&mut b, 16, ReduceOp::Sum)
        });
        assert!(
            out.iter().all(|r| matches!(
                r,
                Err(CollectiveError::Size { op: "reduce_scatter_in_place", .. })
            )),
            "{out:?}"
        );
        let out = on_ranks(3, |g| {
            let mut b = vec![1.0f32; 30];
            g.all_gather_in_place(&mut b, 8 + g.rank())
        });
        assert!(
            out.iter()
                .all(|r| matches!(r, Err(CollectiveError::Size { op: "all_gather_in_place", .. }))),
            "{out:?}"
        );
        let out = on_ranks(2, |g| {
            let mut b = vec![1.0f32; 33];
            (
                g.reduce_scatter_in_place(&mut b, 16, ReduceOp::Sum),
                g.all_gather_in_place(&mut b, 16),
            )
        });
        for (a, b) in &out {
            assert!(
                matches!(a, Err(CollectiveError::Chunks { len: 33, k: 16, world: 2, .. })),
                "{a:?}"
            );
            assert!(matches!(b, Err(CollectiveError::Chunks { .. })), "{b:?}");
        }
    }

    #[test]
    fn broadcast_barrier_and_half_types() {
        for world in 1..=4 {
            let out = on_ranks(world, |g| {
                let mut b: Vec<half::bf16> =
                    data(g.rank(), 33, 3).into_iter().map(half::bf16::from_f32).collect();
                g.broadcast(&mut b, world - 1).unwrap();
                g.barrier().unwrap();
                let mut h: Vec<half::f16> = vec![half::f16::from_f32(0.5); 9];
                g.all_reduce(&mut h, ReduceOp::Sum).unwrap();
                (b, h)
            });
            let root: Vec<half::bf16> =
                data(world - 1, 33, 3).into_iter().map(half::bf16::from_f32).collect();
            for (b, h) in &out {
                assert_eq!(b, &root);
                assert!(h.iter().all(|x| x.to_f32() == 0.5 * world as f32));
            }
        }
    }

    /// A rank waiting for a peer that never enters the collective is released by an abort
    /// from another thread (the watchdog's); afterwards no collective runs on the group, on
    /// any rank.
    #[test]
    fn an_abort_releases_a_rank_waiting_for_a_peer_that_never_comes() {
        let mut ranks = LocalGroup::new(2).into_iter();
        let (r0, r1) = (ranks.next().unwrap(), ranks.next().unwrap());
        // Not a scoped thread: an abort that fails to release it fails the test, not hangs it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let e = r0.all_reduce(&mut [1.0f32; 3], ReduceOp::Sum);
            tx.send((e, r0.barrier())).unwrap();
        });
        let wait = std::time::Duration::from_millis(50);
        assert!(rx.recv_timeout(wait).is_err(), "returned without its peer");
        r1.abort();
        let (e, later) = rx.recv_timeout(wait * 100).expect("still waiting after the abort");
        assert_eq!(e, Err(CollectiveError::Aborted("all_reduce")));
        assert_eq!(later, Err(CollectiveError::Aborted("barrier")));
        assert_eq!(r1.all_reduce(&mut [1.0f32; 3], ReduceOp::Sum), e);
    }

    #[test]
    fn mismatched_sizes_are_errors_on_every_rank() {
        let out = on_ranks(3, |g| {
            let mut b = vec![1.0f32; 10 + g.rank()];
            g.all_reduce(&mut b, ReduceOp::Sum)
        });
        for r in out {
            assert!(matches!(r, Err(CollectiveError::Size { op: "all_reduce", .. })), "{r:?}");
        }
        let out = on_ranks(2, |g| {
            let mut b = vec![1.0f32; 4];
            g.broadcast(&mut b, 5)
        });
        assert!(out.iter().all(|r| matches!(r, Err(CollectiveError::Root { .. }))));
    }
}
