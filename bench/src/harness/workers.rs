//! A run's worker processes: spawned (one per rank, each leading its own process group),
//! their streamed records read, watched against the timeout and the hang deadlines, killed
//! with their peers when one fails, and each ending turned into a status and a message.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::hang::{is_stopped, HangLimits, Silence, StepWatch};
use crate::output::{ResultRow, StepRow};
use crate::progress::Progress;
use crate::run_spec::RunSpec;
use crate::worker::{is_oom_message, Event};
use ortbench_report::output::MemSplit;

use super::{base_row, INTERRUPTED};

/// SIGKILL to a worker's process group (it leads one: `process_group(0)` at spawn), so that
/// its own children — inductor's compile subprocesses — do not outlive it; the worker itself
/// too, should the group be gone.
fn kill_group(child: &mut std::process::Child) {
    // SAFETY: signalling the group this worker leads; the child is not reaped yet, so its pid
    // (the group's id) is still ours.
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    let _ = child.kill();
}

/// Why the harness killed a worker.
#[derive(Clone, Copy, PartialEq)]
enum Kill {
    Timeout,
    Interrupt,
    /// `--batch-size auto`: its RSS (bytes) reached the budget's stop line.
    OverBudget(u64),
    /// A worker reported no step within the hang deadlines (the `Silence` says which).
    Hang,
}

/// One worker process of a run (a rank, or all ranks as threads).
struct Proc {
    child: std::process::Child,
    pid: libc::pid_t,
    err_thread: Option<std::thread::JoinHandle<String>>,
    /// Once reaped: (wait status, peak RSS in KiB, when).
    exit: Option<(i32, u64, Instant)>,
}

impl Proc {
    fn failed(&self) -> bool {
        self.exit.is_some_and(|(w, ..)| !(libc::WIFEXITED(w) && libc::WEXITSTATUS(w) == 0))
    }
}

/// After one rank fails, how long the others get to notice (their collectives error out at
/// once when a peer's socket closes) before they are killed.
const PEER_GRACE: Duration = Duration::from_secs(5);

/// A free TCP port on the loopback interface for a run's rendezvous.
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .context("finding a free port for the ranks' rendezvous")?;
    Ok(l.local_addr()?.port())
}

/// Runs one spec in its worker process(es) and turns their records into rows. Ranks > 1 with
/// `launch = processes` are one worker each, joined over TCP with torchrun's variables on a
/// free loopback port; their peak memory is each process's own. `stop_at` (bytes, CPU runs of
/// `--batch-size auto`): a worker whose RSS reaches it is killed, recorded as `oom`.
pub(super) fn execute(
    spec: &RunSpec,
    timeout: Option<Duration>,
    hang: HangLimits,
    progress: &Progress,
    label: &str,
    stop_at: Option<u64>,
) -> Result<(Vec<StepRow>, ResultRow)> {
    let exe = std::env::current_exe().context("cannot find the ortbench executable")?;
    let start = Instant::now();
    let n = if spec.ranks > 1 && spec.launch == "processes" { spec.ranks } else { 1 };
    let port = if n > 1 { free_port()? } else { 0 };
    let spec_json = serde_json::to_string(spec)?;
    // torch-compile: the python worker, on the weights and batches written for it here (one
    // rank: the plan refuses more).
    let scratch = if spec.config == crate::torch_compile::CONFIG {
        match crate::torch_compile::Scratch::prepare(spec) {
            Ok(s) => Some(s),
            Err(e) => {
                let mut row = base_row(spec);
                row.status = "error".into();
                row.error = format!("torch-compile: writing the run's weights and batches: {e:#}");
                row.wall_s = Some(start.elapsed().as_secs_f64());
                return Ok((Vec::new(), row));
            }
        }
    } else {
        None
    };
    let (procs, rx) = spawn_workers(&exe, &spec_json, scratch.as_ref(), n, port)?;
    let watch = StepWatch::new(spec, hang, n, start)?;
    let mut workers =
        Workers { spec, procs, watch, killed: None, silence: None, start, timeout, stop_at };
    let records = workers.collect(rx, progress, label)?;
    workers.reap()?;
    let wall_s = start.elapsed().as_secs_f64();
    let stderr_texts = workers.stderr_texts();
    Ok(workers.result(records, &stderr_texts, wall_s))
}

