//! `ortbench worker`: executes one run in its own process (so peak memory is per run and a
//! crash takes only this run down) and streams JSON lines to the parent: a `step` record per
//! step, then a `summary` — or an `error`.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ortbench_engine::collective::tcp::DEFAULT_TIMEOUT;
use ortbench_engine::collective::{
    AnyGroup, Collective, DeviceGroup, LocalGroup, TcpGroup, Vendor,
};
use ortbench_engine::exec::gpu::session::RankLayout;
use ortbench_engine::parallel::Strategy;
use ortbench_engine::passes::PassConfig;
use ortbench_engine::DType;
use ortbench_models::config::ModelConfig;
use ortbench_models::graph::trainer::{EngineOptions, EngineTrainer, GpuEngineTrainer};
use ortbench_models::graph::GraphOptions;
use ortbench_models::torch::{panic_text, InjectedError, Precision, TorchTrainer, TrainOptions};
use ortbench_models::{Batch, DataSource, HubOptions, LrSchedule, Task, Weights};
use serde::{Deserialize, Serialize};

use crate::launch_env::LaunchEnv;
use crate::mem_split::TorchShapes;
use crate::run_spec::{RunSpec, WeightsSource};
use ortbench_engine::plan::split::MemorySplit;
use ortbench_report::output::MemSplit;

/// One line of the worker's output.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Step {
        rank: usize,
        step: usize,
        /// NaN or ±inf on a skipped (overflowed) step: written as strings ([`maybe_finite`]).
        #[serde(with = "maybe_finite")]
        loss: f64,
        step_ms: f64,
        /// On a GPU: the step's device time between CUDA events (`DeviceWatch`).
        #[serde(default)]
        device_ms: Option<f64>,
        #[serde(with = "maybe_finite")]
        grad_norm: f64,
        #[serde(with = "maybe_finite")]
        loss_scale: f64,
        skipped: bool,
    },
    Summary {
        param_count: usize,
        peak_mem_bytes: u64,
        optimizer_bytes_per_rank: usize,
        /// FLOPs one sample cost in the GEMMs and attention products this config executed
        /// (the engine's count, rows a loss ignores skipped), over the measured steps; None
        /// when the trainer cannot count them (the baseline).
        #[serde(default)]
        hw_flops_per_sample: Option<f64>,
        /// Seconds spent compiling before the first step ended (the `torch-compile` worker:
        /// its first step's wall time); None for the Rust workers, which compile nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        compile_s: Option<f64>,
        /// The largest rank's memory by what holds it (`mem_split`); None when the worker
        /// cannot say (a worker written before it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mem_split: Option<MemSplit>,
        /// The engine on a GPU: how its steps reached the device (results' `step_launches`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step_launches: Option<String>,
    },
    Error {
        message: String,
        oom: bool,
    },
}

/// A step's loss, gradient norm or loss scale in the workers' JSON lines: a number when finite,
/// else the string "NaN", "inf" or "-inf". JSON has no non-finite numbers — serde_json writes
/// them as null, Python's json module as the non-JSON tokens NaN and Infinity — and an
/// overflowed, skipped step has exactly those, which the harness must read to record the step.
/// Read back: a number, one of those strings (or Python's "Infinity"), or null (NaN).
pub mod maybe_finite {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        match *v {
            v if v.is_finite() => s.serialize_f64(v),
            v if v.is_nan() => s.serialize_str("NaN"),
            v if v > 0.0 => s.serialize_str("inf"),
            _ => s.serialize_str("-inf"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Null => Ok(f64::NAN),
            serde_json::Value::Number(n) => {
                n.as_f64().ok_or_else(|| serde::de::Error::custom(format!("not an f64: {n}")))
            }
            serde_json::Value::String(t) => match t.as_str() {
                "NaN" | "nan" => Ok(f64::NAN),
                "inf" | "Infinity" => Ok(f64::INFINITY),
                "-inf" | "-Infinity" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!("not a number: {other:?}"))),
            },
            other => Err(serde::de::Error::custom(format!("not a number: {other}"))),
        }
    }
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
    let fault = match std::env::var(FAULT_VAR) {
        Ok(v) if !v.trim().is_empty() => match Fault::parse(&v) {
            Ok(f) => Some(f).filter(|f| f.applies_to(&spec.config)),
            Err(e) => {
                emit(&mut out, &Event::Error { message: format!("{e:#}"), oom: false });
                return 2;
            }
        },
        _ => None,
    };
    match run(&spec, fault.as_ref(), &mut out) {
        Ok(()) => 0,
        Err(e) => {
            let message = format!("{e:#}");
            let oom = is_oom_message(&message);
            emit(&mut out, &Event::Error { message, oom });
            1
        }
    }
}

