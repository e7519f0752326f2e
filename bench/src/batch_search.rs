//! `--batch-size auto`: per config, the largest batch whose peak memory fits `--memory-budget`.
//!
//! Every config is searched over the same grid ([`largest_fitting`]: powers of two up to
//! [`MAX_BATCH`], then bisection between the last batch that fitted and the first that did
//! not), so no config gets a finer search than another. What "fits" means is the same for all:
//! the process's peak stays under the stop line, [`STOP_SHARE`] of the budget. How a batch is
//! tried differs:
//!
//! - the engine on the CPU (`ort`, `ort-zero1`): from its memory plan's exact bytes per rank
//!   (arena + parameters + gradients + optimizer state, [`EnginePlanner`]) plus what the process
//!   holds outside the plan, measured once by a short probe at batch 1 — no run per batch;
//! - `pytorch`, `torch-compile` and every config on a GPU: a short probe run
//!   ([`PROBE_STEPS`] steps) per batch.
//!
//! The batch found is then run with the run's steps and its measured peak confirms it; a run
//! that does not fit marks that batch (and every larger one) as not fitting and the search
//! goes on below it. On the CPU the harness samples each probe's and run's RSS every 20 ms and
//! stops it (SIGKILL, recorded as over the budget) once it reaches the stop line — never the
//! kernel's OOM killer; the 5 % between the line and the budget is headroom for what a process
//! allocates between two samples. On a GPU a probe's out-of-memory error is its answer,
//! recorded, and the run goes on.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use ortbench_engine::collective::Sharding;
use ortbench_engine::exec::planned::CpuSupport;
use ortbench_engine::parallel::SHARD_ALIGN;
use ortbench_engine::passes::PassConfig;
use ortbench_engine::DType;
use ortbench_models::config::ModelConfig;
use ortbench_models::graph::{build_training_graph, GraphOptions};
use ortbench_models::DataSource;
use serde::Serialize;

use crate::output::{ResultRow, StepRow};
use crate::run_spec::RunSpec;

/// The largest batch (rows per rank) the search tries.
pub const MAX_BATCH: usize = 1024;
/// Steps of a probe run: the second step is the first with the optimizer's state allocated
/// next to the activations (torch creates Adam's moments in the first update).
pub const PROBE_STEPS: usize = 2;
/// A batch fits when the process's peak stays below this share of the budget; a process is
/// stopped when its sampled RSS reaches it.
pub const STOP_SHARE: f64 = 0.95;
/// The default budget on the CPU: this share of the memory available when the run starts.
pub const CPU_DEFAULT_SHARE: f64 = 0.70;
/// The default budget on a GPU: this share of the device's memory.
pub const GPU_DEFAULT_SHARE: f64 = 0.90;

const MIB: f64 = (1u64 << 20) as f64;

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / MIB)
}

/// `--batch-size auto`'s budget, per worker process (per rank with rank processes; per GPU).
#[derive(Clone, Debug, Serialize)]
pub struct AutoBatch {
    pub budget_bytes: u64,
    /// Where the budget came from: given, or the default's inputs.
    pub source: String,
}

impl AutoBatch {
    /// The RSS at which a process is stopped, and the peak a batch must stay under.
    pub fn stop_bytes(&self) -> u64 {
        (self.budget_bytes as f64 * STOP_SHARE) as u64
    }
}

