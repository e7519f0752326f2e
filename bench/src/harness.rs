//! `ortbench run`: validates the plan, runs each run in its own worker process, collects the
//! streamed records, and rewrites the tables after every run; at the end (or on Ctrl-C) it
//! writes run.json, the HTML report and prints the summary table.
//!
//! How a run ends is its `status`:
//!
//! - `ok` — the worker sent its summary and exited 0; `diverged` — ok, but its loss curve
//!   left the pytorch run's by more than `--diverge-tol` (metrics::compare_with_baseline);
//! - `timeout` — killed after `--timeout-s`; `interrupted` — killed on Ctrl-C (SIGINT), after
//!   which no further run starts;
//! - `oom` — the worker reported an out-of-memory error, or died with an allocator's or
//!   libtorch's out-of-memory message on stderr, or was killed by a SIGKILL it was not sent by
//!   us while its peak RSS was ≥ 80 % of the memory it may use (the cgroup limit, else RAM):
//!   the signature of the kernel's OOM killer;
//! - `error` — anything else, with the message, the exit code or the signal; among them a
//!   worker that went silent past the hang deadlines (`hang::StepWatch`: a stopped or hung
//!   rank), killed with its peers and named.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::cli::RunArgs;
use crate::hang::{is_stopped, HangLimits, Silence, StepWatch};
use crate::metrics::{compare_with_baseline, fill_throughput, gpu_peak, DevicePeak};
use crate::output::{write_text, ResultRow, StepRow};
use crate::progress::Progress;
use crate::results::{write_tables, RUN_JSON};
use crate::run_plan::{make_plan, parity_spec, Job, Phase, RunPlan};
use crate::run_spec::RunSpec;
use crate::worker::{is_oom_message, Event};
use ortbench_report::output::MemSplit;

/// Set by the Ctrl-C handler.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Environment variable: the CPU's fp32 peak in GFLOP/s, instead of measuring it (saves
/// about two seconds per `run`; tests use it).
pub const CPU_PEAK_VAR: &str = "ORTBENCH_CPU_PEAK_GFLOPS";