/// The workers' stdout lines as they arrive, each as (worker, line).
type WorkerLines = mpsc::Receiver<(usize, String)>;

/// Starts a run's `n` worker processes (the ortbench worker, or torch-compile's python one
/// from its scratch directory), with torchrun's variables when there are several, and returns
/// them with the channel on which each stdout line arrives as (worker, line).
fn spawn_workers(
    exe: &Path,
    spec_json: &str,
    scratch: Option<&crate::torch_compile::Scratch>,
    n: usize,
    port: u16,
) -> Result<(Vec<Proc>, WorkerLines)> {
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut procs: Vec<Proc> = Vec::with_capacity(n);
    for r in 0..n {
        let mut cmd = match scratch {
            Some(s) => s.command(),
            None => {
                let mut c = Command::new(exe);
                c.arg("worker").arg("--spec").arg(spec_json);
                c
            }
        };
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // Its own process group, so that a kill reaches what the worker started too
        // (inductor's compile workers under torch-compile): see kill_group.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        // The harness is its workers' launcher: none inherits the variables of whatever started
        // `ortbench run` (an sbatch step's SLURM_PROCID, torchrun's or mpirun's rank), which
        // place the harness, not them (launch_env).
        for v in crate::launch_env::LAUNCH_VARS {
            cmd.env_remove(v);
        }
        if n > 1 {
            cmd.env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string());
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for p in &mut procs {
                    kill_group(&mut p.child);
                    let _ = p.child.wait();
                }
                return Err(e).context("cannot start a worker process");
            }
        };
        let pid = child.id() as libc::pid_t;
        let mut stderr = child.stderr.take().context("worker stderr")?;
        let err_thread = std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = stderr.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        });
        let stdout = child.stdout.take().context("worker stdout")?;
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((r, line)).is_err() {
                    break;
                }
            }
        });
        procs.push(Proc { child, pid, err_thread: Some(err_thread), exit: None });
    }
    drop(tx);
    Ok((procs, rx))
}

/// A worker's summary record: what its run's row takes from it.
#[derive(Clone)]
struct Summary {
    param_count: usize,
    peak_mem_bytes: u64,
    optimizer_bytes_per_rank: usize,
    hw_flops_per_sample: Option<f64>,
    compile_s: Option<f64>,
    mem_split: Option<MemSplit>,
    step_launches: Option<String>,
}

/// What a run's workers sent: every step record, and per worker its summary or its error
/// (the message, and whether it is an out-of-memory one).
struct Records {
    steps: Vec<StepRow>,
    summaries: Vec<Option<Summary>>,
    errors: Vec<Option<(String, bool)>>,
}

/// A run's worker processes while they run, and whether (and why) the harness killed them.
struct Workers<'a> {
    spec: &'a RunSpec,
    procs: Vec<Proc>,
    watch: StepWatch,
    killed: Option<Kill>,
    /// Which worker went silent, when the hang deadlines killed the run.
    silence: Option<Silence>,
    start: Instant,
    timeout: Option<Duration>,
    /// The RSS (bytes) at which a worker is killed (`--batch-size auto` on the CPU).
    stop_at: Option<u64>,
}