/// The search grid: the largest `b` in 1..=max with `fits(b)`, assuming fitting is monotone
/// (a batch fits if a larger one does). Tries 1, 2, 4, … (and `max` itself when it is not a
/// power of two) until a batch does not fit, then bisects between the last fit and the first
/// miss; None when 1 does not fit. The batches tried depend only on the answers.
pub fn largest_fitting(max: usize, mut fits: impl FnMut(usize) -> bool) -> Option<usize> {
    if max == 0 || !fits(1) {
        return None;
    }
    let mut lo = 1;
    let mut hi = loop {
        if lo == max {
            return Some(max);
        }
        let next = (lo * 2).min(max);
        if fits(next) {
            lo = next;
        } else {
            break next;
        }
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

/// `--batch-size auto` and `--memory-budget` (MiB) as the plan takes them: None without auto;
/// the budget given, else the device's default. `processes`: worker processes that run at
/// once (rank processes share the CPU's memory).
pub fn plan_budget(
    auto: bool,
    given_mib: Option<f64>,
    device: &str,
    processes: usize,
) -> Result<Option<AutoBatch>> {
    let available = (device == "cpu").then(cpu_available_bytes).flatten();
    let auto_batch = match (auto, given_mib) {
        (false, None) => return Ok(None),
        (false, Some(m)) => {
            bail!("--memory-budget {m} applies to --batch-size auto only (it bounds the batch search)")
        }
        (true, Some(m)) if !m.is_finite() || m < 1.0 => {
            bail!("--memory-budget must be a positive number of MiB (at least 1), got {m}")
        }
        (true, Some(m)) => {
            let budget_bytes = (m * MIB) as u64;
            if let Some(a) = available {
                // Past what is free, the kernel's OOM killer could strike before the budget.
                if budget_bytes.saturating_mul(processes as u64) > a {
                    bail!(
                        "--memory-budget {m} MiB × {processes} process(es) is more than the {} available on this machine now: the kernel's OOM killer could stop a probe before the budget does",
                        mib(a)
                    );
                }
            }
            AutoBatch { budget_bytes, source: format!("given: --memory-budget {m}") }
        }
        (true, None) if device == "cpu" => {
            let a = available.context(
                "--batch-size auto: cannot read the memory available (/proc/meminfo); give --memory-budget MiB",
            )?;
            let budget_bytes = (a as f64 * CPU_DEFAULT_SHARE / processes as f64) as u64;
            AutoBatch {
                budget_bytes,
                source: format!(
                    "default: {:.0} % of the {} available at the start{}",
                    CPU_DEFAULT_SHARE * 100.0,
                    mib(a),
                    if processes > 1 {
                        format!(", split among {processes} rank processes")
                    } else {
                        String::new()
                    }
                ),
            }
        }
        (true, None) => {
            let index =
                device.strip_prefix("cuda:").and_then(|i| i.parse::<usize>().ok()).unwrap_or(0);
            let total = crate::env::gpu_memory_mb(index).with_context(|| {
                format!("--batch-size auto: cannot read the memory of GPU {index} (nvidia-smi); give --memory-budget MiB")
            })? * (1 << 20);
            AutoBatch {
                budget_bytes: (total as f64 * GPU_DEFAULT_SHARE) as u64,
                source: format!(
                    "default: {:.0} % of GPU {index}'s {}",
                    GPU_DEFAULT_SHARE * 100.0,
                    mib(total)
                ),
            }
        }
    };
    Ok(Some(auto_batch))
}

/// Resident memory of process `pid` now (VmRSS), in bytes; None once it is gone.
pub fn rss_bytes(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Memory the machine can give now: MemAvailable, within the cgroup's limit.
fn cpu_available_bytes() -> Option<u64> {
    let a = crate::env::meminfo_kb("MemAvailable")? * 1024;
    Some(crate::env::cgroup_memory_limit().map_or(a, |c| c.min(a)))
}

/// The engine's memory plan at a batch, per rank: what the plan says it holds.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct PlanBytes {
    /// The arena: every activation, activation gradient and workspace of a step.
    pub arena: u64,
    /// fp32 parameters, plus their rounded compute copy in fp16/bf16.
    pub params: u64,
    /// The flat fp32 gradient buffer.
    pub grads: u64,
    /// Adam's two fp32 moments (this rank's shard under ZeRO-1).
    pub optimizer: u64,
}

impl PlanBytes {
    pub fn total(&self) -> u64 {
        self.arena + self.params + self.grads + self.optimizer
    }
}

/// Builds the engine's training graph and memory plan for a spec at any batch, without
/// running it or allocating the arena — as the worker builds them (`ORTBENCH_PASSES`, the row
/// skip, the mask input of a padded --data file, the threads a rank gets).
pub struct EnginePlanner {
    cfg: ModelConfig,
    dtype: DType,
    passes: PassConfig,
    mask: bool,
    threads: usize,
    spec: RunSpec,
}

impl EnginePlanner {
    pub fn new(spec: &RunSpec) -> Result<EnginePlanner> {
        let cfg = crate::worker::model_config(spec)?;
        let mask = match &spec.data {
            Some(p) => DataSource::from_file(&cfg, p, 1, Some(spec.seq_len), spec.seed)?
                .has_attention_mask(),
            None => false,
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(EnginePlanner {
            cfg,
            dtype: spec.precision.parse::<DType>()?,
            passes: PassConfig::from_env()?,
            mask,
            threads: (cores / spec.ranks.max(1)).max(1),
            spec: spec.clone(),
        })
    }

    /// Ranks in one worker process: all of them with `--launch threads`, each its own session.
    pub fn ranks_per_process(&self) -> u64 {
        if self.spec.launch == "threads" {
            self.spec.ranks.max(1) as u64
        } else {
            1
        }
    }

    /// One rank's plan bytes at `batch` rows per rank.
    pub fn bytes(&self, batch: usize) -> Result<PlanBytes> {
        let opts = GraphOptions::new(batch, self.spec.seq_len)
            .with_passes(self.passes)
            .with_attention_mask(self.mask)
            .with_dtype(self.dtype);
        let model = build_training_graph(&self.cfg, &opts)?;
        let g = &model.graph;
        let plan = ortbench_engine::plan::build(g, &CpuSupport::for_graph(g, self.threads))
            .map_err(|e| anyhow::anyhow!("planning {} at batch {batch}: {e}", self.spec.model))?;
        let n = g.num_param_elems() as u64;
        let world = self.spec.ranks.max(1);
        let moments = if self.spec.config == "ort-zero1" && world > 1 {
            let s = Sharding::new(n as usize, world, SHARD_ALIGN);
            (0..world).map(|r| s.real_range(r).len()).max().unwrap_or(0) as u64
        } else {
            n
        };
        Ok(PlanBytes {
            arena: plan.peak_bytes() as u64,
            params: 4 * n * if self.dtype == DType::F32 { 1 } else { 2 },
            grads: 4 * n,
            optimizer: 8 * moments,
        })
    }
}

/// One batch tried, as run.json records it.
#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    pub batch: usize,
    pub fits: bool,
    /// `plan` (the engine's plan bytes), `probe` (a short run) or `run` (the run at the batch
    /// found, whose measured peak confirms it).
    pub by: &'static str,
    /// The peak measured (probe, run) or predicted (plan), in bytes.
    pub peak_bytes: Option<u64>,
    pub detail: String,
}

/// What the search found for one spec.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcome {
    /// The largest batch that fits, confirmed by its run's measured peak.
    pub batch: Option<usize>,
    pub trials: Vec<Trial>,
    /// Why the search stopped without an answer (a probe that failed for another reason than
    /// memory, an interrupt).
    pub error: Option<String>,
    #[serde(skip)]
    pub run: Option<RunRecord>,
}

impl Outcome {
    /// The trials in one line: "1✓ 2✓ 4✓ 8✗ 6✓ 7✗ · run 6✓".
    pub fn log(&self) -> String {
        let mut s: Vec<String> = self
            .trials
            .iter()
            .map(|t| {
                let mark = if t.fits { "✓" } else { "✗" };
                if t.by == "run" {
                    format!("· run {}{mark}", t.batch)
                } else {
                    format!("{}{mark}", t.batch)
                }
            })
            .collect();
        if let Some(e) = &self.error {
            s.push(format!("· stopped: {e}"));
        }
        s.join(" ")
    }
}

/// A run's step records and its row, as the harness's `execute` returns them.
pub type RunRecord = (Vec<StepRow>, ResultRow);

/// Why a run was started: a short probe, or the run at the batch found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Probe,
    Run,
}