/// Returns the exit code: 0 when every run is ok, 1 when some failed or diverged, 130 when
/// interrupted.
pub fn run(args: &RunArgs) -> Result<i32> {
    let args = &args.with_quick_defaults();
    let plan = make_plan(args)?;
    let out = prepare_out_dir(args)?;
    install_ctrlc();
    let started = unix_now();
    eprintln!("ortbench: {} run(s): {}", plan.runs.len(), plan.settings);
    if args.quick {
        eprintln!("ortbench: --quick: a first look — three short repeats give wide intervals and a small batch weighs per-step costs more; drop --quick for the full measurement");
    }
    eprintln!("ortbench: writing {}", out.display());
    let device = plan.runs.first().map(|r| r.device.clone()).unwrap_or_else(|| "cpu".into());
    let mut peak = device_peak(&device);
    eprintln!("ortbench: MFU against {}", describe_peak(&peak));
    let environment = crate::env::collect();
    let torch_compile = plan
        .runs
        .iter()
        .any(|r| r.config == crate::torch_compile::CONFIG)
        .then(crate::torch_compile::describe);
    let meta = |peak: &DevicePeak,
                finished: Option<f64>,
                interrupted: bool,
                results: &[ResultRow]| {
        json!({
            "ortbench_version": env!("CARGO_PKG_VERSION"),
            "command": std::env::args().collect::<Vec<_>>(),
            "command_line": command_line(),
            "cwd": std::env::current_dir().ok(),
            "seed": args.seed,
            "settings": plan.settings,
            "diverge_tol": args.diverge_tol,
            "timeout_s": args.timeout_s,
            "started_at": iso_time(started),
            "finished_at": finished.map(iso_time),
            "interrupted": interrupted,
            "runs_planned": plan.runs.len(),
            "runs_recorded": results.len(),
            "peak": peak,
            "flops": "model FLOPs (MFU): training = 3 × forward matmul FLOPs, counted per layer (attention incl. T² terms, MLP, LM head on every position); see metrics::train_flops_per_sample. Hardware FLOPs (HFU): the GEMM and attention products the engine executed (rows a loss ignores skipped: 'row skip'), the model FLOPs for pytorch",
            "repeat": args.repeat.unwrap_or(3),
            "quick": args.quick,
            "parity": { "steps": args.parity_steps(), "lr": args.parity_lr, "dropout": 0.0, "tolerance": args.diverge_tol.map_or("from the precision (metrics::parity_tol)".to_string(), |t| t.to_string()) },
            "environment": environment,
            "torch_compile": torch_compile,
            "runs": plan.runs,
            "step_launches": step_launches(results),
        })
    };
    let mut steps: Vec<StepRow> = Vec::new();
    let mut results: Vec<ResultRow> = Vec::new();
    write_text(
        &out.join(RUN_JSON),
        &serde_json::to_string_pretty(&meta(&peak, None, false, &results))?,
    )?;
    write_tables(&out, &results, &steps)?;

    let mut interrupted = run_jobs(args, &plan, &out, &peak, &mut steps, &mut results)?;
    // --batch-size auto: each config's largest batch, after the fixed-batch comparison.
    let mut batch_search = Vec::new();
    let mut search_failed = false;
    if let (Some(auto), false) = (&plan.auto_batch, interrupted) {
        (interrupted, search_failed) =
            search_batches(auto, &plan, args, &mut results, &mut steps, &out, &mut batch_search)?;
    }
    if interrupted {
        eprintln!(
            "ortbench: interrupted: kept the {} run(s) recorded; writing the report",
            results.len()
        );
    } else if let Some(again) = remeasure_cpu_peak(&peak) {
        // A machine shared with other work measures low; noise only ever slows a GEMM down,
        // so the best of the two measurements is the better figure.
        peak = again;
        for r in results.iter_mut() {
            r.gemm_peak_tflops = peak.gemm_fp32;
        }
        write_tables(&out, &results, &steps)?;
    }
    say_utilisation_past_peak(&results, &peak);
    let mut meta_json = meta(&peak, Some(unix_now()), interrupted, &results);
    if let Some(auto) = &plan.auto_batch {
        meta_json["batch_search"] = json!({ "budget": auto, "stop_line_bytes": auto.stop_bytes(), "configs": batch_search });
    }
    write_text(&out.join(RUN_JSON), &serde_json::to_string_pretty(&meta_json)?)?;
    let index = crate::report::write_report(&out)?;
    println!("{}", crate::report::table::summary_table(&results));
    eprintln!("ortbench: results in {}, report {}", out.display(), index.display());
    Ok(if interrupted {
        130
    } else if results.iter().all(|r| r.status == "ok") && !search_failed {
        0
    } else {
        1
    })
}

/// The plan's jobs in order, each worker's steps and the results (aggregated per spec,
/// compared with the baseline) written after every job; true when interrupted.
fn run_jobs(
    args: &RunArgs,
    plan: &RunPlan,
    out: &Path,
    peak: &DevicePeak,
    steps: &mut Vec<StepRow>,
    results: &mut Vec<ResultRow>,
) -> Result<bool> {
    let mut interrupted = false;
    // Per spec: its finished runs (repeat, per-run row) and its parity probe.
    let mut timed: Vec<Vec<ResultRow>> = vec![Vec::new(); plan.runs.len()];
    let mut probes: Vec<Option<ResultRow>> = vec![None; plan.runs.len()];
    let progress = Progress::new(plan.jobs.len());
    for (i, job) in plan.jobs.iter().enumerate() {
        if INTERRUPTED.load(Ordering::SeqCst) {
            interrupted = true;
            break;
        }
        let base = &plan.runs[job.spec];
        let spec = match job.phase {
            Phase::Timed => base.clone(),
            Phase::Parity => parity_spec(base, args.parity_steps(), args.parity_lr),
        };
        let label = job_label(args, job, &spec);
        progress.start_run(i, &label, spec.steps);
        let timeout = args.timeout_s.map(Duration::from_secs_f64);
        let (mut run_steps, row) =
            execute(&spec, timeout, hang_limits(args), &progress, &label, None)?;
        for s in run_steps.iter_mut() {
            s.repeat = job.repeat;
            s.phase = job.phase.name().into();
        }
        progress.end_run(&row.status, &row.error);
        interrupted |= row.status == "interrupted";
        steps.extend(run_steps);
        match job.phase {
            Phase::Timed => timed[job.spec].push(row),
            Phase::Parity => probes[job.spec] = Some(row),
        }
        *results = (0..plan.runs.len())
            .filter(|&k| !timed[k].is_empty() || probes[k].is_some())
            .map(|k| {
                aggregate(
                    &plan.runs[k],
                    &timed[k],
                    probes[k].as_ref(),
                    steps,
                    plan.train_flops_per_sample.get(k).copied(),
                    peak,
                )
            })
            .collect();
        compare_with_baseline(results, steps, args.diverge_tol);
        write_tables(out, results, steps)?;
        if interrupted {
            break;
        }
    }
    progress.finish();
    Ok(interrupted)
}

