//! A hang is a failure: the deadlines on a run's step reports and on its collectives.
//!
//! A rank that crashes ends its run at once (its peers' sockets close); a rank that is stopped,
//! stuck in a collective or cut off from the network says nothing. Two deadlines turn that
//! silence into an `error`: inside each worker, every collective gives up on a peer after the
//! collective timeout ([`collective_timeout`]; the TCP group's socket deadline, NCCL's
//! watchdog on GPUs) naming it; in the harness, [`StepWatch`] kills a run whose workers stop
//! reporting steps — what no collective sees: a one-rank run, a hang outside a collective, a
//! worker blocked in a driver.

use std::time::{Duration, Instant};

use crate::run_spec::RunSpec;

/// Allowance for a worker's first step report, from its start (`--first-step-deadline-s`):
/// loading the model, NVRTC compiling the engine's kernels, cuBLASLt's GEMM heuristics and
/// torch-compile's compilation all happen before it, and take minutes for the larger models.
/// Longer than NCCL's 10-minute collective timeout, so a collective that hangs in step 0 is
/// reported by the rank itself, naming it.
pub const FIRST_STEP_DEADLINE: Duration = Duration::from_secs(900);

/// torch's default NCCL timeout (`torch.distributed`'s `default_pg_nccl_timeout`): GPU work
/// is queued asynchronously, so a rank may wait in a collective for the peers' whole backlog.
pub const GPU_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(600);

/// After the first step, a worker's next report is due within this many median step times
/// (or the floor, whichever is longer): far past the step-to-step spread of a benchmark's
/// steps, which repeat the same work, and of a loaded machine's.
const STEP_FACTOR: f64 = 10.0;

/// How much longer than the collective timeout the harness waits for a step by default: the
/// rank's own error (naming the collective, the step and the silent peer) comes first.
const FLOOR_OVER_COLLECTIVE: Duration = Duration::from_secs(60);

/// The collective timeout of a run's workers: `--collective-timeout-s`, else 600 s on a GPU
/// and the TCP group's default on the CPU. A spec written by hand may hold any number: one
/// that is not a positive number of seconds is an error, not a default.
pub fn collective_timeout(spec: &RunSpec) -> anyhow::Result<Duration> {
    Ok(match spec.collective_timeout_s {
        Some(s) => {
            Duration::try_from_secs_f64(s).ok().filter(|d| !d.is_zero()).ok_or_else(|| {
                anyhow::anyhow!(
                    "collective_timeout_s must be a positive number of seconds, got {s}"
                )
            })?
        }
        None if spec.device.starts_with("cuda") => GPU_COLLECTIVE_TIMEOUT,
        None => ortbench_engine::collective::tcp::DEFAULT_COLLECTIVE_TIMEOUT,
    })
}

/// The user's hang deadlines (`--first-step-deadline-s`, `--hang-deadline-s`); unset ones
/// default per run.
#[derive(Clone, Copy, Debug, Default)]
pub struct HangLimits {
    pub first_step_s: Option<f64>,
    pub step_floor_s: Option<f64>,
}

/// Per worker process of a run: when it last reported, and whether it still owes reports.
pub struct StepWatch {
    first_step: Duration,
    floor: Duration,
    /// The deadline of a report after the first (max(floor, 10 × median step)).
    step_deadline: Duration,
    step_ms: Vec<f64>,
    workers: Vec<Worker>,
}

#[derive(Clone, Copy)]
struct Worker {
    /// Its last report (the step it finished), or its start.
    last: Instant,
    steps: usize,
    last_step: Option<usize>,
    /// Sent its summary or an error, or exited: owes nothing more.
    done: bool,
}

/// A worker that went silent: which, since when, and the deadline it missed.
#[derive(Clone, Debug, PartialEq)]
pub struct Silence {
    pub worker: usize,
    pub message: String,
}

