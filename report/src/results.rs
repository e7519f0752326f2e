//! A run's tables as Polars DataFrames: written as Parquet + CSV (atomically: a temporary
//! file, then a rename), and read back by [`load_run`] — what notebooks use:
//!
//! ```no_run
//! let run = ortbench_report::results::load_run("reports/20261121-074006").unwrap();
//! println!("{}", run.results);
//! ```

use std::fs::File;
use std::path::Path;

use anyhow::{bail, Context, Result};
use polars::prelude::*;

use crate::output::{tmp_path, ResultRow, StepRow};

pub const RESULTS_PARQUET: &str = "results.parquet";
pub const RESULTS_CSV: &str = "results.csv";
pub const STEPS_PARQUET: &str = "steps.parquet";
pub const STEPS_CSV: &str = "steps.csv";
pub const RUN_JSON: &str = "run.json";

/// A run directory read back.
pub struct Run {
    /// One row per run of the plan (columns: `output::RESULT_COLUMNS`).
    pub results: DataFrame,
    /// One row per (run, rank, step) (columns: `output::STEP_COLUMNS`).
    pub steps: DataFrame,
    /// run.json: the environment, the command, the plan.
    pub env: serde_json::Value,
}

impl Run {
    pub fn result_rows(&self) -> Result<Vec<ResultRow>> {
        result_rows(&self.results)
    }
    pub fn step_rows(&self) -> Result<Vec<StepRow>> {
        step_rows(&self.steps)
    }
}

/// Reads a run directory written by `ortbench run`.
pub fn load_run(dir: impl AsRef<Path>) -> Result<Run> {
    let dir = dir.as_ref();
    if !dir.is_dir() {
        bail!("{}: no such directory", dir.display());
    }
    for f in [RESULTS_PARQUET, STEPS_PARQUET, RUN_JSON] {
        if !dir.join(f).is_file() {
            bail!(
                "{}: not an ortbench run directory (no {f}; `ortbench run --out DIR` makes one)",
                dir.display()
            );
        }
    }
    let read = |name: &str| -> Result<DataFrame> {
        let path = dir.join(name);
        let file = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
        ParquetReader::new(file)
            .finish()
            .map_err(anyhow::Error::from)
            .with_context(|| format!("{}: not a valid Parquet file", path.display()))
    };
    let env_path = dir.join(RUN_JSON);
    let env_text = std::fs::read_to_string(&env_path)
        .with_context(|| format!("cannot read {}", env_path.display()))?;
    let env = serde_json::from_str(&env_text)
        .with_context(|| format!("{}: not valid JSON", env_path.display()))?;
    Ok(Run { results: read(RESULTS_PARQUET)?, steps: read(STEPS_PARQUET)?, env })
}

/// Writes both tables (Parquet + CSV) into `dir`.
pub fn write_tables(dir: &Path, results: &[ResultRow], steps: &[StepRow]) -> Result<()> {
    let mut r = results_frame(results)?;
    let mut s = steps_frame(steps)?;
    write_frame(&mut s, &dir.join(STEPS_PARQUET), &dir.join(STEPS_CSV))?;
    write_frame(&mut r, &dir.join(RESULTS_PARQUET), &dir.join(RESULTS_CSV))
}

/// Writes the steps table alone (Parquet + CSV) into `dir` (`ortbench train`'s log).
pub fn write_steps(dir: &Path, steps: &[StepRow]) -> Result<()> {
    let mut s = steps_frame(steps)?;
    write_frame(&mut s, &dir.join(STEPS_PARQUET), &dir.join(STEPS_CSV))
}

/// Writes `df` as Parquet and CSV, each atomically (a temporary file, then a rename).
pub fn write_frame(df: &mut DataFrame, parquet: &Path, csv: &Path) -> Result<()> {
    let tmp = tmp_path(parquet);
    {
        let f = File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
        ParquetWriter::new(f)
            .finish(df)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
    }
    std::fs::rename(&tmp, parquet)
        .with_context(|| format!("cannot write {}", parquet.display()))?;
    let tmp = tmp_path(csv);
    {
        let mut f =
            File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
        CsvWriter::new(&mut f)
            .finish(df)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
    }
    std::fs::rename(&tmp, csv).with_context(|| format!("cannot write {}", csv.display()))
}

fn col<T, P: ?Sized>(name: &str, values: T) -> Column
where
    Series: NamedFrom<T, P>,
{
    Column::new(name.into(), values)
}

