//! A small persistent thread pool for the CPU kernels of the planned executor.
//!
//! Why not Rayon or `std::thread::scope`: a training step runs ~1000 kernels, many of them a few
//! tens of microseconds long. Spawning threads per op costs about as much as such a kernel
//! (figures: docs/measurements.md), and Rayon's injector allocates job blocks,
//! which the executor's "no heap allocation inside a step" rule forbids. So: `threads − 1`
//! workers created once, the calling thread as worker 0, static round-robin assignment of task
//! indices (kernels split their work into `threads` equal chunks, so static is balanced), and a
//! spin-then-park handshake so that back-to-back kernels do not pay a futex wake each.
//!
//! Protocol, per worker: the caller publishes the job (a `&dyn Fn(usize)` on its stack and the
//! task count), then bumps the worker's `go` epoch (SeqCst) and unparks it if it sleeps; the
//! worker runs its tasks and stores `done = go`. The caller runs its own tasks, then waits for
//! every `done`. The job is only rewritten while every worker is idle (`done == go`), which is
//! what makes the lifetime-erased job pointer sound. One job at a time: a `run` that finds the
//! pool busy (another thread, or a nested call from inside a task) runs its tasks inline.
//!
//! Nothing here allocates after `Pool::new`.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks. Kernels follow each other within a few µs
/// inside a step; between steps (optimizer, data) the workers go to sleep.
const SPIN: Duration = Duration::from_micros(200);

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// The current job and its task count; written by the caller only while all workers idle.
    job: UnsafeCell<(Option<Job>, usize)>,
    threads: usize,
    panicked: AtomicBool,
    stop: AtomicBool,
}

// SAFETY: `job` is written only by the thread holding `Pool::busy` while every worker is idle,
// and read by workers only between observing a new `go` (Acquire) and publishing `done`
// (Release); the pointee is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

struct Slot {
    go: AtomicU64,
    done: AtomicU64,
    sleeping: AtomicBool,
}

struct Worker {
    slot: Arc<Slot>,
    thread: Thread,
    handle: Option<JoinHandle<()>>,
}

/// The pool. Use [`Pool::global`] in kernels; [`Pool::new`] exists for tests.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<Worker>,
    busy: Mutex<u64>,
}

static GLOBAL: OnceLock<Pool> = OnceLock::new();

impl Pool {
    /// The process-wide pool with [`crate::backend::cpu::gemm::num_threads`] threads (the
    /// caller included), created at first use.
    pub fn global() -> &'static Pool {
        GLOBAL.get_or_init(|| Pool::new(crate::backend::cpu::gemm::num_threads()))
    }

    /// A pool of `threads` threads in all: the caller plus `threads − 1` workers.
    pub fn new(threads: usize) -> Pool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            job: UnsafeCell::new((None, 0)),
            threads,
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let workers = (1..threads)
            .map(|index| {
                let slot = Arc::new(Slot {
                    go: AtomicU64::new(0),
                    done: AtomicU64::new(0),
                    sleeping: AtomicBool::new(false),
                });
                let (s, sh) = (slot.clone(), shared.clone());
                let handle = std::thread::Builder::new()
                    .name(format!("ortbench-cpu-{index}"))
                    .spawn(move || worker_loop(index, &s, &sh))
                    .expect("spawning a CPU pool thread");
                Worker { thread: handle.thread().clone(), slot, handle: Some(handle) }
            })
            .collect();
        Pool { shared, workers, busy: Mutex::new(0) }
    }

    /// Threads that run tasks (workers + the caller).
    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Runs `f(0..n)`, task `i` on thread `i % threads`, and returns when all are done.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if n == 1 || self.workers.is_empty() {
            (0..n).for_each(f);
            return;
        }
        let mut epoch = match self.busy.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            // Busy (another thread's job, or a nested call): no waiting, no deadlock.
            Err(std::sync::TryLockError::WouldBlock) => {
                (0..n).for_each(f);
                return;
            }
        };
        *epoch += 1;
        let e = *epoch;
        // SAFETY: lifetime erasure of `f`: every worker finishes with it (done == e) before
        // this function returns or unwinds, and nobody reads the job after that until it is
        // rewritten.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        // SAFETY: we hold `busy` and every worker has done == go (we waited for all of them at
        // the end of the previous run), so no worker reads `job` now.
        unsafe { *self.shared.job.get() = (Some(job), n) };
        // Every worker gets the epoch, even one without tasks, so that done == go holds for all.
        for w in &self.workers {
            w.slot.go.store(e, Ordering::SeqCst);
            if w.slot.sleeping.load(Ordering::SeqCst) {
                w.thread.unpark();
            }
        }
        let t = self.shared.threads;
        // The caller's own tasks; a panic is held until the workers are done with `f`.
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut i = 0;
            while i < n {
                f(i);
                i += t;
            }
        }));
        let mut spins = 0u32;
        for w in &self.workers {
            while w.slot.done.load(Ordering::Acquire) != e {
                spins += 1;
                if spins < 1 << 16 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        drop(epoch);
        if let Err(payload) = mine {
            std::panic::resume_unwind(payload);
        }
        if self.shared.panicked.swap(false, Ordering::SeqCst) {
            panic!("a CPU kernel task panicked on a pool thread");
        }
    }

    /// Splits `0..len` into at most `threads` contiguous chunks of at least `min_chunk`
    /// elements, each a multiple of `align` long (except the last), and runs `f` on each.
    pub fn for_ranges(
        &self,
        len: usize,
        min_chunk: usize,
        align: usize,
        f: &(dyn Fn(std::ops::Range<usize>) + Sync),
    ) {
        let parts = chunks(len, self.threads(), min_chunk, align);
        if parts <= 1 {
            if len > 0 {
                f(0..len);
            }
            return;
        }
        let per = len.div_ceil(parts).next_multiple_of(align.max(1));
        self.run(parts, &|i| {
            let start = (i * per).min(len);
            let end = ((i + 1) * per).min(len);
            if start < end {
                f(start..end);
            }
        });
    }
}