/// The progress line's name of a job: model · config · precision (· ranks) (· run or probe).
fn job_label(args: &RunArgs, job: &Job, spec: &RunSpec) -> String {
    let what = match job.phase {
        Phase::Parity => " · parity probe".to_string(),
        Phase::Timed if args.repeat.unwrap_or(3) > 1 => format!(" · run {}", job.repeat + 1),
        Phase::Timed => String::new(),
    };
    format!(
        "{} · {} · {}{}{what}",
        spec.model,
        spec.config,
        spec.precision,
        if spec.ranks > 1 { format!(" · {} ranks", spec.ranks) } else { String::new() }
    )
}

/// One row of results.csv from a spec's runs: the first failure's status and message (a
/// failed parity probe is an `error` naming it), step times pooled over the runs that
/// finished, the largest peak memory, the engine's executed FLOPs averaged over the runs.
fn aggregate(
    spec: &RunSpec,
    timed: &[ResultRow],
    probe: Option<&ResultRow>,
    steps: &[StepRow],
    flops: Option<f64>,
    peak: &DevicePeak,
) -> ResultRow {
    let mut row = base_row(spec);
    row.repeats = timed.len();
    row.train_flops_per_sample = flops;
    row.gemm_peak_tflops = peak.gemm_fp32;
    let ok: Vec<&ResultRow> = timed.iter().filter(|r| r.status == "ok").collect();
    let failed = timed.iter().find(|r| r.status != "ok");
    (row.status, row.error) = match (failed, probe) {
        (Some(f), _) => (f.status.clone(), f.error.clone()),
        (None, Some(p)) if p.status != "ok" => {
            let status = if p.status == "interrupted" { "interrupted" } else { "error" };
            (status.into(), format!("parity probe ({}): {}", p.status, p.error))
        }
        _ => ("ok".into(), String::new()),
    };
    if timed.is_empty() && row.status == "ok" {
        // Only the probe ran so far (or the plan was cut short).
        row.status = "interrupted".into();
        row.error = "no timed run finished".into();
    }
    let first = timed.first().or(probe);
    row.param_count = first.and_then(|r| r.param_count);
    row.optimizer_bytes_per_rank = first.and_then(|r| r.optimizer_bytes_per_rank);
    row.step_launches = first.map(|r| r.step_launches.clone()).unwrap_or_default();
    // The split of the timed run with that peak: a torch config's activations are what that
    // run's peak leaves.
    let peak_run =
        timed.iter().filter(|r| r.peak_mem_bytes.is_some()).max_by_key(|r| r.peak_mem_bytes);
    row.set_mem_split(peak_run.map(|r| r.mem_split()).as_ref().filter(|s| !s.source.is_empty()));
    row.final_loss = timed.first().and_then(|r| r.final_loss);
    row.peak_mem_bytes = timed.iter().filter_map(|r| r.peak_mem_bytes).max();
    row.wall_s = Some(timed.iter().chain(probe).filter_map(|r| r.wall_s).sum());
    // Compilation (torch-compile): the median over the runs; each run compiled afresh.
    let mut compile: Vec<f64> = ok.iter().filter_map(|r| r.compile_s).collect();
    compile.sort_by(f64::total_cmp);
    row.compile_s = (!compile.is_empty()).then(|| crate::metrics::percentile(&compile, 0.5));
    // The baselines compute every row of every product: their hardware FLOPs are the model's.
    let hw: Vec<f64> = ok.iter().filter_map(|r| r.hw_flops_per_sample).collect();
    row.hw_flops_per_sample =
        if spec.config == "pytorch" || spec.config == crate::torch_compile::CONFIG {
            flops
        } else {
            (!hw.is_empty()).then(|| hw.iter().sum::<f64>() / hw.len() as f64)
        };
    if !ok.is_empty() {
        let pooled: Vec<f64> = crate::metrics::timed_runs(steps, &row).concat();
        fill_throughput(&mut row, &pooled, peak.for_precision(&spec.precision));
    }
    row
}