pub fn results_frame(rows: &[ResultRow]) -> Result<DataFrame> {
    let s =
        |f: fn(&ResultRow) -> &String| rows.iter().map(|r| f(r).clone()).collect::<Vec<String>>();
    let u = |f: fn(&ResultRow) -> usize| rows.iter().map(|r| f(r) as u64).collect::<Vec<u64>>();
    let f = |f: fn(&ResultRow) -> Option<f64>| rows.iter().map(f).collect::<Vec<Option<f64>>>();
    let ou = |f: fn(&ResultRow) -> Option<u64>| rows.iter().map(f).collect::<Vec<Option<u64>>>();
    let cols = vec![
        col("model", s(|r| &r.model)),
        col("task", s(|r| &r.task)),
        col("config", s(|r| &r.config)),
        col("precision", s(|r| &r.precision)),
        col("device", s(|r| &r.device)),
        col("batch_size", u(|r| r.batch_size)),
        col("seq_len", u(|r| r.seq_len)),
        col("ranks", u(|r| r.ranks)),
        col("steps", u(|r| r.steps)),
        col("warmup", u(|r| r.warmup)),
        col("repeats", u(|r| r.repeats)),
        col("status", s(|r| &r.status)),
        col("samples_per_s", f(|r| r.samples_per_s)),
        col("tokens_per_s", f(|r| r.tokens_per_s)),
        col("speedup", f(|r| r.speedup)),
        col("speedup_lo", f(|r| r.speedup_lo)),
        col("speedup_hi", f(|r| r.speedup_hi)),
        col(
            "speedup_significant",
            rows.iter().map(|r| r.speedup_significant).collect::<Vec<Option<bool>>>(),
        ),
        col("speedup_vs_torch_compile", f(|r| r.speedup_vs_torch_compile)),
        col("speedup_vs_torch_compile_lo", f(|r| r.speedup_vs_torch_compile_lo)),
        col("speedup_vs_torch_compile_hi", f(|r| r.speedup_vs_torch_compile_hi)),
        col(
            "speedup_vs_torch_compile_significant",
            rows.iter()
                .map(|r| r.speedup_vs_torch_compile_significant)
                .collect::<Vec<Option<bool>>>(),
        ),
        col("step_ms_median", f(|r| r.step_ms_median)),
        col("step_ms_p90", f(|r| r.step_ms_p90)),
        col("step_ms_min", f(|r| r.step_ms_min)),
        col("step_ms_max", f(|r| r.step_ms_max)),
        col("step_ms_std", f(|r| r.step_ms_std)),
        col("compile_s", f(|r| r.compile_s)),
        col("step_launches", s(|r| &r.step_launches)),
        col("train_flops_per_sample", f(|r| r.train_flops_per_sample)),
        col("hw_flops_per_sample", f(|r| r.hw_flops_per_sample)),
        col("tflops", f(|r| r.tflops)),
        col("mfu", f(|r| r.mfu)),
        col("hfu", f(|r| r.hfu)),
        col("peak_tflops", f(|r| r.peak_tflops)),
        col("gemm_peak_tflops", f(|r| r.gemm_peak_tflops)),
        col("peak_mem_bytes", ou(|r| r.peak_mem_bytes)),
        col("param_count", ou(|r| r.param_count.map(|v| v as u64))),
        col("optimizer_bytes_per_rank", ou(|r| r.optimizer_bytes_per_rank.map(|v| v as u64))),
        col("mem_params_bytes", ou(|r| r.mem_params_bytes)),
        col("mem_grads_bytes", ou(|r| r.mem_grads_bytes)),
        col("mem_optimizer_bytes", ou(|r| r.mem_optimizer_bytes)),
        col("mem_activations_bytes", ou(|r| r.mem_activations_bytes)),
        col("mem_logits_bytes", ou(|r| r.mem_logits_bytes)),
        col("mem_split_source", s(|r| &r.mem_split_source)),
        col("final_loss", f(|r| r.final_loss)),
        col("max_loss_rel_diff", f(|r| r.max_loss_rel_diff)),
        col("grad_norm_rel_diff_step0", f(|r| r.grad_norm_rel_diff_step0)),
        col("parity_tol", f(|r| r.parity_tol)),
        col("memory_budget_bytes", ou(|r| r.memory_budget_bytes)),
        col("max_batch_size", ou(|r| r.max_batch_size.map(|v| v as u64))),
        col("max_batch_samples_per_s", f(|r| r.max_batch_samples_per_s)),
        col("max_batch_tokens_per_s", f(|r| r.max_batch_tokens_per_s)),
        col("max_batch_peak_mem_bytes", ou(|r| r.max_batch_peak_mem_bytes)),
        col("max_batch_search", s(|r| &r.max_batch_search)),
        col("wall_s", f(|r| r.wall_s)),
        col("error", s(|r| &r.error)),
    ];
    debug_assert_eq!(cols.len(), crate::output::RESULT_COLUMNS.len());
    Ok(DataFrame::new(rows.len(), cols)?)
}