/// Messages allocators, libtorch and CUDA give when memory runs out (Rust's global
/// allocator aborts with "memory allocation of N bytes failed"; libtorch's CPU allocator says
/// "not enough memory"; CUDA "out of memory").
pub fn is_oom_message(m: &str) -> bool {
    let m = m.to_ascii_lowercase();
    [
        "out of memory",
        "cannot allocate memory",
        "failed to allocate",
        "not enough memory",
        "memory allocation of",
    ]
    .iter()
    .any(|p| m.contains(p))
}

/// The environment variable through which tests make a worker fail on purpose.
pub const FAULT_VAR: &str = "ORTBENCH_FAULT";

/// A failure injected into a worker (for the harness's fault tests):
/// `ORTBENCH_FAULT=KIND-at-step:N[@CONFIG]`, where KIND is
///
/// - `crash`: the process aborts (SIGABRT) before step N, as a crashing kernel would;
/// - `oom`: the process caps its address space a little above what it maps now and asks for
///   1 GiB, so the allocator really fails and Rust aborts with "memory allocation of … bytes
///   failed" (`oom` alone means `oom-at-step:0`);
/// - `hang`: the step never ends (for `--timeout-s` and interrupt tests);
/// - `stop`: the process stops itself with SIGSTOP, as a debugger or a frozen node would: it
///   keeps its sockets open and says nothing (for the hang deadlines and collective timeouts);
/// - `sigkill`: the process sends itself SIGKILL, as the kernel's OOM killer would;
/// - `torch-error`: the baseline's step N runs a libtorch op on mismatched shapes, which fails
///   inside libtorch as a real CUDA error would (tch panics on it; the step returns it);
/// - `cuda-oom`: the baseline's step N gets an error raised by libtorch with the text of
///   its CUDA out-of-memory (on any device: no GPU needed to see how one is recorded);
///
/// or `grad-scale:F[@CONFIG]`: a broken engine — every gradient an engine config computes
/// is multiplied by F on every rank and step (what the parity probe must flag).
///
/// `@CONFIG` limits the fault to the runs of that config (`torch-error` and `cuda-oom` are the
/// baseline's: `@pytorch`, implied). Only rank 0 fails, or the rank named by
/// `ORTBENCH_FAULT_RANK`.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    pub kind: FaultKind,
    pub step: usize,
    pub config: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FaultKind {
    Crash,
    Oom,
    Hang,
    Stop,
    Sigkill,
    /// A libtorch error inside the baseline's step.
    Torch(InjectedError),
    /// Multiply the engine's gradients by this factor (not a step-triggered fault).
    GradScale(f32),
}

impl Fault {
    pub fn parse(s: &str) -> Result<Fault> {
        let s = s.trim();
        let (what, config) = match s.split_once('@') {
            Some((w, c)) => (w, Some(c.to_string())),
            None => (s, None),
        };
        if let Some(f) = what.strip_prefix("grad-scale:") {
            let factor = f
                .parse::<f32>()
                .ok()
                .filter(|x| x.is_finite())
                .with_context(|| format!("{FAULT_VAR}={s}: bad factor '{f}'"))?;
            if config.as_deref() == Some("pytorch") {
                bail!("{FAULT_VAR}={s}: grad-scale breaks the engine; it does not apply to the pytorch config");
            }
            return Ok(Fault { kind: FaultKind::GradScale(factor), step: 0, config });
        }
        let (kind, step) = match what.split_once("-at-step:") {
            Some((k, n)) => (
                k,
                n.parse::<usize>().with_context(|| format!("{FAULT_VAR}={s}: bad step '{n}'"))?,
            ),
            None => (what, 0),
        };
        let kind = match kind {
            "crash" => FaultKind::Crash,
            "oom" => FaultKind::Oom,
            "hang" => FaultKind::Hang,
            "stop" => FaultKind::Stop,
            "sigkill" => FaultKind::Sigkill,
            "torch-error" => FaultKind::Torch(InjectedError::ShapeMismatch),
            "cuda-oom" => FaultKind::Torch(InjectedError::CudaOom),
            other => bail!("{FAULT_VAR}={s}: unknown fault '{other}' (crash, oom, hang, stop, sigkill, torch-error or cuda-oom, as KIND-at-step:N[@CONFIG], or grad-scale:F[@CONFIG])"),
        };
        let config = match (kind, config) {
            (FaultKind::Torch(_), None) => Some("pytorch".to_string()),
            (FaultKind::Torch(_), Some(c)) if c != "pytorch" => bail!(
                "{FAULT_VAR}={s}: {} fails inside libtorch; it applies to the pytorch config only",
                what.split("-at-step:").next().unwrap_or(what)
            ),
            (_, c) => c,
        };
        Ok(Fault { kind, step, config })
    }