/// `--batch-size auto`: per spec, the largest batch within the budget ([`crate::batch_search`]),
/// its probes and run stopped at the budget's stop line on the CPU. The run's throughput and
/// measured peak go on the spec's fixed-batch row (the `max_batch_*` columns), its steps into
/// the steps table as phase `max-batch`, every batch tried into `log` (run.json). Returns
/// (interrupted, some search stopped on a failure other than memory).
fn search_batches(
    auto: &crate::batch_search::AutoBatch,
    plan: &crate::run_plan::RunPlan,
    args: &RunArgs,
    results: &mut [ResultRow],
    steps: &mut Vec<StepRow>,
    out: &Path,
    log: &mut Vec<serde_json::Value>,
) -> Result<(bool, bool)> {
    use crate::batch_search::{search, Purpose};
    // Probes and runs are held to --timeout-s and the hang limits as every run is.
    let (timeout, hang) = (args.timeout_s.map(Duration::from_secs_f64), hang_limits(args));
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    // On a GPU the budget is the device's memory: a probe's out-of-memory error answers.
    let stop = plan.runs.first().filter(|r| r.device == "cpu").map(|_| auto.stop_bytes());
    eprintln!(
        "ortbench: --batch-size auto: per config the largest batch whose peak stays under {:.0} MiB ({:.0} % of the {:.0} MiB budget; {})",
        mib(auto.stop_bytes()),
        crate::batch_search::STOP_SHARE * 100.0,
        mib(auto.budget_bytes),
        auto.source
    );
    let progress = Progress::new(plan.runs.len());
    let mut failed = false;
    for (k, spec) in plan.runs.iter().enumerate() {
        if INTERRUPTED.load(Ordering::SeqCst) {
            progress.finish();
            return Ok((true, failed));
        }
        let name = format!("{} · {} · {}", spec.model, spec.config, spec.precision);
        progress.start_run(k, &format!("{name} · largest batch"), 0);
        let mut run = |s: &RunSpec, purpose: Purpose| {
            let what = if purpose == Purpose::Probe { "probe" } else { "run" };
            let label = format!("{name} · batch {} {what}", s.batch_size);
            progress.println(&format!("  {label}"));
            let r = execute(s, timeout, hang, &progress, &label, stop);
            if let Ok((_, row)) = &r {
                let peak = row.peak_mem_bytes.map_or("-".into(), |p| format!("{:.0} MiB", mib(p)));
                progress.println(&format!("    {}: peak {peak} {}", row.status, row.error));
            }
            r
        };
        let outcome = search(spec, auto, &mut run)?;
        let row = results.iter_mut().find(|r| {
            (r.model.as_str(), r.config.as_str(), r.precision.as_str(), r.ranks)
                == (spec.model.as_str(), spec.config.as_str(), spec.precision.as_str(), spec.ranks)
        });
        if let Some(row) = row {
            row.memory_budget_bytes = Some(auto.budget_bytes);
            row.max_batch_search = outcome.log();
            if let (Some(b), Some((run_steps, run_row))) = (outcome.batch, &outcome.run) {
                let mut at = run_row.clone();
                crate::metrics::fill_throughput(
                    &mut at,
                    &crate::metrics::step_times(run_steps, spec.warmup),
                    None,
                );
                row.max_batch_size = Some(b);
                row.max_batch_samples_per_s = at.samples_per_s;
                row.max_batch_tokens_per_s = at.tokens_per_s;
                row.max_batch_peak_mem_bytes = run_row.peak_mem_bytes;
            }
        }
        if let Some((run_steps, _)) = &outcome.run {
            steps.extend(run_steps.iter().cloned().map(|mut s| {
                s.phase = "max-batch".into();
                s
            }));
        }
        let status = match (&outcome.error, outcome.batch) {
            (Some(e), _) => {
                failed |= !INTERRUPTED.load(Ordering::SeqCst);
                ("error", format!("batch search stopped: {e}"))
            }
            (None, Some(b)) => {
                progress.println(&format!("  {name}: largest batch {b} ({})", outcome.log()));
                ("ok", String::new())
            }
            (None, None) => ("none fits", format!("not even batch 1 fits ({})", outcome.log())),
        };
        progress.end_run(status.0, &status.1);
        log.push(json!({
            "model": spec.model,
            "config": spec.config,
            "precision": spec.precision,
            "ranks": spec.ranks,
            "outcome": outcome,
        }));
        write_tables(out, results, steps)?;
    }
    progress.finish();
    Ok((INTERRUPTED.load(Ordering::SeqCst), failed))
}