impl StepWatch {
    pub fn new(
        spec: &RunSpec,
        limits: HangLimits,
        workers: usize,
        start: Instant,
    ) -> anyhow::Result<StepWatch> {
        let floor = match limits.step_floor_s {
            Some(s) => Duration::from_secs_f64(s),
            None => collective_timeout(spec)? + FLOOR_OVER_COLLECTIVE,
        };
        Ok(StepWatch {
            first_step: limits.first_step_s.map_or(FIRST_STEP_DEADLINE, Duration::from_secs_f64),
            floor,
            step_deadline: floor,
            step_ms: Vec::new(),
            workers: vec![Worker { last: start, steps: 0, last_step: None, done: false }; workers],
        })
    }

    /// Worker `w` reported `step`, which took `step_ms`.
    pub fn step(&mut self, w: usize, step: usize, step_ms: f64, now: Instant) {
        let k = &mut self.workers[w];
        (k.last, k.steps, k.last_step) = (now, k.steps + 1, Some(step));
        self.step_ms.push(step_ms);
        let mut sorted = self.step_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let scaled = Duration::from_secs_f64((STEP_FACTOR * median / 1e3).max(0.0));
        self.step_deadline = self.floor.max(scaled);
    }

    /// Worker `w` owes no more reports (its summary, its error, or its exit).
    pub fn done(&mut self, w: usize) {
        self.workers[w].done = true;
    }

    fn deadline(&self, k: &Worker) -> Duration {
        if k.steps == 0 {
            self.first_step
        } else {
            self.step_deadline
        }
    }

    /// The silent worker once one is past its deadline. Its peers then wait in a collective
    /// and fall silent too, so the one named is, among those still owing reports: one whose
    /// process is stopped (`stopped(w)`), else the one with the fewest steps, else the one
    /// silent the longest.
    pub fn silent(&self, now: Instant, stopped: impl Fn(usize) -> bool) -> Option<Silence> {
        let live = || self.workers.iter().enumerate().filter(|(_, k)| !k.done);
        live().find(|(_, k)| now.saturating_duration_since(k.last) > self.deadline(k))?;
        let (w, k) = live()
            .find(|(w, _)| stopped(*w))
            .or_else(|| live().min_by_key(|(_, k)| (k.steps, k.last)))?;
        let quiet = now.saturating_duration_since(k.last).as_secs_f64();
        let (n, median) = (self.workers.len(), self.median_s());
        let who = if n > 1 { format!("rank {w} of {n}") } else { "the worker".to_string() };
        let mut message = match k.last_step {
            None => format!(
                "{who} went silent before its first step: no step report {quiet:.1} s after its start (--first-step-deadline-s {:.1})",
                self.first_step.as_secs_f64()
            ),
            Some(s) => format!(
                "{who} went silent after step {s}: no step report for {quiet:.1} s (deadline {:.1} s: the longer of --hang-deadline-s {:.1} and {STEP_FACTOR} × the median step {median:.3} s)",
                self.step_deadline.as_secs_f64(),
                self.floor.as_secs_f64()
            ),
        };
        if stopped(w) {
            message.push_str("; its process was stopped (SIGSTOP)");
        }
        Some(Silence { worker: w, message })
    }

    fn median_s(&self) -> f64 {
        let mut sorted = self.step_ms.clone();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).map_or(0.0, |ms| ms / 1e3)
    }
}