    fn applies_to(&self, config: &str) -> bool {
        self.config.as_deref().is_none_or(|c| c == config)
    }

    fn trigger(&self) {
        // Let the worker's main thread print the steps already finished, so the records a
        // test sees do not depend on thread timing (a real crash may lose those in flight).
        std::thread::sleep(std::time::Duration::from_millis(200));
        match self.kind {
            // Not triggered here: injected into the trainer (`RankTrainer::inject`).
            FaultKind::GradScale(_) | FaultKind::Torch(_) => {}
            FaultKind::Crash => std::process::abort(),
            FaultKind::Hang => {
                // A child of its own first, as inductor's compile workers are: a kill of the
                // worker must end it too (harness::kill_group). Named for the test that looks.
                if let Ok(m) = std::env::var("ORTBENCH_FAULT_MARKER") {
                    // Its output not on the worker's pipes: were it to outlive the worker, the
                    // test must see it alive, not hang on a pipe it holds open.
                    let null = std::process::Stdio::null;
                    let _ = std::process::Command::new("sh")
                        .args(["-c", "sleep 3600; :", &format!("ortbench-fault-child-{m}")])
                        .stdin(null())
                        .stdout(null())
                        .stderr(null())
                        .spawn();
                }
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
            FaultKind::Sigkill => {
                // SAFETY: signalling our own process.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            FaultKind::Stop => {
                // SAFETY: signalling our own process; it resumes only on SIGCONT.
                unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
            }
            FaultKind::Oom => {
                let vm = std::fs::read_to_string("/proc/self/status")
                    .ok()
                    .and_then(|s| {
                        s.lines()
                            .find(|l| l.starts_with("VmSize:"))
                            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                    })
                    .unwrap_or(0)
                    * 1024;
                let limit = libc::rlimit { rlim_cur: vm + (256 << 20), rlim_max: vm + (256 << 20) };
                // SAFETY: setrlimit with a valid struct; it only lowers this process's limit.
                unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
                let v = vec![1u8; 1 << 30];
                std::hint::black_box(&v);
            }
        }
    }
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

/// What a rank reports when its steps are done: its optimizer state's bytes, the FLOPs it
/// executed over the measured steps (None: not counted) and its memory split (the engine's).
/// A rank's end: its optimizer bytes, FLOPs and memory split, and how its steps were launched.
type RankEnd = ((usize, Option<f64>, Option<MemorySplit>), Option<String>);

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
    /// FLOPs of the GEMMs and attention products the last step executed on this rank, when
    /// the trainer counts them.
    fn last_step_flops(&self) -> Option<f64> {
        None
    }
    /// This rank's memory by what holds it, from the engine's plan; None for the baseline
    /// (its split is derived from the run's shapes: `mem_split::torch`).
    fn memory_split(&self) -> Option<MemorySplit> {
        None
    }
    /// The engine on a GPU: how its steps reach the device ([`GpuEngineTrainer::step_launches`]).
    fn step_launches(&self) -> Option<String> {
        None
    }
    /// Makes the next step fail inside libtorch (the baseline only).
    fn inject(&mut self, e: InjectedError) -> Result<()> {
        bail!("{FAULT_VAR}: {e:?} is injected into the pytorch baseline only")
    }
}

/// A `pytorch` rank: libtorch eager, DDP across ranks (NCCL buckets on GPUs).
struct TorchRank {
    trainer: TorchTrainer,
    group: AnyGroup,
    nccl: Option<DeviceGroup>,
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
            let weight = if total == 0 {
                1.0 / n as f32
            } else {
                self.task.label_count(&local) as f32 / total as f32
            };
            match &self.nccl {
                Some(g) => self.trainer.step_ddp_nccl(&local, g, weight)?,
                None => self.trainer.step_ddp(&local, Some((&self.group, weight)))?,
            }
        };
        Ok(RankStep {
            loss: s.loss,
            grad_norm: s.grad_norm,
            loss_scale: s.loss_scale,
            skipped: s.skipped,
        })
    }
    fn optimizer_bytes(&self) -> usize {
        // torch.optim.AdamW keeps exp_avg and exp_avg_sq in fp32 for every parameter.
        8 * self.trainer.weights().param_count()
    }
    fn inject(&mut self, e: InjectedError) -> Result<()> {
        self.trainer.inject_error(e);
        Ok(())
    }
}

