//! The host watchdog of a collective that completes asynchronously — NCCL's, queued on a GPU
//! stream by a non-blocking communicator: rather than block in the driver (a stream
//! synchronise that never returns when a peer is gone), the host polls the work and the
//! communicator's asynchronous error, and past the collective timeout aborts the communicator
//! (`ncclCommAbort`), so the rank fails with an error naming the collective instead of hanging.
//! torch's NCCL watchdog does the same on its own thread; here the waiting thread polls.

use std::time::{Duration, Instant};

use super::CollectiveError;

/// Where an asynchronous collective stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    Done,
    Pending,
}

/// A collective in flight, as the watchdog sees it.
pub trait Watched {
    /// Whether it completed; an error is the communicator's asynchronous error (a peer's
    /// failure, a network error) or the device's.
    fn poll(&self) -> Result<Progress, CollectiveError>;
    /// Ends it for good (NCCL: `ncclCommAbort`); the communicator is unusable afterwards.
    fn abort(&self);
}

/// How long the watchdog sleeps between polls: short against a step's milliseconds, long
/// enough not to take a core from the ranks' own threads.
const POLL_INTERVAL: Duration = Duration::from_micros(200);

/// Waits for `w` to complete. Past `timeout`, or on an asynchronous error, it aborts `w` and
/// fails naming `collective`.
pub fn watch(w: &impl Watched, collective: &str, timeout: Duration) -> Result<(), CollectiveError> {
    let start = Instant::now();
    loop {
        match w.poll() {
            Ok(Progress::Done) => return Ok(()),
            Ok(Progress::Pending) if start.elapsed() < timeout => std::thread::sleep(POLL_INTERVAL),
            Ok(Progress::Pending) => {
                w.abort();
                return Err(CollectiveError::Stalled {
                    collective: collective.to_string(),
                    after: timeout,
                });
            }
            Err(e) => {
                // A communicator with an asynchronous error cannot be used again; aborting it
                // also releases the peers' side of its connections.
                w.abort();
                return Err(CollectiveError::Device(format!(
                    "{collective}: {e}; its communicator was aborted"
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// An injected collective: completes after `done_after` polls (None: never), or reports
    /// an asynchronous error at poll `fail_at`; counts polls and aborts.
    struct Injected {
        done_after: Option<usize>,
        fail_at: Option<usize>,
        polls: Cell<usize>,
        aborts: Cell<usize>,
    }

    impl Injected {
        fn new(done_after: Option<usize>, fail_at: Option<usize>) -> Self {
            Injected { done_after, fail_at, polls: Cell::new(0), aborts: Cell::new(0) }
        }
    }

    impl Watched for Injected {
        fn poll(&self) -> Result<Progress, CollectiveError> {
            assert_eq!(self.aborts.get(), 0, "polled after its abort");
            let n = self.polls.get() + 1;
            self.polls.set(n);
            if self.fail_at == Some(n) {
                return Err(CollectiveError::Device("remote process exited".into()));
            }
            Ok(if self.done_after.is_some_and(|d| n >= d) {
                Progress::Done
            } else {
                Progress::Pending
            })
        }
        fn abort(&self) {
            self.aborts.set(self.aborts.get() + 1);
        }
    }

    #[test]
    fn a_never_completing_collective_is_aborted_after_the_timeout() {
        let w = Injected::new(None, None);
        let t = Duration::from_millis(100);
        let start = Instant::now();
        let e = watch(&w, "ncclAllReduce at engine step 3", t).unwrap_err();
        assert!(start.elapsed() >= t);
        assert_eq!(w.aborts.get(), 1);
        assert!(w.polls.get() > 1, "polled once only");
        assert_eq!(
            e,
            CollectiveError::Stalled {
                collective: "ncclAllReduce at engine step 3".into(),
                after: t
            }
        );
        assert!(e.to_string().contains("did not complete within 0.1 s"), "{e}");
    }

    #[test]
    fn a_collective_that_completes_is_not_aborted() {
        let w = Injected::new(Some(5), None);
        watch(&w, "ncclAllReduce", Duration::from_secs(60)).unwrap();
        assert_eq!((w.polls.get(), w.aborts.get()), (5, 0));
    }

    #[test]
    fn an_asynchronous_error_aborts_at_once_and_is_reported() {
        let w = Injected::new(None, Some(3));
        let e = watch(&w, "ncclReduceScatter", Duration::from_secs(60)).unwrap_err().to_string();
        assert_eq!((w.polls.get(), w.aborts.get()), (3, 1));
        assert!(e.contains("ncclReduceScatter") && e.contains("remote process exited"), "{e}");
    }
}