/// How many chunks `for_ranges` uses.
pub fn chunks(len: usize, threads: usize, min_chunk: usize, align: usize) -> usize {
    let per_min = min_chunk.max(align).max(1);
    (len / per_min).clamp(1, threads.max(1))
}

fn worker_loop(index: usize, slot: &Slot, shared: &Shared) {
    crate::backend::cpu::blas::init_worker_thread();
    let mut seen = 0u64;
    loop {
        // Spin, then park, until a new epoch (or stop).
        let start = Instant::now();
        let mut e = slot.go.load(Ordering::Acquire);
        let mut k = 0u32;
        while e == seen && !shared.stop.load(Ordering::Relaxed) {
            k = k.wrapping_add(1);
            if k.is_multiple_of(64) && start.elapsed() > SPIN {
                slot.sleeping.store(true, Ordering::SeqCst);
                if slot.go.load(Ordering::SeqCst) == seen && !shared.stop.load(Ordering::SeqCst) {
                    std::thread::park();
                }
                slot.sleeping.store(false, Ordering::SeqCst);
            } else {
                std::hint::spin_loop();
            }
            e = slot.go.load(Ordering::Acquire);
        }
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        seen = e;
        // SAFETY: the caller wrote the job before storing `go` (Release/SeqCst) and keeps it
        // alive until we store `done`.
        let (job, n) = unsafe { *shared.job.get() };
        if let Some(job) = job {
            let t = shared.threads;
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // SAFETY: see `Pool::run`: the pointee outlives this use.
                let f = unsafe { &*job };
                let mut i = index;
                while i < n {
                    f(i);
                    i += t;
                }
            }));
            if r.is_err() {
                shared.panicked.store(true, Ordering::SeqCst);
            }
        }
        slot.done.store(e, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for w in &mut self.workers {
            w.thread.unpark();
            if let Some(h) = w.handle.take() {
                let _ = h.join();
            }
        }
    }
}

/// A raw pointer that may cross into pool tasks: kernels hand each task a disjoint part.
#[derive(Clone, Copy, Debug)]
pub struct SyncPtr<T>(pub *mut T);
// SAFETY: used only to give pool tasks disjoint sub-ranges of one buffer (documented at each
// use); the pool joins every task before the buffer's borrow ends.
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer (a method, so that closures capture the `Sync` wrapper, not the field).
    #[inline(always)]
    pub fn ptr(self) -> *mut T {
        self.0
    }

    /// `&mut self.0[range]`.
    ///
    /// # Safety
    /// The range lies inside the buffer and no other live reference overlaps it.
    #[allow(
        clippy::mut_from_ref,
        reason = "the caller's disjoint range is the safety contract (documented); the pool hands out parts of one buffer to its threads"
    )]
    pub unsafe fn slice(&self, range: std::ops::Range<usize>) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(range.start), range.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_once_across_many_jobs() {
        let pool = Pool::new(3);
        for n in [1usize, 2, 3, 5, 8, 100] {
            for _ in 0..50 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n={n}");
            }
        }
    }

    #[test]
    fn ranges_cover_everything_once_and_respect_alignment() {
        let pool = Pool::new(2);
        for len in [0usize, 1, 15, 16, 17, 1000, 4097] {
            let hits: Vec<AtomicUsize> = (0..len).map(|_| AtomicUsize::new(0)).collect();
            pool.for_ranges(len, 4, 16, &|r| {
                assert!(r.start % 16 == 0, "{r:?}");
                for i in r {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "len={len}");
        }
    }

    #[test]
    fn sleeping_workers_wake_and_nested_calls_run_inline() {
        let pool = Pool::new(2);
        std::thread::sleep(Duration::from_millis(5)); // let the worker park
        let count = AtomicUsize::new(0);
        pool.run(4, &|_| {
            pool.run(3, &|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(count.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn a_panicking_task_is_reported_to_the_caller() {
        let pool = Pool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(2, &|i| {
                if i == 1 {
                    panic!("task 1 fails");
                }
            })
        }));
        assert!(r.is_err());
        // The pool still works afterwards.
        let count = AtomicUsize::new(0);
        pool.run(2, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
}