impl RankTrainer for EngineTrainer {
    fn step(&mut self, global: &Batch) -> Result<RankStep> {
        let s = EngineTrainer::step(self, global)?;
        Ok(RankStep {
            loss: f64::from(s.loss),
            grad_norm: f64::from(s.grad_norm),
            loss_scale: f64::from(s.loss_scale),
            skipped: s.skipped,
        })
    }
    fn optimizer_bytes(&self) -> usize {
        EngineTrainer::optimizer_bytes(self)
    }
    fn last_step_flops(&self) -> Option<f64> {
        EngineTrainer::last_step_flops(self)
    }
    fn memory_split(&self) -> Option<MemorySplit> {
        EngineTrainer::memory_split(self)
    }
}

/// An `ort` / `ort-zero1` rank on a GPU: alone, or one GPU of an NCCL group.
struct GpuRank {
    trainer: GpuEngineTrainer<ortbench_engine::backend::cuda::gpu::CudaGpu>,
    nccl: Option<DeviceGroup>,
}

impl RankTrainer for GpuRank {
    fn step(&mut self, global: &Batch) -> Result<RankStep> {
        let s = match &self.nccl {
            Some(g) => self.trainer.step_ranked(g, global)?,
            None => self.trainer.step(global)?,
        };
        Ok(RankStep {
            loss: f64::from(s.loss),
            grad_norm: f64::from(s.grad_norm),
            loss_scale: f64::from(s.loss_scale),
            skipped: s.skipped,
        })
    }
    fn optimizer_bytes(&self) -> usize {
        self.trainer.optimizer_bytes()
    }
    fn last_step_flops(&self) -> Option<f64> {
        Some(self.trainer.step_flops())
    }
    fn memory_split(&self) -> Option<MemorySplit> {
        Some(self.trainer.memory_split())
    }
    fn step_launches(&self) -> Option<String> {
        Some(self.trainer.step_launches())
    }
}

/// The model's config as a run trains it: `--task`'s head and `--dropout` applied.
pub fn model_config(spec: &RunSpec) -> Result<ModelConfig> {
    let resolved = ortbench_models::resolve(&spec.model, &HubOptions::from_env())?;
    let mut cfg = ortbench_models::with_task(resolved.config, spec.task.as_deref(), &spec.model)?;
    if let Some(p) = spec.dropout {
        cfg.set_dropout(p);
    }
    Ok(cfg)
}

/// What a run trains: the model's config (task and dropout applied), its initial weights (HF
/// initialisation from the seed, or the file's) and its global batches (batch_size × ranks
/// rows). Every config's worker gets them from here — the `torch-compile` one through the
/// files the harness writes from them (`torch_compile::prepare`) — so all train the same.
pub fn model_inputs(spec: &RunSpec) -> Result<(ModelConfig, Weights, DataSource)> {
    let cfg = model_config(spec)?;
    let weights = match &spec.weights {
        WeightsSource::Random => Weights::init(&cfg, spec.seed),
        WeightsSource::File(path) => Weights::load(&cfg, path, spec.seed)?.0,
    };
    // The global batch is --batch-size × --ranks; rank r takes rows r·b .. (r+1)·b.
    let global_batch = spec.batch_size * spec.ranks.max(1);
    let data = match &spec.data {
        Some(path) => {
            DataSource::from_file(&cfg, path, global_batch, Some(spec.seq_len), spec.seed)?
        }
        None => DataSource::synthetic(&cfg, global_batch, spec.seq_len, spec.seed)?,
    };
    Ok((cfg, weights, data))
}

/// Runs the spec in this worker: sets up, trains its ranks, then prints the summary record.
fn run(spec: &RunSpec, fault: Option<&Fault>, out: &mut impl Write) -> Result<()> {
    let (setup, tcp) = Setup::prepare(spec, fault)?;
    let in_process = if tcp.is_some() { 1 } else { setup.ranks };
    let fault_rank: usize =
        std::env::var("ORTBENCH_FAULT_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let results = setup.train_ranks(tcp, fault_rank, out);
    setup.emit_summary(results, in_process, out)
}

/// What the ranks of this worker share, set up before any of them starts: the run, its model
/// and data, the device (with its NCCL group and its watch) and the CPU threads. Fields drop
/// in declaration order: the device watch and the NCCL group before the model and its data.
struct Setup<'a> {
    spec: &'a RunSpec,
    fault: Option<&'a Fault>,
    /// On a GPU: times the steps on the device and measures the run's peak device memory.
    watch: Option<ortbench_engine::backend::cuda::watch::DeviceWatch>,
    /// A GPU rank process's NCCL group, taken by the trainer that reduces over it.
    nccl: std::sync::Mutex<Option<DeviceGroup>>,
    device: tch::Device,
    schedule: LrSchedule,
    /// `--ranks`, at least 1.
    ranks: usize,
    data: DataSource,
    weights: Weights,
    cfg: ModelConfig,
    task: Task,
    param_count: usize,
}