/// Ctrl-C stops the current worker and the plan (the run loop polls the flag); a second
/// Ctrl-C exits at once (every file on disk is complete: each is replaced by a rename).
fn install_ctrlc() {
    let _ = ctrlc::set_handler(|| {
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
    });
}

/// Rows past the theoretical peak: a warning when what ran (HFU) passes it — one of the peak's
/// inputs is wrong —, a note when only MFU does (the model's FLOPs as HF computes them, more
/// than a config that skips work ran).
fn say_utilisation_past_peak(results: &[ResultRow], peak: &DevicePeak) {
    for r in results {
        let (mfu, hfu) = (r.mfu.unwrap_or(0.0), r.hfu.unwrap_or(0.0));
        if hfu > 1.0 || (r.hfu.is_none() && mfu > 1.0) {
            // The peak is an upper bound by construction; past it with the FLOPs that ran, one
            // of its inputs is wrong.
            eprintln!("ortbench: warning: {} {} executes {:.0} % of the theoretical peak: the peak's inputs ({}) are too low", r.model, r.config, 100.0 * hfu.max(mfu), peak.source);
        } else if mfu > 1.0 {
            // MFU counts the model's FLOPs as HF computes them; a config that skips work (the
            // MLM head's unlabelled rows, masked causal blocks) can pass 100 % with them while
            // what ran (HFU) does not.
            eprintln!("ortbench: note: {} {}: MFU {:.0} % counts the model's FLOPs as HF computes them (the LM head over every position); this config ran fewer (HFU {:.0} %: the work it skips, such as the MLM head's unlabelled rows, README \"row skip\")", r.model, r.config, 100.0 * mfu, 100.0 * hfu);
        }
    }
}

/// The device's peak: on the CPU the theoretical peak of the cores the runs use
/// ([`crate::cpu_peak`]), with the best fp32 GEMM of the engine's provider measured beside it
/// (a separate column); the data-sheet table of known GPUs otherwise.
fn device_peak(device: &str) -> DevicePeak {
    if device == "cpu" {
        let threads = ortbench_engine::backend::cpu::gemm::num_threads();
        let theory = crate::cpu_peak::cpu_peak(threads);
        let (gemm, gemm_source) = match std::env::var(CPU_PEAK_VAR)
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
        {
            Some(g) => (Some(g / 1e3), format!("given: {CPU_PEAK_VAR}={g}")),
            None => {
                eprintln!("ortbench: measuring the CPU's best fp32 GEMM ({threads} threads, ~2 s)");
                match crate::cpu_peak::measure_peak_gflops(0) {
                    Ok(g) => {
                        let provider = ortbench_engine::backend::cpu::gemm::provider()
                            .map(|p| p.kind().name())
                            .unwrap_or("?");
                        (Some(g / 1e3), format!("measured: best fp32 sgemm 8192×768×3072 on {threads} threads ({provider})"))
                    }
                    Err(e) => (None, format!("not measured: {e}")),
                }
            }
        };
        DevicePeak {
            device: "cpu".into(),
            fp32: Some(theory.fp32),
            fp16: Some(theory.fp16),
            bf16: Some(theory.bf16),
            source: format!("theoretical: {}", theory.formula),
            gemm_fp32: gemm,
            gemm_source: Some(gemm_source),
            inputs: Some(theory),
        }
    } else {
        let index = device.strip_prefix("cuda:").and_then(|i| i.parse::<usize>().ok()).unwrap_or(0);
        let names = crate::env::gpu_names();
        let none = |device: String, source: String| DevicePeak {
            device,
            fp32: None,
            fp16: None,
            bf16: None,
            source,
            gemm_fp32: None,
            gemm_source: None,
            inputs: None,
        };
        match names.get(index) {
            Some(name) => gpu_peak(name).unwrap_or_else(|| {
                none(name.clone(), format!("'{name}' is not in the table of known GPUs: no MFU"))
            }),
            None => {
                none(device.into(), "no GPU name (nvidia-smi / rocm-smi not found): no MFU".into())
            }
        }
    }
}

