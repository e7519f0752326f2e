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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::cli::RunArgs;
use crate::hang::HangLimits;
use crate::metrics::{compare_with_baseline, fill_throughput, DevicePeak};
use crate::output::{write_text, ResultRow, StepRow};
use crate::progress::Progress;
use crate::results::{write_tables, RUN_JSON};
use crate::run_plan::{make_plan, parity_spec, Job, Phase, RunPlan};
use crate::run_spec::RunSpec;

mod peak;
mod workers;

use peak::{describe_peak, device_peak, remeasure_cpu_peak, say_utilisation_past_peak};
use workers::execute;

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

/// The hang deadlines the user gave.
fn hang_limits(args: &RunArgs) -> HangLimits {
    HangLimits { first_step_s: args.first_step_deadline_s, step_floor_s: args.hang_deadline_s }
}

/// The engine on a GPU, for run.json: each run's step captured as a CUDA graph and replayed,
/// or launched kernel by kernel and why (results' `step_launches`).
fn step_launches(results: &[ResultRow]) -> serde_json::Value {
    let runs = results.iter().filter(|r| !r.step_launches.is_empty());
    runs.map(|r| json!({ "model": r.model, "config": r.config, "precision": r.precision, "ranks": r.ranks, "how": r.step_launches }))
        .collect()
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
}
