//! `ortbench worker`: executes one run in its own process (so peak memory is per run and a
//! crash takes only this run down) and streams JSON lines to the parent: a `step` record per
//! step, then a `summary` — or an `error`.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ortbench_engine::DType;
use ortbench_models::graph::train::{EngineOptions, EngineTrainer};
use ortbench_models::torch::{Precision, TorchTrainer, TrainOptions};
use ortbench_engine::collective::{Collective, LocalGroup};
use ortbench_engine::parallel::Strategy;
use ortbench_models::{Batch, DataSource, HubOptions, LrSchedule, Task, Weights};
use serde::{Deserialize, Serialize};

use crate::spec::{RunSpec, WeightsSource};

/// One line of the worker's output.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Step { rank: usize, step: usize, loss: f64, step_ms: f64, grad_norm: f64, loss_scale: f64, skipped: bool },
    Summary { param_count: usize, peak_mem_bytes: u64, optimizer_bytes_per_rank: usize },
    Error { message: String, oom: bool },
}

fn emit(out: &mut impl Write, e: &Event) {
    // The parent reads line by line; a lost pipe means the parent is gone, nothing to do.
    let _ = writeln!(out, "{}", serde_json::to_string(e).expect("events serialise"));
    let _ = out.flush();
}

/// Entry point of the hidden subcommand.
pub fn main(spec_json: &str) -> i32 {
    let mut out = std::io::stdout().lock();
    let spec: RunSpec = match serde_json::from_str(spec_json) {
        Ok(s) => s,
        Err(e) => {
            emit(&mut out, &Event::Error { message: format!("bad run spec: {e}"), oom: false });
            return 2;
        }
    };
    match run(&spec, &mut out) {
        Ok(()) => 0,
        Err(e) => {
            let message = format!("{e:#}");
            let oom = is_oom_message(&message);
            emit(&mut out, &Event::Error { message, oom });
            1
        }
    }
}

/// Messages allocators and CUDA give when memory runs out.
pub fn is_oom_message(m: &str) -> bool {
    let m = m.to_ascii_lowercase();
    m.contains("out of memory") || m.contains("cannot allocate memory") || m.contains("failed to allocate")
}

fn precision(p: &str) -> Result<Precision> {
    Ok(match p {
        "fp32" => Precision::Fp32,
        "fp16" => Precision::Fp16,
        "bf16" => Precision::Bf16,
        other => bail!("unknown precision '{other}'"),
    })
}

pub fn parse_device(d: &str) -> Result<tch::Device> {
    Ok(match d {
        "cpu" => tch::Device::Cpu,
        "cuda" => tch::Device::Cuda(0),
        _ => match d.strip_prefix("cuda:").and_then(|i| i.parse::<usize>().ok()) {
            Some(i) => tch::Device::Cuda(i),
            None => bail!("unknown device '{d}': use cpu, cuda or cuda:N"),
        },
    })
}

/// What a rank's step reports, whichever trainer ran it.
struct RankStep {
    loss: f64,
    grad_norm: f64,
    loss_scale: f64,
    skipped: bool,
}

/// One rank of a run: the baseline or the engine.
trait RankTrainer {
    /// One step on the global batch (the rank takes its block of rows).
    fn step(&mut self, global: &Batch) -> Result<RankStep>;
    /// Bytes of optimizer state this rank holds.
    fn optimizer_bytes(&self) -> usize;
}

/// A `pytorch` rank: libtorch eager, DDP across ranks.
struct TorchRank {
    trainer: TorchTrainer,
    group: LocalGroup,
    task: Task,
    rows: usize,
}

impl RankTrainer for TorchRank {
    fn step(&mut self, global: &Batch) -> Result<RankStep> {
        let (r, n) = (self.group.rank(), self.group.world_size());
        let s = if n == 1 {
            self.trainer.step(global)?
        } else {
            let local = global.rows(r * self.rows..(r + 1) * self.rows);
            let total = self.task.label_count(global);
            let weight = if total == 0 { 1.0 / n as f32 } else { self.task.label_count(&local) as f32 / total as f32 };
            self.trainer.step_ddp(&local, Some((&self.group, weight)))?
        };
        Ok(RankStep { loss: s.loss, grad_norm: s.grad_norm, loss_scale: s.loss_scale, skipped: s.skipped })
    }
    fn optimizer_bytes(&self) -> usize {
        // torch.optim.AdamW keeps exp_avg and exp_avg_sq in fp32 for every parameter.
        8 * self.trainer.weights().param_count()
    }
}

impl RankTrainer for EngineTrainer {
    fn step(&mut self, global: &Batch) -> Result<RankStep> {
        let s = EngineTrainer::step(self, global)?;
        Ok(RankStep { loss: f64::from(s.loss), grad_norm: f64::from(s.grad_norm), loss_scale: f64::from(s.loss_scale), skipped: s.skipped })
    }
    fn optimizer_bytes(&self) -> usize {
        EngineTrainer::optimizer_bytes(self)
    }
}