impl<'a> Setup<'a> {
    /// Checks the launch, loads the model and its data, joins the other rank processes (over
    /// TCP, and NCCL on a GPU) and sets the threads; returns the TCP group of a rank process.
    fn prepare(spec: &'a RunSpec, fault: Option<&'a Fault>) -> Result<(Self, Option<TcpGroup>)> {
        // Ranks are processes when a launcher started this worker (torchrun, srun, mpirun, or the
        // harness with torchrun's variables): it is one of them and joins the others over TCP; else
        // they are threads of this worker. Read and checked before the model loads, so that a bad
        // launch fails at once rather than after the load or while waiting for peers.
        let launch = LaunchEnv::from_env()?;
        let ranks = spec.ranks.max(1);
        if let Some(l) = &launch {
            if l.world != ranks {
                bail!(
                    "{} is '{}' but the run has --ranks {ranks}",
                    l.launcher.world_var(),
                    l.world
                );
            }
        }
        let (cfg, weights, data) = model_inputs(spec)?;
        let tcp = match &launch {
            Some(l) => {
                Some(TcpGroup::connect(l.rank, l.world, &l.master(), DEFAULT_TIMEOUT).map_err(
                    |e| anyhow::anyhow!("joining the ranks ({}): {e}", l.launcher.name()),
                )?)
            }
            None => None,
        };
        // A silent peer fails a collective after this long, naming it (crate::hang).
        let collective_timeout = crate::hang::collective_timeout(spec)?;
        let tcp = tcp
            .map(|g| g.with_collective_timeout(collective_timeout))
            .transpose()
            .map_err(|e| anyhow::anyhow!("--collective-timeout-s: {e}"))?;
        let schedule = match spec.lr_schedule.as_str() {
            "constant" => LrSchedule::Constant { warmup_steps: spec.lr_warmup_steps },
            "linear" => {
                LrSchedule::Linear { warmup_steps: spec.lr_warmup_steps, total_steps: spec.steps }
            }
            other => bail!("unknown --lr-schedule '{other}'"),
        };
        let mut device = parse_device(&spec.device)?;
        // libtorch sees CUDA only once libtorch_cuda is loaded (the linker drops it); before any
        // CUDA query. CPU runs never load it, so their memory is unchanged.
        if let tch::Device::Cuda(_) = device {
            crate::run_plan::load_libtorch_cuda(&spec.device)?;
        }
        // One GPU per rank process: `--device cuda` means the one GPU CUDA_VISIBLE_DEVICES leaves
        // the rank (srun's per-task binding), else cuda:LOCAL_RANK (torchrun's convention).
        if let (Some(l), "cuda") = (&launch, spec.device.as_str()) {
            device = tch::Device::Cuda(l.gpu()?);
        }
        // Ranks on GPUs: one process per GPU, the gradients reduced by NCCL in device memory (the
        // engine's flat buffers, the baseline's DDP buckets); the TCP group only exchanges NCCL's
        // id and the host scalars. In-process thread ranks would share one GPU, which NCCL refuses.
        let nccl = match (device, &tcp) {
            (tch::Device::Cuda(_), None) if ranks > 1 => {
                bail!("{} ranks on a GPU as threads: GPU ranks are processes, one per GPU (--launch processes, or a launcher's RANK/WORLD_SIZE)", ranks)
            }
            (tch::Device::Cuda(i), Some(g)) => {
                let d = DeviceGroup::with_timeout(Vendor::Nvidia, g, i, collective_timeout)
                    .map_err(|e| {
                        anyhow::anyhow!("rank {} joining NCCL on GPU {i}: {e}", g.rank())
                    })?;
                Some(d)
            }
            _ => None,
        };
        let nccl = std::sync::Mutex::new(nccl);
        // On a GPU: step device time by CUDA events and the run's peak device memory, measured the
        // same way for every config (engine::backend::cuda::watch).
        let watch = match device {
            tch::Device::Cuda(i) => Some(
                ortbench_engine::backend::cuda::watch::DeviceWatch::start(i)
                    .map_err(|e| anyhow::anyhow!("measuring GPU {i}: {e}"))?,
            ),
            _ => None,
        };
        // On the CPU, the ranks on this machine split its cores (the launcher's local world size
        // when it says one).
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let local = launch.as_ref().and_then(|l| l.local_world).unwrap_or(ranks);
        let threads = (cores / local.max(1)).max(1);
        tch::set_num_threads(threads as i32);
        ortbench_engine::backend::cpu::gemm::set_num_threads(threads);

        let param_count = weights.param_count();
        let task = Task::for_config(&cfg);
        let setup = Setup {
            spec,
            fault,
            watch,
            nccl,
            device,
            schedule,
            ranks,
            data,
            weights,
            cfg,
            task,
            param_count,
        };
        Ok((setup, tcp))
    }