pub fn steps_frame(rows: &[StepRow]) -> Result<DataFrame> {
    let s = |f: fn(&StepRow) -> &String| rows.iter().map(|r| f(r).clone()).collect::<Vec<String>>();
    let u = |f: fn(&StepRow) -> usize| rows.iter().map(|r| f(r) as u64).collect::<Vec<u64>>();
    let f = |f: fn(&StepRow) -> f64| rows.iter().map(f).collect::<Vec<f64>>();
    let of = |f: fn(&StepRow) -> Option<f64>| rows.iter().map(f).collect::<Vec<Option<f64>>>();
    let cols = vec![
        col("model", s(|r| &r.model)),
        col("config", s(|r| &r.config)),
        col("precision", s(|r| &r.precision)),
        col("repeat", u(|r| r.repeat)),
        col("phase", s(|r| &r.phase)),
        col("rank", u(|r| r.rank)),
        col("step", u(|r| r.step)),
        col("loss", f(|r| r.loss)),
        col("step_ms", f(|r| r.step_ms)),
        col("device_ms", of(|r| r.device_ms)),
        col("grad_norm", f(|r| r.grad_norm)),
        col("loss_scale", f(|r| r.loss_scale)),
        col("skipped", rows.iter().map(|r| r.skipped).collect::<Vec<bool>>()),
    ];
    Ok(DataFrame::new(rows.len(), cols)?)
}

/// Typed access to a frame's columns; a missing optional column reads as nulls, so that a
/// run written before a column existed still loads.
struct Cols<'a>(&'a DataFrame);

impl Cols<'_> {
    fn strs(&self, name: &str) -> Result<Vec<String>> {
        match self.0.column(name) {
            Ok(c) => Ok(c.str()?.iter().map(|v| v.unwrap_or_default().to_string()).collect()),
            Err(_) => Ok(vec![String::new(); self.0.height()]),
        }
    }
    fn req_strs(&self, name: &str) -> Result<Vec<String>> {
        Ok(self.0.column(name)?.str()?.iter().map(|v| v.unwrap_or_default().to_string()).collect())
    }
    fn u64s(&self, name: &str) -> Result<Vec<Option<u64>>> {
        match self.0.column(name) {
            Ok(c) => Ok(c.cast(&DataType::UInt64)?.u64()?.iter().collect()),
            Err(_) => Ok(vec![None; self.0.height()]),
        }
    }
    fn req_usizes(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self
            .0
            .column(name)?
            .cast(&DataType::UInt64)?
            .u64()?
            .iter()
            .map(|v| v.unwrap_or(0) as usize)
            .collect())
    }
    fn bools(&self, name: &str) -> Result<Vec<Option<bool>>> {
        match self.0.column(name) {
            Ok(c) => Ok(c.cast(&DataType::Boolean)?.bool()?.iter().collect()),
            Err(_) => Ok(vec![None; self.0.height()]),
        }
    }
    fn f64s(&self, name: &str) -> Result<Vec<Option<f64>>> {
        match self.0.column(name) {
            Ok(c) => Ok(c.cast(&DataType::Float64)?.f64()?.iter().collect()),
            Err(_) => Ok(vec![None; self.0.height()]),
        }
    }
}

