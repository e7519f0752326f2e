//! `ortbench run`: validates the plan, runs each run in its own worker process, collects the
//! streamed records, and writes steps.csv / results.csv after every run.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::cli::RunArgs;
use crate::output::{write_csv, write_text, ResultRow, StepRow, RESULT_COLUMNS, STEP_COLUMNS};
use crate::plan::make_plan;
use crate::spec::RunSpec;
use crate::worker::{is_oom_message, Event};

/// Returns the exit code: 0 when every run finished, 1 when some failed.
pub fn run(args: &RunArgs) -> Result<i32> {
    let plan = make_plan(args)?;
    let out = prepare_out_dir(args)?;
    eprintln!("ortbench: {} run(s): {}", plan.runs.len(), plan.settings);
    eprintln!("ortbench: writing {}", out.display());
    let command_line: Vec<String> = std::env::args().collect();
    write_text(
        &out.join("run.json"),
        &serde_json::to_string_pretty(&serde_json::json!({
            "command": command_line,
            "ortbench_version": env!("CARGO_PKG_VERSION"),
            "settings": plan.settings,
            "runs": plan.runs,
        }))?,
    )?;

    let mut steps: Vec<StepRow> = Vec::new();
    let mut results: Vec<ResultRow> = Vec::new();
    write_csv(&out.join("steps.csv"), &steps, STEP_COLUMNS)?;
    write_csv(&out.join("results.csv"), &results, RESULT_COLUMNS)?;
    let n = plan.runs.len();
    for (i, spec) in plan.runs.iter().enumerate() {
        eprintln!("[{}/{n}] {} · {} · {}", i + 1, spec.model, spec.config, spec.precision);
        let (run_steps, row) = execute(spec)?;
        if row.status != "ok" {
            eprintln!("  {}: {}", row.status, row.error);
        }
        steps.extend(run_steps);
        results.push(row);
        write_csv(&out.join("steps.csv"), &steps, STEP_COLUMNS)?;
        write_csv(&out.join("results.csv"), &results, RESULT_COLUMNS)?;
    }
    print_summary(&results);
    eprintln!("ortbench: results in {}", out.display());
    Ok(if results.iter().all(|r| r.status == "ok") { 0 } else { 1 })
}

/// Runs one spec in a worker process and turns its records into rows.
fn execute(spec: &RunSpec) -> Result<(Vec<StepRow>, ResultRow)> {
    let exe = std::env::current_exe().context("cannot find the ortbench executable")?;
    let mut child = Command::new(exe)
        .arg("worker")
        .arg("--spec")
        .arg(serde_json::to_string(spec)?)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start a worker process")?;
    let mut stderr = child.stderr.take().expect("piped");
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut steps = Vec::new();
    let mut summary = None;
    let mut error: Option<(String, bool)> = None;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let Ok(line) = line else { break };
        match serde_json::from_str::<Event>(&line) {
            Ok(Event::Step { rank, step, loss, step_ms, grad_norm, loss_scale, skipped }) => {
                if rank == 0 {
                    eprintln!("  step {:>3}/{}  loss {loss:.4}  {step_ms:>9.1} ms", step + 1, spec.steps);
                }
                steps.push(StepRow {
                    model: spec.model.clone(),
                    config: spec.config.clone(),
                    precision: spec.precision.clone(),
                    rank,
                    step,
                    loss,
                    step_ms,
                    grad_norm,
                    loss_scale,
                    skipped,
                });
            }
            Ok(Event::Summary { param_count, peak_mem_bytes, optimizer_bytes_per_rank }) => {
                summary = Some((param_count, peak_mem_bytes, optimizer_bytes_per_rank))
            }
            Ok(Event::Error { message, oom }) => error = Some((message, oom)),
            Err(_) => eprintln!("  worker: {line}"),
        }
    }
    let status = child.wait().context("waiting for the worker")?;
    let stderr_text = err_thread.join().unwrap_or_default();
    let mut row = metrics(spec, &steps);
    match (summary, error, status.success()) {
        (Some((params, peak, opt_bytes)), None, true) => {
            row.status = "ok".into();
            row.param_count = Some(params);
            row.peak_mem_bytes = Some(peak);
            row.optimizer_bytes_per_rank = Some(opt_bytes);
        }
        (_, Some((message, oom)), _) => {
            row.status = if oom { "oom" } else { "error" }.into();
            row.error = message;
        }
        _ => {
            let tail: Vec<&str> = stderr_text.lines().rev().take(3).collect();
            let detail = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
            row.status = if is_oom_message(&stderr_text) { "oom" } else { "error" }.into();
            row.error = format!("worker exited with {status}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") });
        }
    }
    Ok((steps, row))
}