    /// One rank's trainer for the run's config: the baseline, or the engine (on the CPU or on
    /// a GPU), reducing over `group` (and over the NCCL group on a GPU).
    fn make_trainer(&self, group: AnyGroup) -> Result<Box<dyn RankTrainer>> {
        let (spec, fault, device) = (self.spec, self.fault, self.device);
        let (cfg, weights, data, nccl) = (&self.cfg, &self.weights, &self.data, &self.nccl);
        Ok(match spec.config.as_str() {
            "pytorch" => {
                let opts = TrainOptions {
                    lr: spec.lr,
                    weight_decay: spec.weight_decay,
                    max_grad_norm: spec.max_grad_norm,
                    schedule: self.schedule,
                    precision: precision(&spec.precision)?,
                    ..TrainOptions::default()
                };
                let trainer = TorchTrainer::new(cfg, weights, device, opts)?;
                let nccl = nccl.lock().map_err(|_| anyhow::anyhow!("NCCL group lock"))?.take();
                Box::new(TorchRank { trainer, group, nccl, task: self.task, rows: spec.batch_size })
            }
            "ort" | "ort-zero1" => {
                let opts = EngineOptions {
                    lr: spec.lr,
                    weight_decay: spec.weight_decay,
                    max_grad_norm: spec.max_grad_norm,
                    schedule: self.schedule,
                    precision: spec.precision.parse::<DType>()?,
                    seed: spec.seed,
                };
                let strategy = if spec.config == "ort" { Strategy::Ddp } else { Strategy::Zero1 };
                // ORTBENCH_PASSES=none (or -fuse_attention, …) measures what the passes buy.
                // A padded --data file (an attention_mask) builds the graph with the mask input.
                let graph = GraphOptions::new(spec.batch_size, spec.seq_len)
                    .with_passes(PassConfig::from_env()?)
                    .with_attention_mask(data.has_attention_mask());
                if let tch::Device::Cuda(i) = device {
                    if matches!(fault, Some(Fault { kind: FaultKind::GradScale(_), .. })) {
                        bail!(
                            "ORTBENCH_FAULT=grad-scale is not implemented for the engine on a GPU"
                        );
                    }
                    let gpu = ortbench_engine::backend::cuda::gpu::CudaGpu::open(i)
                        .map_err(|e| anyhow::anyhow!("opening GPU {i} for the engine: {e}"))?;
                    let layout =
                        RankLayout { rank: group.rank(), world: group.world_size(), strategy };
                    let nccl = nccl.lock().map_err(|_| anyhow::anyhow!("NCCL group lock"))?.take();
                    return Ok(Box::new(GpuRank {
                        trainer: GpuEngineTrainer::ranked(cfg, weights, &graph, opts, gpu, layout)?,
                        nccl,
                    }));
                }
                let mut t =
                    EngineTrainer::with_graph_options(cfg, weights, &graph, opts, group, strategy)?;
                if let Some(Fault { kind: FaultKind::GradScale(f), .. }) = fault {
                    t.inject_grad_scale(*f);
                }
                Box::new(t)
            }
            other => bail!("config '{other}' is not implemented in this build"),
        })
    }