pub fn result_rows(df: &DataFrame) -> Result<Vec<ResultRow>> {
    let c = Cols(df);
    let (model, config, precision, device, status, error) = (
        c.req_strs("model")?,
        c.req_strs("config")?,
        c.req_strs("precision")?,
        c.strs("device")?,
        c.req_strs("status")?,
        c.strs("error")?,
    );
    // Runs written before the task column: empty.
    let task = c.strs("task")?;
    let (batch, seq, ranks, steps, warmup) = (
        c.req_usizes("batch_size")?,
        c.req_usizes("seq_len")?,
        c.req_usizes("ranks")?,
        c.req_usizes("steps")?,
        c.req_usizes("warmup")?,
    );
    let f = |n: &str| c.f64s(n);
    let (sps, tps, speedup, med, p90, min, max, std) = (
        f("samples_per_s")?,
        f("tokens_per_s")?,
        f("speedup")?,
        f("step_ms_median")?,
        f("step_ms_p90")?,
        f("step_ms_min")?,
        f("step_ms_max")?,
        f("step_ms_std")?,
    );
    let (flops, tflops, mfu, peak, final_loss, rel, wall) = (
        f("train_flops_per_sample")?,
        f("tflops")?,
        f("mfu")?,
        f("peak_tflops")?,
        f("final_loss")?,
        f("max_loss_rel_diff")?,
        f("wall_s")?,
    );
    let (mem, params, opt) =
        (c.u64s("peak_mem_bytes")?, c.u64s("param_count")?, c.u64s("optimizer_bytes_per_rank")?);
    let (lo, hi, sig, hw, hfu, gemm, gn_rel, tol) = (
        f("speedup_lo")?,
        f("speedup_hi")?,
        c.bools("speedup_significant")?,
        f("hw_flops_per_sample")?,
        f("hfu")?,
        f("gemm_peak_tflops")?,
        f("grad_norm_rel_diff_step0")?,
        f("parity_tol")?,
    );
    // Runs written before the memory split: nulls (the chart shows every part unknown).
    let (m_params, m_grads, m_opt, m_act, m_logits, m_source) = (
        c.u64s("mem_params_bytes")?,
        c.u64s("mem_grads_bytes")?,
        c.u64s("mem_optimizer_bytes")?,
        c.u64s("mem_activations_bytes")?,
        c.u64s("mem_logits_bytes")?,
        c.strs("mem_split_source")?,
    );
    // Runs written before --batch-size auto: nulls.
    let (budget, max_b, max_sps, max_tps, max_peak, max_log) = (
        c.u64s("memory_budget_bytes")?,
        c.u64s("max_batch_size")?,
        f("max_batch_samples_per_s")?,
        f("max_batch_tokens_per_s")?,
        c.u64s("max_batch_peak_mem_bytes")?,
        c.strs("max_batch_search")?,
    );
    // Runs written before --repeat existed were one run each.
    let repeats = c.u64s("repeats")?;
    // Runs written before the torch-compile config: nulls.
    let (tc, tc_lo, tc_hi, tc_sig, compile) = (
        f("speedup_vs_torch_compile")?,
        f("speedup_vs_torch_compile_lo")?,
        f("speedup_vs_torch_compile_hi")?,
        c.bools("speedup_vs_torch_compile_significant")?,
        f("compile_s")?,
    );
    // Runs written before captured GPU steps: empty.
    let launches = c.strs("step_launches")?;
    Ok((0..df.height())
        .map(|i| ResultRow {
            model: model[i].clone(),
            task: task[i].clone(),
            config: config[i].clone(),
            precision: precision[i].clone(),
            device: device[i].clone(),
            batch_size: batch[i],
            seq_len: seq[i],
            ranks: ranks[i],
            steps: steps[i],
            warmup: warmup[i],
            repeats: repeats[i].map_or(1, |v| v as usize),
            status: status[i].clone(),
            samples_per_s: sps[i],
            tokens_per_s: tps[i],
            speedup: speedup[i],
            speedup_lo: lo[i],
            speedup_hi: hi[i],
            speedup_significant: sig[i],
            speedup_vs_torch_compile: tc[i],
            speedup_vs_torch_compile_lo: tc_lo[i],
            speedup_vs_torch_compile_hi: tc_hi[i],
            speedup_vs_torch_compile_significant: tc_sig[i],
            step_ms_median: med[i],
            step_ms_p90: p90[i],
            step_ms_min: min[i],
            step_ms_max: max[i],
            step_ms_std: std[i],
            compile_s: compile[i],
            step_launches: launches[i].clone(),
            train_flops_per_sample: flops[i],
            hw_flops_per_sample: hw[i],
            tflops: tflops[i],
            mfu: mfu[i],
            hfu: hfu[i],
            peak_tflops: peak[i],
            gemm_peak_tflops: gemm[i],
            peak_mem_bytes: mem[i],
            param_count: params[i].map(|v| v as usize),
            optimizer_bytes_per_rank: opt[i].map(|v| v as usize),
            mem_params_bytes: m_params[i],
            mem_grads_bytes: m_grads[i],
            mem_optimizer_bytes: m_opt[i],
            mem_activations_bytes: m_act[i],
            mem_logits_bytes: m_logits[i],
            mem_split_source: m_source[i].clone(),
            final_loss: final_loss[i],
            max_loss_rel_diff: rel[i],
            grad_norm_rel_diff_step0: gn_rel[i],
            parity_tol: tol[i],
            memory_budget_bytes: budget[i],
            max_batch_size: max_b[i].map(|v| v as usize),
            max_batch_samples_per_s: max_sps[i],
            max_batch_tokens_per_s: max_tps[i],
            max_batch_peak_mem_bytes: max_peak[i],
            max_batch_search: max_log[i].clone(),
            wall_s: wall[i],
            error: error[i].clone(),
        })
        .collect())
}