/// On the CPU (unless the GEMM figure was given), measures the best GEMM again after the
/// runs; Some when it came out higher than before.
fn remeasure_cpu_peak(first: &DevicePeak) -> Option<DevicePeak> {
    if first.device != "cpu"
        || !first.gemm_source.as_deref().is_some_and(|s| s.starts_with("measured"))
    {
        return None;
    }
    let g = crate::cpu_peak::measure_peak_gflops(0).ok()? / 1e3;
    if g <= first.gemm_fp32.unwrap_or(0.0) {
        return None;
    }
    eprintln!("ortbench: the best GEMM measured after the runs is higher ({g:.3} TFLOP/s)");
    Some(DevicePeak {
        gemm_fp32: Some(g),
        gemm_source: first
            .gemm_source
            .as_ref()
            .map(|s| format!("{s} (best of a measurement before and one after the runs)")),
        ..first.clone()
    })
}

fn describe_peak(p: &DevicePeak) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |t| format!("{t:.2}"));
    let gemm =
        p.gemm_fp32.map_or(String::new(), |g| format!("; best measured fp32 GEMM {g:.3} TFLOP/s"));
    format!(
        "{} peak fp32 {} / fp16 {} / bf16 {} TFLOP/s ({}){gemm}",
        p.device,
        f(p.fp32),
        f(p.fp16),
        f(p.bf16),
        p.source
    )
}

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

/// The hang deadlines the user gave.
fn hang_limits(args: &RunArgs) -> HangLimits {
    HangLimits { first_step_s: args.first_step_deadline_s, step_floor_s: args.hang_deadline_s }
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
fn execute(
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

/// The engine on a GPU, for run.json: each run's step captured as a CUDA graph and replayed,
/// or launched kernel by kernel and why (results' `step_launches`).
fn step_launches(results: &[ResultRow]) -> serde_json::Value {
    let runs = results.iter().filter(|r| !r.step_launches.is_empty());
    runs.map(|r| json!({ "model": r.model, "config": r.config, "precision": r.precision, "ranks": r.ranks, "how": r.step_launches }))
        .collect()
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

fn base_row(spec: &RunSpec) -> ResultRow {
    ResultRow {
        model: spec.model.clone(),
        task: spec.task_name.clone(),
        config: spec.config.clone(),
        precision: spec.precision.clone(),
        device: spec.device.clone(),
        batch_size: spec.batch_size,
        seq_len: spec.seq_len,
        ranks: spec.ranks,
        steps: spec.steps,
        warmup: spec.warmup,
        repeats: 1,
        ..Default::default()
    }
}

fn prepare_out_dir(args: &RunArgs) -> Result<PathBuf> {
    let out = match &args.out {
        Some(p) => p.clone(),
        None => Path::new("reports").join(run_id()),
    };
    let existed = out.exists();
    if existed {
        if !out.is_dir() {
            bail!("--out {}: exists and is not a directory", out.display());
        }
        let non_empty = std::fs::read_dir(&out).map(|mut d| d.next().is_some()).unwrap_or(false);
        if non_empty && !args.force {
            bail!("--out {}: directory is not empty (use --force to write into it)", out.display());
        }
    }
    std::fs::create_dir_all(&out)
        .with_context(|| format!("--out {}: cannot create", out.display()))?;
    // Probe writability now rather than after the first run; leave nothing behind.
    let probe = out.join(".ortbench-write-test");
    if let Err(e) = std::fs::write(&probe, b"") {
        if !existed {
            let _ = std::fs::remove_dir(&out);
        }
        bail!("--out {}: not writable: {e}", out.display());
    }
    let _ = std::fs::remove_file(probe);
    Ok(out)
}

/// The command as one shell line, quoted where needed.
fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if !a.is_empty()
                && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+%".contains(c))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// (year, month, day, hour, minute, second) in UTC of a Unix time (H. Hinnant's algorithm).
fn civil(secs: u64) -> (i64, i64, i64, u64, u64, u64) {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// e.g. 2026-11-21T07:35:12Z
fn iso_time(secs: f64) -> String {
    let (y, m, d, hh, mm, ss) = civil(secs as u64);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

/// UTC timestamp, e.g. 20261121-073512.
fn run_id() -> String {
    let (y, m, d, hh, mm, ss) = civil(unix_now() as u64);
    format!("{y:04}{m:02}{d:02}-{hh:02}{mm:02}{ss:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc() {
        assert_eq!(iso_time(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_time(1_709_210_096.0), "2024-02-29T12:34:56Z");
    }

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