/// Throughput and step-time statistics over the steps after warm-up. A step lasts as long as
/// its slowest rank; it trains batch_size × ranks samples.
fn metrics(spec: &RunSpec, steps: &[StepRow]) -> ResultRow {
    let mut per_step: std::collections::BTreeMap<usize, f64> = std::collections::BTreeMap::new();
    for s in steps.iter().filter(|s| s.step >= spec.warmup) {
        let e = per_step.entry(s.step).or_insert(0.0);
        *e = e.max(s.step_ms);
    }
    let mut measured: Vec<f64> = per_step.into_values().collect();
    measured.sort_by(f64::total_cmp);
    let (median, p90, sps) = if measured.is_empty() {
        (None, None, None)
    } else {
        let total_s: f64 = measured.iter().sum::<f64>() / 1e3;
        let samples = (spec.batch_size * spec.ranks * measured.len()) as f64;
        (Some(percentile(&measured, 0.5)), Some(percentile(&measured, 0.9)), Some(samples / total_s))
    };
    ResultRow {
        model: spec.model.clone(),
        config: spec.config.clone(),
        precision: spec.precision.clone(),
        device: spec.device.clone(),
        batch_size: spec.batch_size,
        seq_len: spec.seq_len,
        ranks: spec.ranks,
        steps: spec.steps,
        warmup: spec.warmup,
        status: String::new(),
        samples_per_s: sps,
        tokens_per_s: sps.map(|s| s * spec.seq_len as f64),
        step_ms_median: median,
        step_ms_p90: p90,
        peak_mem_bytes: None,
        param_count: None,
        optimizer_bytes_per_rank: None,
        final_loss: steps.iter().filter(|s| s.rank == 0).last().map(|s| s.loss),
        error: String::new(),
    }
}

/// Linear-interpolated percentile of sorted values (numpy's default).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn prepare_out_dir(args: &RunArgs) -> Result<PathBuf> {
    let out = match &args.out {
        Some(p) => p.clone(),
        None => Path::new("reports").join(run_id()),
    };
    if out.exists() {
        if !out.is_dir() {
            bail!("--out {}: exists and is not a directory", out.display());
        }
        let non_empty = std::fs::read_dir(&out).map(|mut d| d.next().is_some()).unwrap_or(false);
        if non_empty && !args.force {
            bail!("--out {}: directory is not empty (use --force to write into it)", out.display());
        }
    }
    std::fs::create_dir_all(&out).with_context(|| format!("--out {}: cannot create", out.display()))?;
    // Probe writability now rather than after the first run.
    let probe = out.join(".ortbench-write-test");
    std::fs::write(&probe, b"").with_context(|| format!("--out {}: not writable", out.display()))?;
    let _ = std::fs::remove_file(probe);
    Ok(out)
}

/// UTC timestamp, e.g. 20261121-073512.
fn run_id() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn print_summary(rows: &[ResultRow]) {
    println!(
        "{:<14} {:<10} {:<6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10}  status",
        "model", "config", "prec", "ranks", "samples/s", "tokens/s", "step ms", "peak MiB", "optim MiB/rk", "loss"
    );
    let f = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |x| format!("{x:.p$}"));
    for r in rows {
        println!(
            "{:<14} {:<10} {:<6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10}  {}",
            r.model,
            r.config,
            r.precision,
            r.ranks,
            f(r.samples_per_s, 2),
            f(r.tokens_per_s, 0),
            f(r.step_ms_median, 1),
            r.peak_mem_bytes.map_or("-".into(), |b| format!("{:.0}", b as f64 / (1 << 20) as f64)),
            r.optimizer_bytes_per_rank.map_or("-".into(), |b| format!("{:.1}", b as f64 / (1 << 20) as f64)),
            f(r.final_loss, 4),
            r.status
        );
    }
}