    /// Runs the ranks as threads of this worker (one, in a rank process) and prints their step
    /// records as they come; returns how each rank ended.
    fn train_ranks(
        &self,
        tcp: Option<TcpGroup>,
        fault_rank: usize,
        out: &mut impl Write,
    ) -> Vec<Result<RankEnd>> {
        // Ranks are threads of this worker; their records go through one channel to stdout.
        let (tx, rx) = std::sync::mpsc::channel::<Event>();
        std::thread::scope(|s| {
            let groups: Vec<AnyGroup> = match tcp {
                Some(g) => vec![g.into()],
                None => LocalGroup::new(self.ranks).into_iter().map(AnyGroup::from).collect(),
            };
            let handles: Vec<_> = groups
                .into_iter()
                .map(|group| {
                    let tx = tx.clone();
                    s.spawn(move || self.train_rank(group, fault_rank, tx))
                })
                .collect();
            drop(tx);
            for e in rx {
                emit(out, &e);
            }
            // A panic (e.g. a libtorch error outside the baseline's step) keeps its message, so an
            // out-of-memory in it is recognised as one.
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|p| {
                        Err(anyhow::anyhow!("a rank panicked: {}", panic_text(&*p)))
                    })
                })
                .collect()
        })
    }

    /// Trains one rank for the run's steps, injecting the fault at its step on `fault_rank`,
    /// and sends a step record per step; returns what the summary needs of the rank.
    fn train_rank(
        &self,
        group: AnyGroup,
        fault_rank: usize,
        tx: std::sync::mpsc::Sender<Event>,
    ) -> Result<RankEnd> {
        let (spec, fault, device) = (self.spec, self.fault, self.device);
        let rank = group.rank();
        let mut trainer = self.make_trainer(group)?;
        // This rank's executed FLOPs over the measured steps (None: not counted).
        let mut flops = Some(0.0);
        for step in 0..spec.steps {
            if let Some(f) = fault.filter(|f| {
                f.step == step && rank == fault_rank && !matches!(f.kind, FaultKind::GradScale(_))
            }) {
                match f.kind {
                    FaultKind::Torch(e) => trainer.inject(e)?,
                    _ => f.trigger(),
                }
            }
            let batch = self.data.batch(step);
            let t0 = Instant::now();
            // One rank per device: rank 0 times the device (ranks > 1 on one GPU
            // share its stream, so their events would overlap).
            let timed = self.watch.as_ref().filter(|_| rank == 0);
            if let Some(w) = timed {
                w.begin_step().map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            // A failed collective (a silent peer) names its step, as the engine's
            // trainer says "engine step k" itself.
            let st = match spec.config.as_str() {
                "pytorch" => {
                    trainer.step(&batch).with_context(|| format!("pytorch step {step}"))?
                }
                _ => trainer.step(&batch)?,
            };
            let device_ms = match timed {
                Some(w) => Some(w.end_step().map_err(|e| anyhow::anyhow!("{e}"))?),
                None => None,
            };
            // The engine's step ends with its status read (a synchronise); libtorch's
            // queued work is waited for here.
            // An asynchronous CUDA error of the step surfaces here (tch panics on it).
            if let (tch::Device::Cuda(i), "pytorch") = (device, spec.config.as_str()) {
                ortbench_models::torch::catch_torch(
                    &format!("pytorch step {step}: synchronising GPU {i}"),
                    || {
                        tch::Cuda::synchronize(i as i64);
                        Ok(())
                    },
                )?;
            }
            let step_ms = t0.elapsed().as_secs_f64() * 1e3;
            if step >= spec.warmup {
                flops = flops.zip(trainer.last_step_flops()).map(|(a, b)| a + b);
            }
            if !st.loss.is_finite() && !st.skipped {
                bail!("loss is {} at step {step}", st.loss);
            }
            let _ = tx.send(Event::Step {
                rank,
                step,
                loss: st.loss,
                step_ms,
                device_ms,
                grad_norm: st.grad_norm,
                loss_scale: st.loss_scale,
                skipped: st.skipped,
            });
        }
        let end = (trainer.optimizer_bytes(), flops, trainer.memory_split());
        Ok((end, trainer.step_launches()))
    }

    /// Folds the ranks' ends (the first failed rank's error, else the largest rank's optimizer
    /// state and split, the FLOPs per sample) with the run's peak memory into the summary
    /// record, and prints it; under ORTBENCH_PROFILE=1 prints the per-op profile first.
    fn emit_summary(
        &self,
        results: Vec<Result<RankEnd>>,
        in_process: usize,
        out: &mut impl Write,
    ) -> Result<()> {
        let spec = self.spec;
        let mut optimizer_bytes = 0;
        let mut flops = Some(0.0);
        // Per rank: the largest rank's split, as the peak and the optimizer state are.
        let mut plan_split: Option<MemorySplit> = None;
        let mut step_launches = None;
        for r in results {
            let ((bytes, f, split), launches) = r?;
            step_launches = step_launches.or(launches);
            optimizer_bytes = optimizer_bytes.max(bytes);
            flops = flops.zip(f).map(|(a, b)| a + b);
            if split.is_some_and(|s| plan_split.is_none_or(|p| s.total() > p.total())) {
                plan_split = split;
            }
        }
        // Samples this process's ranks trained (all of them with thread ranks, one rank's share in
        // a rank process: each reports its own, the same per sample).
        let measured = (spec.steps - spec.warmup.min(spec.steps)) * spec.batch_size * in_process;
        let hw_flops_per_sample = flops.filter(|_| measured > 0).map(|f| f / measured as f64);
        if ortbench_engine::exec::profile::enabled() {
            eprintln!(
                "per-op profile of {} ({} steps):\n{}",
                spec.config,
                spec.steps,
                ortbench_engine::exec::profile::format(&ortbench_engine::exec::profile::take())
            );
        }
        // The CPU's peak is the process's RSS; a GPU run's is its peak device memory.
        let peak_mem_bytes = match &self.watch {
            Some(w) => w.peak_bytes(),
            None => peak_rss_bytes().context("reading peak memory")?,
        };
        let mem_split = match spec.config.as_str() {
            "pytorch" => {
                // A cross-entropy over fp32 logits: a language model's head (every position, as
                // HF computes them) or a token classifier's; other heads and autocast: unknown.
                let classes = match self.task {
                    Task::MaskedLm | Task::CausalLm => Some(self.cfg.vocab_size()),
                    Task::TokenClassification { num_labels } => Some(num_labels),
                    Task::SequenceClassification { .. } => None,
                };
                let rows = (spec.batch_size * spec.seq_len) as u64;
                let shapes = TorchShapes {
                    params: self.param_count as u64,
                    optimizer_bytes: optimizer_bytes as u64,
                    ce_logits: classes
                        .filter(|_| spec.precision == "fp32")
                        .map(|c| (rows, c as u64)),
                    ranks_in_process: in_process,
                };
                Some(crate::mem_split::torch(&shapes, Some(peak_mem_bytes)))
            }
            _ => plan_split.as_ref().map(crate::mem_split::from_plan),
        };
        emit(
            out,
            &Event::Summary {
                param_count: self.param_count,
                peak_mem_bytes,
                optimizer_bytes_per_rank: optimizer_bytes,
                hw_flops_per_sample,
                compile_s: None,
                mem_split,
                step_launches,
            },
        );
        Ok(())
    }
}