pub fn step_rows(df: &DataFrame) -> Result<Vec<StepRow>> {
    let c = Cols(df);
    let (model, config, precision) =
        (c.req_strs("model")?, c.req_strs("config")?, c.req_strs("precision")?);
    let (rank, step) = (c.req_usizes("rank")?, c.req_usizes("step")?);
    // Runs written before --repeat and the parity probe existed: one timed run.
    let repeat = c.u64s("repeat")?;
    let phase = c.strs("phase")?;
    let (loss, ms, gn, ls) =
        (c.f64s("loss")?, c.f64s("step_ms")?, c.f64s("grad_norm")?, c.f64s("loss_scale")?);
    let device_ms = c.f64s("device_ms")?;
    let skipped: Vec<bool> = match df.column("skipped") {
        Ok(col) => col.bool()?.iter().map(|v| v.unwrap_or(false)).collect(),
        Err(_) => vec![false; df.height()],
    };
    let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
    Ok((0..df.height())
        .map(|i| StepRow {
            model: model[i].clone(),
            config: config[i].clone(),
            precision: precision[i].clone(),
            repeat: repeat[i].unwrap_or(0) as usize,
            phase: if phase[i].is_empty() { "timed".into() } else { phase[i].clone() },
            rank: rank[i],
            step: step[i],
            loss: nan(loss[i]),
            step_ms: nan(ms[i]),
            device_ms: device_ms[i],
            grad_norm: nan(gn[i]),
            loss_scale: nan(ls[i]),
            skipped: skipped[i],
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_round_trip_through_parquet() {
        let dir = tempfile::tempdir().unwrap();
        let r = ResultRow {
            model: "m".into(),
            config: "ort".into(),
            precision: "fp32".into(),
            device: "cpu".into(),
            batch_size: 2,
            seq_len: 8,
            ranks: 1,
            steps: 3,
            warmup: 1,
            repeats: 3,
            status: "ok".into(),
            samples_per_s: Some(1.5),
            speedup_lo: Some(1.25),
            speedup_significant: Some(true),
            speedup_vs_torch_compile: Some(1.1),
            speedup_vs_torch_compile_significant: Some(false),
            compile_s: Some(12.5),
            hfu: Some(0.5),
            param_count: Some(123),
            mem_params_bytes: Some(492),
            mem_grads_bytes: Some(492),
            mem_optimizer_bytes: Some(984),
            mem_activations_bytes: None,
            mem_logits_bytes: Some(4096),
            mem_split_source: "analytic".into(),
            error: "a, \"quoted\" error".into(),
            memory_budget_bytes: Some(8 << 30),
            max_batch_size: Some(24),
            max_batch_samples_per_s: Some(3.5),
            max_batch_search: "1✓ 2✓ 4✗ 3✓ · run 3✓".into(),
            ..Default::default()
        };
        let s = StepRow {
            model: "m".into(),
            config: "ort".into(),
            precision: "fp32".into(),
            repeat: 1,
            phase: "parity".into(),
            rank: 0,
            step: 2,
            loss: 1.25,
            step_ms: 3.0,
            device_ms: Some(2.5),
            grad_norm: 0.5,
            loss_scale: 1.0,
            skipped: true,
        };
        write_tables(dir.path(), std::slice::from_ref(&r), std::slice::from_ref(&s)).unwrap();
        std::fs::write(dir.path().join(RUN_JSON), "{}").unwrap();
        let run = load_run(dir.path()).unwrap();
        assert_eq!(run.result_rows().unwrap(), vec![r]);
        assert_eq!(run.step_rows().unwrap(), vec![s]);
        // Empty tables keep their columns.
        write_tables(dir.path(), &[], &[]).unwrap();
        let run = load_run(dir.path()).unwrap();
        assert_eq!(run.results.width(), crate::output::RESULT_COLUMNS.len());
        assert_eq!(run.results.height(), 0);
    }
}