/// `spec` at `batch` rows per rank (a probe: [`PROBE_STEPS`] steps, one warm-up).
pub fn spec_at(spec: &RunSpec, batch: usize, purpose: Purpose) -> RunSpec {
    let mut s = RunSpec { batch_size: batch, ..spec.clone() };
    if purpose == Purpose::Probe {
        s.steps = PROBE_STEPS;
        s.warmup = 1;
    }
    s
}

/// Whether a probe's or run's row says the batch fits; Err for a failure that is not about
/// memory (the search cannot go on).
fn verdict(row: &ResultRow, stop: u64) -> Result<(bool, String)> {
    let peak = row.peak_mem_bytes;
    match row.status.as_str() {
        "ok" => match peak {
            Some(p) if p < stop => Ok((true, format!("peak {}", mib(p)))),
            Some(p) => Ok((false, format!("peak {} ≥ the stop line {}", mib(p), mib(stop)))),
            None => bail!("no peak memory measured"),
        },
        "oom" => Ok((false, row.error.clone())),
        other => bail!("{other}: {}", row.error),
    }
}

/// Searches the largest batch of `spec` within `auto`'s budget. `run` executes a spec in its
/// worker(s) as the harness does, stopping it at the stop line.
pub fn search(
    spec: &RunSpec,
    auto: &AutoBatch,
    run: &mut dyn FnMut(&RunSpec, Purpose) -> Result<RunRecord>,
) -> Result<Outcome> {
    let stop = auto.stop_bytes();
    let planner = if spec.config.starts_with("ort") && spec.device == "cpu" {
        Some(EnginePlanner::new(spec)?)
    } else {
        None
    };
    let mut out = Outcome::default();
    // Per batch: fits or not (a run that did not fit overrides the probe or plan).
    let mut known: BTreeMap<usize, bool> = BTreeMap::new();
    // The engine: bytes the process holds outside its plan, measured at batch 1.
    let mut outside: Option<i64> = None;
    loop {
        let mut failure: Option<String> = None;
        let best = largest_fitting(MAX_BATCH, |b| {
            if let Some(&f) = known.get(&b) {
                return f;
            }
            if failure.is_some() {
                return false;
            }
            let trial = match (&planner, outside) {
                (Some(p), Some(o)) => p.bytes(b).map(|pb| {
                    let planned = pb.total() * p.ranks_per_process();
                    let predicted = (planned as i64 + o).max(0) as u64;
                    Trial {
                        batch: b,
                        fits: predicted < stop,
                        by: "plan",
                        peak_bytes: Some(predicted),
                        detail: format!(
                            "plan {} per rank (arena {}, parameters {}, gradients {}, optimizer {}) × {} rank(s) in the process + {} outside it = {}",
                            mib(pb.total()),
                            mib(pb.arena),
                            mib(pb.params),
                            mib(pb.grads),
                            mib(pb.optimizer),
                            p.ranks_per_process(),
                            mib(o.max(0) as u64),
                            mib(predicted)
                        ),
                    }
                }),
                _ => run(&spec_at(spec, b, Purpose::Probe), Purpose::Probe).and_then(|(_, row)| {
                    let (fits, detail) = verdict(&row, stop)?;
                    if let (Some(p), Some(peak)) = (&planner, row.peak_mem_bytes) {
                        let planned = p.bytes(b)?.total() * p.ranks_per_process();
                        outside = Some(peak as i64 - planned as i64);
                    }
                    Ok(Trial { batch: b, fits, by: "probe", peak_bytes: row.peak_mem_bytes, detail })
                }),
            };
            match trial {
                Ok(t) => {
                    let fits = t.fits;
                    known.insert(b, fits);
                    out.trials.push(t);
                    fits
                }
                Err(e) => {
                    failure = Some(format!("batch {b}: {e:#}"));
                    false
                }
            }
        });
        if let Some(e) = failure {
            out.error = Some(e);
            return Ok(out);
        }
        let Some(b) = best else { return Ok(out) };
        // The run at the batch found: its measured peak confirms it.
        let (steps, row) = run(&spec_at(spec, b, Purpose::Run), Purpose::Run)?;
        let (fits, detail) = match verdict(&row, stop) {
            Ok(v) => v,
            Err(e) => {
                out.error = Some(format!("the run at batch {b}: {e:#}"));
                return Ok(out);
            }
        };
        out.trials.push(Trial {
            batch: b,
            fits,
            by: "run",
            peak_bytes: row.peak_mem_bytes,
            detail,
        });
        if fits {
            out.batch = Some(b);
            out.run = Some((steps, row));
            return Ok(out);
        }
        // Fitting is monotone: nothing from b up fits; search again below it.
        for (_, f) in known.range_mut(b..) {
            *f = false;
        }
        known.insert(b, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batches `largest_fitting` tries for a capacity (every batch up to it fits).
    fn grid(max: usize, capacity: usize) -> (Option<usize>, Vec<usize>) {
        let mut tried = Vec::new();
        let best = largest_fitting(max, |b| {
            tried.push(b);
            b <= capacity
        });
        (best, tried)
    }

    #[test]
    fn the_grid_is_powers_of_two_then_bisection() {
        assert_eq!(grid(1024, 40), (Some(40), vec![1, 2, 4, 8, 16, 32, 64, 48, 40, 44, 42, 41]));
        assert_eq!(grid(1024, 1), (Some(1), vec![1, 2]));
        assert_eq!(grid(1024, 0), (None, vec![1]));
        assert_eq!(grid(1024, 5000).0, Some(1024));
        // A cap that is not a power of two is tried itself.
        assert_eq!(grid(100, 5000), (Some(100), vec![1, 2, 4, 8, 16, 32, 64, 100]));
        assert_eq!(
            grid(100, 70),
            (Some(70), vec![1, 2, 4, 8, 16, 32, 64, 100, 82, 73, 68, 70, 71])
        );
    }

    #[test]
    fn the_grid_finds_every_capacity_and_depends_only_on_the_answers() {
        for capacity in 0..300 {
            let (best, tried) = grid(256, capacity);
            assert_eq!(best, (capacity > 0).then_some(capacity.min(256)), "capacity {capacity}");
            // Two predicates with the same answers (one a memory model, one a table) try the
            // same batches.
            let bytes = |b: usize| 1000 + 37 * b as u64;
            let budget = 1000 + 37 * capacity as u64;
            let mut again = Vec::new();
            largest_fitting(256, |b| {
                again.push(b);
                bytes(b) <= budget
            });
            assert_eq!(tried, again, "capacity {capacity}");
        }
    }

    /// The plan's specs for tiny-gpt2 at seq 16 with `extra` flags.
    fn tiny_specs(extra: &[&str]) -> Vec<RunSpec> {
        use clap::Parser;
        let argv = [&["ortbench", "run", "--models", "tiny-gpt2", "--seq-len", "16"][..], extra];
        let cli = crate::cli::Cli::try_parse_from(argv.concat()).unwrap();
        let crate::cli::Command::Run(args) = cli.command else { unreachable!() };
        crate::run_plan::make_plan(&args).unwrap().runs
    }

    #[test]
    fn the_engines_plan_bytes_hold_its_flat_buffers_and_its_arena_grows_with_the_batch() {
        let specs = tiny_specs(&["--configs", "ort,ort-zero1", "--ranks", "2"]);
        let (ort, zero) =
            (EnginePlanner::new(&specs[0]).unwrap(), EnginePlanner::new(&specs[1]).unwrap());
        let (b1, b8) = (ort.bytes(1).unwrap(), ort.bytes(8).unwrap());
        // fp32: the parameters, their gradients (same layout) and Adam's two moments.
        assert!(b1.params > 0);
        assert_eq!((b1.grads, b1.optimizer), (b1.params, 2 * b1.params));
        assert_eq!((b8.params, b8.grads, b8.optimizer), (b1.params, b1.grads, b1.optimizer));
        assert!(b8.arena > b1.arena, "{b1:?} {b8:?}");
        assert_eq!(b8.total(), b8.arena + 4 * b8.params);
        // ZeRO-1 on 2 ranks: each holds about half the moments (its shard, padding not stored).
        let z = zero.bytes(1).unwrap();
        assert!(z.optimizer < b1.optimizer && 2 * z.optimizer + 8 * 16 >= b1.optimizer, "{z:?}");
        assert_eq!(z.arena, b1.arena);
        // Rank processes hold one rank each; thread ranks share one process.
        assert_eq!(ort.ranks_per_process(), 1);
        let threads = tiny_specs(&["--configs", "ort", "--ranks", "2", "--launch", "threads"]);
        assert_eq!(EnginePlanner::new(&threads[0]).unwrap().ranks_per_process(), 2);
        // bf16 keeps the fp32 master parameters and the rounded compute copy.
        let bf16 = tiny_specs(&["--configs", "ort", "--precision", "bf16"]);
        let h = EnginePlanner::new(&bf16[0]).unwrap().bytes(1).unwrap();
        assert_eq!((h.params, h.grads), (2 * b1.params, b1.params));
    }

    #[test]
    fn budgets_are_refused_without_auto_or_when_not_positive() {
        let e = plan_budget(false, Some(100.0), "cpu", 1).unwrap_err().to_string();
        assert!(e.contains("applies to --batch-size auto only"), "{e}");
        for bad in [0.0, -5.0, f64::NAN, 0.5] {
            let e = plan_budget(true, Some(bad), "cpu", 1).unwrap_err().to_string();
            assert!(e.contains("--memory-budget must be a positive number"), "{e}");
        }
        assert!(plan_budget(false, None, "cpu", 1).unwrap().is_none());
        let a = plan_budget(true, Some(100.0), "cpu", 1).unwrap().unwrap();
        assert_eq!(a.budget_bytes, 100 << 20);
        assert_eq!(a.stop_bytes(), (100.0 * MIB * STOP_SHARE) as u64);
        let d = plan_budget(true, None, "cpu", 2).unwrap().unwrap();
        let avail = cpu_available_bytes().unwrap() as f64;
        // MemAvailable moves between the two reads; the share and the split are what matter.
        let want = avail * CPU_DEFAULT_SHARE / 2.0;
        assert!((d.budget_bytes as f64 - want).abs() < 0.05 * want, "{d:?}");
    }
}