fn run(spec: &RunSpec, out: &mut impl Write) -> Result<()> {
    let resolved = ortbench_models::resolve(&spec.model, &HubOptions::from_env())?;
    let mut cfg = resolved.config;
    if let Some(p) = spec.dropout {
        cfg.set_dropout(p);
    }
    let weights = match &spec.weights {
        WeightsSource::Random => Weights::init(&cfg, spec.seed),
        WeightsSource::File(path) => Weights::load(&cfg, path, spec.seed)?.0,
    };
    let ranks = spec.ranks.max(1);
    // The global batch is --batch-size × --ranks; rank r takes rows r·b .. (r+1)·b.
    let global_batch = spec.batch_size * ranks;
    let data = match &spec.data {
        Some(path) => DataSource::from_file(&cfg, path, global_batch, Some(spec.seq_len), spec.seed)?,
        None => DataSource::synthetic(&cfg, global_batch, spec.seq_len, spec.seed)?,
    };
    let schedule = match spec.lr_schedule.as_str() {
        "constant" => LrSchedule::Constant { warmup_steps: spec.lr_warmup_steps },
        "linear" => LrSchedule::Linear { warmup_steps: spec.lr_warmup_steps, total_steps: spec.steps },
        other => bail!("unknown --lr-schedule '{other}'"),
    };
    let device = parse_device(&spec.device)?;
    if spec.config != "pytorch" && device != tch::Device::Cpu {
        bail!("the engine runs on the CPU in this build; use --device cpu for the {} config", spec.config);
    }
    // On the CPU, ranks split the cores.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / ranks).max(1);
    tch::set_num_threads(threads as i32);
    ortbench_engine::backend::cpu::gemm::set_num_threads(threads);

    let param_count = weights.param_count();
    let task = Task::for_config(&cfg);
    let make = |group: LocalGroup| -> Result<Box<dyn RankTrainer>> {
        Ok(match spec.config.as_str() {
            "pytorch" => {
                let opts = TrainOptions {
                    lr: spec.lr,
                    weight_decay: spec.weight_decay,
                    max_grad_norm: spec.max_grad_norm,
                    schedule,
                    precision: precision(&spec.precision)?,
                    ..TrainOptions::default()
                };
                let trainer = TorchTrainer::new(&cfg, &weights, device, opts)?;
                Box::new(TorchRank { trainer, group, task, rows: spec.batch_size })
            }
            "ort" | "ort-zero1" => {
                let opts = EngineOptions {
                    lr: spec.lr,
                    weight_decay: spec.weight_decay,
                    max_grad_norm: spec.max_grad_norm,
                    schedule,
                    precision: spec.precision.parse::<DType>()?,
                    seed: spec.seed,
                };
                let strategy = if spec.config == "ort" { Strategy::Ddp } else { Strategy::Zero1 };
                Box::new(EngineTrainer::with_group(&cfg, &weights, spec.batch_size, spec.seq_len, opts, group, strategy)?)
            }
            other => bail!("config '{other}' is not implemented in this build"),
        })
    };

    // Ranks are threads of this worker; their records go through one channel to stdout.
    let (tx, rx) = std::sync::mpsc::channel::<Event>();
    let results: Vec<Result<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = LocalGroup::new(ranks)
            .into_iter()
            .map(|group| {
                let (tx, make, data) = (tx.clone(), &make, &data);
                s.spawn(move || -> Result<usize> {
                    let rank = group.rank();
                    let mut trainer = make(group)?;
                    for step in 0..spec.steps {
                        let batch = data.batch(step);
                        let t0 = Instant::now();
                        let st = trainer.step(&batch)?;
                        if let tch::Device::Cuda(i) = device {
                            tch::Cuda::synchronize(i as i64);
                        }
                        let step_ms = t0.elapsed().as_secs_f64() * 1e3;
                        if !st.loss.is_finite() && !st.skipped {
                            bail!("loss is {} at step {step}", st.loss);
                        }
                        let _ = tx.send(Event::Step { rank, step, loss: st.loss, step_ms, grad_norm: st.grad_norm, loss_scale: st.loss_scale, skipped: st.skipped });
                    }
                    Ok(trainer.optimizer_bytes())
                })
            })
            .collect();
        drop(tx);
        for e in rx {
            emit(out, &e);
        }
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))).collect()
    });
    let mut optimizer_bytes = 0;
    for r in results {
        optimizer_bytes = optimizer_bytes.max(r?);
    }
    if ortbench_engine::exec::profile::enabled() {
        eprintln!("per-op profile of {} ({} steps):\n{}", spec.config, spec.steps, ortbench_engine::exec::profile::format(&ortbench_engine::exec::profile::take()));
    }
    let peak_mem_bytes = peak_rss_bytes().context("reading peak memory")?;
    emit(out, &Event::Summary { param_count, peak_mem_bytes, optimizer_bytes_per_rank: optimizer_bytes });
    Ok(())
}

/// Peak resident set size of this process (VmHWM), the CPU run's peak memory.
pub fn peak_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).context("no VmHWM in /proc/self/status")?;
    let kb: u64 = line.split_whitespace().nth(1).context("VmHWM value")?.parse()?;
    Ok(kb * 1024)
}