impl Workers<'_> {
    /// Reads the workers' lines until every worker closed its stdout, polling the processes
    /// between lines, so that the timeout, Ctrl-C and the hang deadlines apply meanwhile.
    fn collect(&mut self, rx: WorkerLines, progress: &Progress, label: &str) -> Result<Records> {
        let n = self.procs.len();
        let mut records =
            Records { steps: Vec::new(), summaries: vec![None; n], errors: vec![None; n] };
        loop {
            let tick = if self.stop_at.is_some() { 20 } else { 50 };
            match rx.recv_timeout(Duration::from_millis(tick)) {
                Ok((r, line)) => self.record(&mut records, r, line, progress, label),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.poll()?;
        }
        Ok(records)
    }

    /// Takes one line of worker `r`: a step, summary or error record (the step feeds the hang
    /// watch and the progress bar); any other line is printed as the worker's.
    fn record(
        &mut self,
        records: &mut Records,
        r: usize,
        line: String,
        progress: &Progress,
        label: &str,
    ) {
        let spec = self.spec;
        let n = self.procs.len();
        match serde_json::from_str::<Event>(&line) {
            Ok(Event::Step {
                rank,
                step,
                loss,
                step_ms,
                device_ms,
                grad_norm,
                loss_scale,
                skipped,
            }) => {
                self.watch.step(r, step, step_ms, Instant::now());
                if rank == 0 {
                    progress.step(label, step, spec.steps, loss, step_ms);
                }
                records.steps.push(StepRow {
                    model: spec.model.clone(),
                    config: spec.config.clone(),
                    precision: spec.precision.clone(),
                    repeat: 0,
                    phase: "timed".into(),
                    rank,
                    step,
                    loss,
                    step_ms,
                    device_ms,
                    grad_norm,
                    loss_scale,
                    skipped,
                });
            }
            Ok(Event::Summary {
                param_count,
                peak_mem_bytes,
                optimizer_bytes_per_rank,
                hw_flops_per_sample,
                mem_split,
                compile_s,
                step_launches,
            }) => {
                self.watch.done(r);
                records.summaries[r] = Some(Summary {
                    param_count,
                    peak_mem_bytes,
                    optimizer_bytes_per_rank,
                    hw_flops_per_sample,
                    compile_s,
                    mem_split,
                    step_launches,
                })
            }
            Ok(Event::Error { message, oom }) => {
                self.watch.done(r);
                records.errors[r] = Some((message, oom))
            }
            Err(_) => progress.println(&format!(
                "  worker{}: {line}",
                if n > 1 { format!(" rank {r}") } else { String::new() }
            )),
        }
    }

    /// Reaps the processes that have exited; kills every live one on Ctrl-C, on the timeout,
    /// when one went silent past the hang deadlines, or once a rank has failed and the others
    /// had PEER_GRACE to end on their own.
    fn poll(&mut self) -> Result<()> {
        for (w, p) in self.procs.iter_mut().enumerate().filter(|(_, p)| p.exit.is_none()) {
            if let Some((status, rss)) = wait4_nohang(p.pid)? {
                p.exit = Some((status, rss, Instant::now()));
                self.watch.done(w);
            }
        }
        let (procs, watch) = (&self.procs, &self.watch);
        let quiet = || watch.silent(Instant::now(), |w| is_stopped(procs[w].pid));
        let why = if INTERRUPTED.load(Ordering::SeqCst) {
            Some(Kill::Interrupt)
        } else if self.timeout.is_some_and(|t| self.start.elapsed() >= t) {
            Some(Kill::Timeout)
        } else if let Some(s) = self.killed.is_none().then(quiet).flatten() {
            self.silence = Some(s);
            Some(Kill::Hang)
        } else {
            // Sampled every 20 ms (collect): stopped here, never by the kernel's OOM killer.
            self.stop_at.and_then(|limit| {
                procs
                    .iter()
                    .filter(|p| p.exit.is_none())
                    .filter_map(|p| crate::batch_search::rss_bytes(p.pid))
                    .find(|&rss| rss >= limit)
                    .map(Kill::OverBudget)
            })
        };
        let peer_failed = procs
            .iter()
            .filter(|p| p.failed())
            .filter_map(|p| p.exit)
            .any(|(.., at)| at.elapsed() >= PEER_GRACE);
        if why.is_some() || peer_failed {
            if self.killed.is_none() {
                self.killed = why;
            }
            for p in self.procs.iter_mut().filter(|p| p.exit.is_none()) {
                // SIGKILL (which also ends a stopped process); the child is not reaped yet
                // (wait4 above), so its pid is still ours.
                kill_group(&mut p.child);
            }
        }
        Ok(())
    }

    /// Once every worker closed its stdout: reaps them, polling, so that one that lingers is
    /// still subject to the timeout, to Ctrl-C and to a failed peer.
    fn reap(&mut self) -> Result<()> {
        while self.procs.iter().any(|p| p.exit.is_none()) {
            self.poll()?;
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Each worker's stderr, once its reader thread has read it to the end (the text that
    /// explains a failure); passed through under ORTBENCH_PROFILE=1.
    fn stderr_texts(&mut self) -> Vec<String> {
        let stderr_texts: Vec<String> = self
            .procs
            .iter_mut()
            .map(|p| p.err_thread.take().and_then(|t| t.join().ok()).unwrap_or_default())
            .collect();
        // ORTBENCH_PROFILE=1: the worker prints its per-op profile on stderr, which is otherwise
        // only read for error messages; pass it through.
        if ortbench_engine::exec::profile::enabled() {
            for t in stderr_texts.iter().filter(|t| !t.is_empty()) {
                eprint!("{t}");
            }
        }
        stderr_texts
    }

    /// The run's steps and its row: its status and message from how it ended (killed, and
    /// why; ended well, and whether it trained; or failed, and which rank first), its
    /// summaries' figures when it ended well, its peak RSS on the CPU in any case.
    fn result(
        self,
        records: Records,
        stderr_texts: &[String],
        wall_s: f64,
    ) -> (Vec<StepRow>, ResultRow) {
        let Workers { spec, procs, killed, silence, timeout, stop_at, .. } = self;
        let Records { steps, summaries, errors } = records;
        let n = procs.len();
        let done_steps = steps.iter().filter(|s| s.rank == 0).count();
        let at = format!("after {done_steps}/{} steps", spec.steps);

        let mut row = base_row(spec);
        row.wall_s = Some(wall_s);
        row.final_loss = steps.iter().rfind(|s| s.rank == 0).map(|s| s.loss);
        let max_rss_kb =
            procs.iter().filter_map(|p| p.exit).map(|(_, rss, _)| rss).max().unwrap_or(0);
        if spec.device == "cpu" {
            // Peak RSS of the worker (of the largest rank process), also for runs that failed.
            row.peak_mem_bytes = Some(max_rss_kb * 1024);
        }
        let all_ok = procs.iter().all(|p| !p.failed())
            && summaries.iter().all(Option::is_some)
            && errors.iter().all(Option::is_none);
        let (status, message) = match killed {
            Some(Kill::Interrupt) => ("interrupted", format!("interrupted (Ctrl-C) {at}")),
            Some(Kill::OverBudget(rss)) => (
                "oom",
                format!(
                    "stopped by ortbench {at}: RSS {:.0} MiB reached the memory budget's stop line {:.0} MiB",
                    rss as f64 / (1u64 << 20) as f64,
                    stop_at.unwrap_or(0) as f64 / (1u64 << 20) as f64
                ),
            ),
            Some(Kill::Hang) => (
                "error",
                format!(
                    "{}; killed with its peers",
                    silence.map_or_else(|| "a worker went silent".into(), |s| s.message)
                ),
            ),
            Some(Kill::Timeout) => (
                "timeout",
                format!(
                    "no result within --timeout-s {} s: worker killed {at}",
                    timeout.map_or(0.0, |t| t.as_secs_f64())
                ),
            ),
            None if all_ok => ended_well(&mut row, &summaries, &steps, spec.warmup),
            None => {
                // The rank that failed first is the cause; the others failed because it did.
                let culprit = (0..n)
                    .filter(|&r| procs[r].failed() || errors[r].is_some())
                    .min_by_key(|&r| procs[r].exit.map(|(.., at)| at))
                    .unwrap_or(0);
                let p = &procs[culprit];
                let (wstatus, rss_kb, _) = p.exit.expect("every worker was reaped");
                let (status, message) =
                    outcome(wstatus, rss_kb, errors[culprit].clone(), &stderr_texts[culprit], &at);
                let message =
                    if n > 1 { format!("rank {culprit} of {n}: {message}") } else { message };
                (status, message)
            }
        };
        row.status = status.into();
        row.error = message;
        (steps, row)
    }
}

/// A run whose workers all ended well: its row takes their summaries' figures, and its status
/// says whether it trained.
fn ended_well(
    row: &mut ResultRow,
    summaries: &[Option<Summary>],
    steps: &[StepRow],
    warmup: usize,
) -> (&'static str, String) {
    let sums: Vec<_> = summaries.iter().flatten().collect();
    row.param_count = Some(sums[0].param_count);
    row.hw_flops_per_sample = sums[0].hw_flops_per_sample;
    row.compile_s = sums[0].compile_s;
    row.step_launches = sums[0].step_launches.clone().unwrap_or_default();
    // Per rank: the largest rank's peak and optimizer state.
    row.peak_mem_bytes = sums.iter().map(|s| s.peak_mem_bytes).max();
    // The split of the rank with that peak (its parts are that rank's).
    row.set_mem_split(
        sums.iter().max_by_key(|s| s.peak_mem_bytes).and_then(|s| s.mem_split.as_ref()),
    );
    row.optimizer_bytes_per_rank = sums.iter().map(|s| s.optimizer_bytes_per_rank).max();
    // Ended well, but did it train? Mostly skipped steps or a non-finite final loss
    // is no `ok` run.
    match crate::metrics::step_status(steps, warmup) {
        Some(why) => ("diverged", why),
        None => ("ok", String::new()),
    }
}

/// Status and message of a worker that did not end well: its own error record, else its
/// exit (a signal, an exit code), with the OOM signatures recognised.
fn outcome(
    wstatus: i32,
    maxrss_kb: u64,
    error: Option<(String, bool)>,
    stderr_text: &str,
    at: &str,
) -> (&'static str, String) {
    // The allocator's own line when it failed (a backtrace printed after it would push it out
    // of the tail), else the last lines.
    let tail = match stderr_text.lines().find(|l| is_oom_message(l)) {
        Some(line) => format!(": {}", line.trim()),
        None => stderr_tail(stderr_text),
    };
    if let Some((message, oom)) = error {
        return (if oom { "oom" } else { "error" }, message);
    }
    let signal = libc::WIFSIGNALED(wstatus).then(|| libc::WTERMSIG(wstatus));
    match signal {
        Some(libc::SIGINT) => ("interrupted", format!("interrupted (SIGINT) {at}")),
        Some(sig) => {
            let what = format!("worker killed by signal {sig} ({}) {at}{tail}", signal_name(sig));
            let limit = crate::env::memory_limit_bytes();
            let near_limit = limit.is_some_and(|l| (maxrss_kb * 1024) as f64 >= 0.8 * l as f64);
            if is_oom_message(stderr_text) {
                ("oom", what)
            } else if sig == libc::SIGKILL && near_limit {
                let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
                ("oom", format!("{what}: peak RSS {:.2} GiB of a {:.2} GiB limit (the OOM killer's signature)", gib(maxrss_kb * 1024), gib(limit.unwrap_or(0))))
            } else {
                ("error", what)
            }
        }
        None => {
            let code = if libc::WIFEXITED(wstatus) { libc::WEXITSTATUS(wstatus) } else { -1 };
            let what = format!("worker exited with code {code} {at} without a summary{tail}");
            (if is_oom_message(stderr_text) { "oom" } else { "error" }, what)
        }
    }
}

/// `waitpid(pid, WNOHANG)` with the child's resource usage: Some((wait status, peak RSS in
/// KiB)) once it has exited.
fn wait4_nohang(pid: libc::pid_t) -> Result<Option<(i32, u64)>> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid pointers to locals; pid is our own unreaped child.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            return Ok(Some((status, usage.ru_maxrss.max(0) as u64)));
        }
        if r == 0 {
            return Ok(None);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            bail!("waiting for the worker: {err}");
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGKILL => "SIGKILL",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGPIPE => "SIGPIPE",
        _ => "signal",
    }
}

/// The last lines of the worker's stderr, as ": a | b | c", or nothing.
fn stderr_tail(text: &str) -> String {
    let tail: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).rev().take(3).collect();
    if tail.is_empty() {
        String::new()
    } else {
        format!(": {}", tail.into_iter().rev().collect::<Vec<_>>().join(" | "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_failure_names_the_allocator_line_even_under_a_backtrace() {
        // What std prints with RUST_BACKTRACE=1 when an allocation fails, then SIGABRT.
        let stderr = "memory allocation of 1073741824 bytes failed\nstack backtrace:\n   0: std::alloc::rust_oom\n   1: ortbench::worker::inject\n             at ./bench/src/worker.rs:203:25\nnote: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n";
        let (status, message) = outcome(libc::SIGABRT, 0, None, stderr, "after 1/3 steps");
        assert_eq!(status, "oom");
        assert_eq!(message, "worker killed by signal 6 (SIGABRT) after 1/3 steps: memory allocation of 1073741824 bytes failed");
    }

    #[test]
    fn stderr_tail_keeps_the_last_lines() {
        assert_eq!(stderr_tail(""), "");
        assert_eq!(stderr_tail("a\nb\n\nc\nd\n"), ": b | c | d");
    }
}