/// Whether process `pid` is stopped (state `T`, or `t` under a tracer), from /proc.
pub fn is_stopped(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        // The state follows the command name in parentheses, which may itself hold spaces.
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with(['T', 't'])))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(device: &str, collective_timeout_s: Option<f64>) -> RunSpec {
        let mut s: RunSpec = serde_json::from_value(serde_json::json!({
            "model": "tiny-gpt2", "config": "ort", "precision": "fp32", "device": device,
            "batch_size": 2, "ranks": 2, "seq_len": 16, "steps": 6, "warmup": 1, "seed": 0,
            "lr": 1e-3, "weight_decay": 0.0, "max_grad_norm": 1.0, "lr_schedule": "constant",
            "lr_warmup_steps": 0, "dropout": null, "data": null, "weights": "Random"
        }))
        .unwrap();
        s.collective_timeout_s = collective_timeout_s;
        s
    }

    #[test]
    fn collective_timeouts_default_by_device_and_follow_the_flag() {
        let t = |device, s| collective_timeout(&spec(device, s)).map_err(|e| e.to_string());
        assert_eq!(t("cpu", None), Ok(Duration::from_secs(120)));
        assert_eq!(t("cuda", None), Ok(Duration::from_secs(600)));
        assert_eq!(t("cuda:1", Some(2.5)), Ok(Duration::from_millis(2500)));
        for bad in [0.0, -1.0, f64::NAN] {
            let e = t("cpu", Some(bad)).unwrap_err();
            assert!(e.contains("must be a positive number of seconds"), "{e}");
        }
    }

    #[test]
    fn the_step_deadline_is_the_longer_of_the_floor_and_ten_median_steps() {
        let t0 = Instant::now();
        let s = |x: f64| Duration::from_secs_f64(x);
        let limits = HangLimits { first_step_s: Some(30.0), step_floor_s: Some(2.0) };
        let mut w = StepWatch::new(&spec("cpu", None), limits, 2, t0).unwrap();
        // Before any report: the first step's allowance.
        assert_eq!(w.silent(t0 + s(29.0), |_| false), None);
        let first = w.silent(t0 + s(31.0), |_| false).unwrap();
        assert!(first.message.contains("before its first step"), "{first:?}");
        // Fast steps: the floor.
        for r in 0..2 {
            w.step(r, 0, 10.0, t0 + s(1.0));
        }
        assert_eq!(w.silent(t0 + s(2.9), |_| false), None);
        assert!(w.silent(t0 + s(3.1), |_| false).is_some());
        // Slow steps (median 1 s): 10 of them.
        for r in 0..2 {
            w.step(r, 1, 1000.0, t0 + s(2.0));
            w.step(r, 2, 1000.0, t0 + s(3.0));
        }
        assert_eq!(w.silent(t0 + s(12.9), |_| false), None);
        assert!(w.silent(t0 + s(13.1), |_| false).is_some());
        // A worker that finished owes nothing.
        w.done(0);
        w.done(1);
        assert_eq!(w.silent(t0 + s(1000.0), |_| false), None);
    }

    #[test]
    fn the_silent_rank_named_is_the_stopped_one_else_the_one_behind() {
        let t0 = Instant::now();
        let s = |x: f64| Duration::from_secs_f64(x);
        let limits = HangLimits { first_step_s: None, step_floor_s: Some(1.0) };
        let mut w = StepWatch::new(&spec("cpu", None), limits, 3, t0).unwrap();
        for r in 0..3 {
            w.step(r, 0, 10.0, t0);
        }
        // Rank 2 reported step 1 last, but ranks 0 and 2 are ahead of rank 1.
        w.step(0, 1, 10.0, t0 + s(0.1));
        w.step(2, 1, 10.0, t0 + s(0.2));
        let behind = w.silent(t0 + s(5.0), |_| false).unwrap();
        assert_eq!(behind.worker, 1, "{behind:?}");
        assert!(behind.message.starts_with("rank 1 of 3 went silent after step 0"), "{behind:?}");
        let stopped = w.silent(t0 + s(5.0), |r| r == 2).unwrap();
        assert_eq!(stopped.worker, 2);
        assert!(stopped.message.ends_with("its process was stopped (SIGSTOP)"), "{stopped:?}");
    }

    #[test]
    fn a_stopped_process_reads_as_stopped() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as libc::pid_t;
        assert!(!is_stopped(pid));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let t = Instant::now();
        while !is_stopped(pid) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(is_stopped(pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
