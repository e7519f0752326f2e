//! `ortbench worker`: executes one run in its own process (so peak memory is per run and a
//! crash takes only this run down) and streams JSON lines to the parent: a `step` record per
//! step, then a `summary` — or an `error`.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ortbench_engine::DType;
use ortbench_models::graph::train::{EngineOptions, EngineTrainer};
use ortbench_models::torch::{Precision, TorchTrainer, TrainOptions};
use ortbench_models::{DataSource, HubOptions, LrSchedule, Weights};
use serde::{Deserialize, Serialize};

use crate::spec::{RunSpec, WeightsSource};

/// One line of the worker's output.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Step { rank: usize, step: usize, loss: f64, step_ms: f64, grad_norm: f64, loss_scale: f64, skipped: bool },
    Summary { param_count: usize, peak_mem_bytes: u64 },
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
    let data = match &spec.data {
        Some(path) => DataSource::from_file(&cfg, path, spec.batch_size, Some(spec.seq_len), spec.seed)?,
        None => DataSource::synthetic(&cfg, spec.batch_size, spec.seq_len, spec.seed)?,
    };
    let schedule = match spec.lr_schedule.as_str() {
        "constant" => LrSchedule::Constant { warmup_steps: spec.lr_warmup_steps },
        "linear" => LrSchedule::Linear { warmup_steps: spec.lr_warmup_steps, total_steps: spec.steps },
        other => bail!("unknown --lr-schedule '{other}'"),
    };
    let opts = TrainOptions {
        lr: spec.lr,
        weight_decay: spec.weight_decay,
        max_grad_norm: spec.max_grad_norm,
        schedule,
        precision: precision(&spec.precision)?,
        ..TrainOptions::default()
    };
    let schedule = opts.schedule;
    let device = parse_device(&spec.device)?;
    let param_count = weights.param_count();
    match spec.config.as_str() {
        "pytorch" => {
            let mut trainer = TorchTrainer::new(&cfg, &weights, device, opts)?;
            drop(weights);
            for step in 0..spec.steps {
                let batch = data.batch(step);
                let t0 = Instant::now();
                let s = trainer.step(&batch)?;
                if let tch::Device::Cuda(i) = device {
                    tch::Cuda::synchronize(i as i64);
                }
                let step_ms = t0.elapsed().as_secs_f64() * 1e3;
                if !s.loss.is_finite() && !s.skipped {
                    bail!("loss is {} at step {step}", s.loss);
                }
                emit(out, &Event::Step { rank: 0, step, loss: s.loss, step_ms, grad_norm: s.grad_norm, loss_scale: s.loss_scale, skipped: s.skipped });
            }
        }
        "ort" => {
            let engine_opts = EngineOptions {
                lr: spec.lr,
                weight_decay: spec.weight_decay,
                max_grad_norm: spec.max_grad_norm,
                schedule,
                precision: spec.precision.parse::<DType>()?,
                seed: spec.seed,
            };
            if device != tch::Device::Cpu {
                bail!("the engine runs on the CPU in this build; use --device cpu for the ort config");
            }
            let mut trainer = EngineTrainer::new(&cfg, &weights, spec.batch_size, spec.seq_len, engine_opts)?;
            drop(weights);
            for step in 0..spec.steps {
                let batch = data.batch(step);
                let t0 = Instant::now();
                let s = trainer.step(&batch)?;
                let step_ms = t0.elapsed().as_secs_f64() * 1e3;
                if !s.loss.is_finite() && !s.skipped {
                    bail!("loss is {} at step {step}", s.loss);
                }
                let (loss, grad_norm, loss_scale) = (f64::from(s.loss), f64::from(s.grad_norm), f64::from(s.loss_scale));
                emit(out, &Event::Step { rank: 0, step, loss, step_ms, grad_norm, loss_scale, skipped: s.skipped });
            }
        }
        other => bail!("config '{other}' is not implemented in this build"),
    }
    if ortbench_engine::exec::profile::enabled() {
        eprintln!("per-op profile of {} ({} steps):\n{}", spec.config, spec.steps, ortbench_engine::exec::profile::format(&ortbench_engine::exec::profile::take()));
    }
    let peak_mem_bytes = peak_rss_bytes().context("reading peak memory")?;
    emit(out, &Event::Summary { param_count, peak_mem_bytes });
    Ok(())
}

/// Peak resident set size of this process (VmHWM), the CPU run's peak memory.
pub fn peak_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).context("no VmHWM in /proc/self/status")?;
    let kb: u64 = line.split_whitespace().nth(1).context("VmHWM value")?.parse()?;
    Ok(kb * 1024)
}