/// Peak resident set size of this process (VmHWM), the CPU run's peak memory.
pub fn peak_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .context("no VmHWM in /proc/self/status")?;
    let kb: u64 = line.split_whitespace().nth(1).context("VmHWM value")?.parse()?;
    Ok(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse() {
        assert_eq!(
            Fault::parse("crash-at-step:3").unwrap(),
            Fault { kind: FaultKind::Crash, step: 3, config: None }
        );
        assert_eq!(
            Fault::parse("oom").unwrap(),
            Fault { kind: FaultKind::Oom, step: 0, config: None }
        );
        let f = Fault::parse("hang-at-step:1@ort").unwrap();
        assert_eq!((f.kind, f.step, f.config.as_deref()), (FaultKind::Hang, 1, Some("ort")));
        assert!(f.applies_to("ort") && !f.applies_to("ort-zero1"));
        assert!(Fault::parse("explode")
            .unwrap_err()
            .to_string()
            .contains("unknown fault 'explode'"));
        assert!(Fault::parse("crash-at-step:x").is_err());
        let f = Fault::parse("grad-scale:2@ort").unwrap();
        assert_eq!((f.kind, f.config.as_deref()), (FaultKind::GradScale(2.0), Some("ort")));
        assert!(Fault::parse("grad-scale:x").is_err());
        assert!(Fault::parse("grad-scale:2@pytorch")
            .unwrap_err()
            .to_string()
            .contains("does not apply"));
        let f = Fault::parse("torch-error-at-step:1").unwrap();
        assert_eq!(
            (f.kind, f.step, f.config.as_deref()),
            (FaultKind::Torch(InjectedError::ShapeMismatch), 1, Some("pytorch"))
        );
        assert_eq!(
            Fault::parse("cuda-oom@pytorch").unwrap().kind,
            FaultKind::Torch(InjectedError::CudaOom)
        );
        assert!(Fault::parse("cuda-oom@ort")
            .unwrap_err()
            .to_string()
            .contains("pytorch config only"));
    }

    #[test]
    fn oom_messages_are_recognised() {
        assert!(is_oom_message("memory allocation of 1073741824 bytes failed"));
        assert!(is_oom_message("CUDA out of memory. Tried to allocate 2.00 GiB"));
        assert!(is_oom_message(
            "DefaultCPUAllocator: not enough memory: you tried to allocate 123 bytes"
        ));
        assert!(!is_oom_message("index out of range"));
        assert!(is_oom_message(InjectedError::CUDA_OOM_MESSAGE));
    }
}
