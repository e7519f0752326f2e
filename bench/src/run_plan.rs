//! Turns `run`'s arguments into a validated plan of runs. Everything a user can get wrong is
//! checked here, before any output is written.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ortbench_models::{resolve, DataSource, HubOptions, ResolvedModel, Weights};

use crate::cli::RunArgs;
use crate::run_spec::{
    RunSpec, WeightsSource, CONFIGS, DEFAULT_CONFIGS, IMPLEMENTED_CONFIGS, PRECISIONS,
};
use crate::worker::parse_device;

pub struct RunPlan {
    /// One spec per (model, config, precision), in model order.
    pub runs: Vec<RunSpec>,
    /// What to execute, in order: each spec's parity probe, then its timed repeats
    /// interleaved with the other configs of the model.
    pub jobs: Vec<Job>,
    /// Analytic training FLOPs of one sample of each run (metrics::train_flops_per_sample).
    pub train_flops_per_sample: Vec<f64>,
    /// Human-readable settings, printed before the runs start.
    pub settings: String,
    /// `--batch-size auto`: after the fixed-batch runs, each spec's largest batch within this
    /// budget ([`crate::batch_search`]).
    pub auto_batch: Option<crate::batch_search::AutoBatch>,
}

/// Which kind of run a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A measured run (the spec as given).
    Timed,
    /// The parity probe: dropout 0, the probe's learning rate, no warm-up.
    Parity,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Timed => "timed",
            Phase::Parity => "parity",
        }
    }
}

/// One worker process to start: run `spec` (an index into `RunPlan::runs`) in `phase`.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub spec: usize,
    pub phase: Phase,
    pub repeat: usize,
}

/// The order of a model's runs: its specs `first..first + n` (configs × precisions), first
/// every parity probe, then `repeat` rounds of timed runs, round r rotated left by r so no
/// config always runs first (a machine warming up, or another job starting, then does not
/// favour one config).
pub fn interleave(first: usize, n: usize, repeat: usize, probe: bool) -> Vec<Job> {
    let mut jobs = Vec::new();
    if probe {
        jobs.extend((first..first + n).map(|spec| Job { spec, phase: Phase::Parity, repeat: 0 }));
    }
    for r in 0..repeat {
        jobs.extend((0..n).map(|i| Job {
            spec: first + (i + r) % n,
            phase: Phase::Timed,
            repeat: r,
        }));
    }
    jobs
}

/// The spec a parity probe runs: `spec` with dropout 0, `steps` steps, no warm-up, and a
/// constant learning rate `lr`.
/// The longest time limit a flag takes, in seconds (about 31 years): anything a Duration can
/// hold with room to add it to an Instant.
pub const MAX_SECONDS: f64 = 1e9;

pub fn parity_spec(spec: &RunSpec, steps: usize, lr: f64) -> RunSpec {
    RunSpec {
        steps,
        warmup: 0,
        dropout: Some(0.0),
        lr,
        lr_schedule: "constant".into(),
        lr_warmup_steps: 0,
        ..spec.clone()
    }
}

fn positive(name: &str, v: Option<i64>, default: usize) -> Result<usize> {
    match v {
        None => Ok(default),
        Some(v) if v > 0 => Ok(v as usize),
        Some(v) => bail!("{name} must be a positive integer, got {v}"),
    }
}

/// `--device rocm[:i]`: what this build can say about AMD GPUs — the HIP runtime missing, the
/// GPU index out of range, or (with a GPU) that no config runs there yet: the engine's HIP
/// executor and a ROCm libtorch for the baseline are not built (README, "Devices"). Always an
/// error, so a run never falls back to the CPU behind the user's back.
fn rocm_refusal(device: &str) -> Result<()> {
    let index = match device.strip_prefix("rocm:") {
        None => 0,
        Some(i) => i.parse::<usize>().map_err(|_| {
            anyhow::anyhow!("unknown device '{device}': use cpu, cuda, cuda:N, rocm or rocm:N")
        })?,
    };
    let n = ortbench_engine::backend::hip::device_count()
        .map_err(|e| anyhow::anyhow!("--device {device}: {e}"))?;
    if index >= n {
        bail!("--device {device}: the HIP runtime sees {n} AMD GPU(s)");
    }
    bail!("--device {device}: AMD GPU found, but no config runs on ROCm yet (the engine's HIP executor and a ROCm libtorch for the baseline are not built; see README, Devices)")
}

/// Loads libtorch_cuda beside the libtorch in this process (`torch_wheel::load_libtorch_cuda`)
/// before any CUDA query of tch: without it libtorch counts 0 CUDA devices. An error is one
/// line (a CPU-only torch, or why the loader refused it).
pub fn load_libtorch_cuda(device: &str) -> Result<PathBuf> {
    ortbench_engine::torch_wheel::load_libtorch_cuda()
        .map_err(|e| anyhow::anyhow!("--device {device}: {e}"))
}

/// `--device`, checked against what this process can reach (a ROCm device is always refused,
/// a CUDA index must exist); true for a GPU.
fn check_device(device: &str) -> Result<bool> {
    if device == "rocm" || device.starts_with("rocm:") {
        rocm_refusal(device)?;
    }
    if let tch::Device::Cuda(i) = parse_device(device)? {
        // libtorch sees CUDA only once libtorch_cuda is loaded (the linker drops it).
        load_libtorch_cuda(device)?;
        let n = tch::Cuda::device_count() as usize;
        if i >= n {
            bail!("--device {device}: {n} CUDA device(s) available");
        }
    }
    Ok(device != "cpu")
}

/// GPU ranks: one process per GPU, cuda:0 .. cuda:N-1 (LOCAL_RANK), joined by NCCL.
fn check_gpu_ranks(args: &RunArgs, device: &str, ranks: usize) -> Result<()> {
    if args.launch == "threads" {
        bail!("--launch threads with --device {device}: GPU ranks are processes, one per GPU (NCCL refuses two ranks on one GPU)");
    }
    if device != "cuda" {
        bail!("--ranks {ranks} with --device {device}: ranks take cuda:0 .. cuda:{} by LOCAL_RANK; use --device cuda", ranks - 1);
    }
    let n = tch::Cuda::device_count() as usize;
    if ranks > n {
        bail!(
            "--ranks {ranks} on --device cuda: {n} CUDA device(s) available, one per rank needed"
        );
    }
    Ok(())
}

pub fn make_plan(args: &RunArgs) -> Result<RunPlan> {
    let device = args.device.trim().to_string();
    let cuda = check_device(&device)?;
    let steps = positive("--steps", args.steps, if cuda { 50 } else { 8 })?;
    let warmup = match args.warmup {
        None => (if cuda { 10 } else { 2 }).min(steps - 1),
        Some(w) if w < 0 => bail!("--warmup must be zero or positive, got {w}"),
        Some(w) => w as usize,
    };
    if warmup >= steps {
        bail!("--warmup ({warmup}) must be less than --steps ({steps}): no step would be measured");
    }
    // On a GPU the defaults are what a user trains at there: bf16 autocast, batch 32 × seq 512.
    // `auto` runs the fixed-batch comparison at the default, then searches each config's largest.
    let default_batch = if cuda { 32 } else { 8 };
    let (batch_size, auto) = match args.batch_size.as_deref().map(str::trim) {
        None => (default_batch, false),
        Some("auto") => (default_batch, true),
        Some(v) => match v.parse::<i64>() {
            Ok(n) => (positive("--batch-size", Some(n), default_batch)?, false),
            Err(_) => bail!("--batch-size must be a positive integer or auto, got '{v}'"),
        },
    };
    let precisions: Vec<String> = if args.precision.is_empty() {
        vec![if cuda { "bf16" } else { "fp32" }.to_string()]
    } else {
        args.precision.iter().map(|p| p.trim().to_string()).collect()
    };
    let ranks = positive("--ranks", args.ranks, 1)?;
    if !matches!(args.launch.as_str(), "processes" | "threads") {
        bail!("unknown --launch '{}': use processes or threads", args.launch);
    }
    let processes = if args.launch == "processes" { ranks } else { 1 };
    let auto_batch =
        crate::batch_search::plan_budget(auto, args.memory_budget, &device, processes)?;
    if ranks > 1 && cuda {
        check_gpu_ranks(args, &device, ranks)?;
    }
    let seq_arg = match args.seq_len {
        None => None,
        Some(_) => Some(positive("--seq-len", args.seq_len, 0)?),
    };
    check_training_flags(args)?;
    let repeat = positive("--repeat", args.repeat, 3)?;
    let configs = select_configs(args, ranks, steps)?;
    for p in &precisions {
        if !PRECISIONS.contains(&p.as_str()) {
            bail!("unknown precision '{p}': known precisions are {}", PRECISIONS.join(", "));
        }
    }
    if let Some(d) = &args.data {
        if !d.is_file() {
            bail!("--data {}: no such file", d.display());
        }
    }

    let hub = HubOptions::from_env();
    let mut runs = Vec::new();
    let mut train_flops_per_sample = Vec::new();
    let mut seq_used: Vec<usize> = Vec::new();
    let mut jobs = Vec::new();
    for model in &args.models {
        let first = runs.len();
        let mut resolved = resolve(model, &hub)?;
        resolved.config = ortbench_models::with_task(resolved.config, args.task.as_deref(), model)?;
        let weights = weights_source(&args.weights, &resolved, &hub)?;
        if let WeightsSource::File(path) = &weights {
            check_weights_file(model, &resolved, path, args.seed)?;
        }
        let (data, seq_len) =
            model_data(args, model, &resolved, seq_arg, cuda, batch_size * ranks, batch_size)?;
        if !seq_used.contains(&seq_len) {
            seq_used.push(seq_len);
        }
        let flops = crate::metrics::train_flops_per_sample(&resolved.config, seq_len);
        for config in &configs {
            for precision in &precisions {
                train_flops_per_sample.push(flops);
                runs.push(RunSpec {
                    model: model.trim().to_string(),
                    config: config.clone(),
                    precision: precision.clone(),
                    device: device.clone(),
                    batch_size,
                    ranks,
                    launch: args.launch.clone(),
                    seq_len,
                    steps,
                    // torch-compile's first step compiles: it is never a timed step.
                    warmup: if config == crate::torch_compile::CONFIG {
                        warmup.max(1)
                    } else {
                        warmup
                    },
                    seed: args.seed,
                    lr: args.lr,
                    weight_decay: args.weight_decay,
                    max_grad_norm: args.max_grad_norm,
                    lr_schedule: args.lr_schedule.clone(),
                    lr_warmup_steps: args.lr_warmup_steps,
                    dropout: args.dropout,
                    data: data.clone(),
                    task: args.task.clone(),
                    task_name: ortbench_models::data::Task::for_config(&resolved.config)
                        .name()
                        .to_string(),
                    weights: weights.clone(),
                    collective_timeout_s: args.collective_timeout_s,
                });
            }
        }
        jobs.extend(interleave(first, runs.len() - first, repeat, args.parity_steps() > 0));
    }
    let probe = if args.parity_steps() > 0 {
        format!("parity probe {} steps at lr {:e}, dropout 0", args.parity_steps(), args.parity_lr)
    } else {
        "no parity probe".into()
    };
    let auto_note = auto_batch.as_ref().map_or(String::new(), |a| {
        format!(
            ", then per config the largest batch within {:.0} MiB per process ({})",
            a.budget_bytes as f64 / (1u64 << 20) as f64,
            a.source
        )
    });
    let engine_notes = passes_note()? + &bf16_gemm_note()?;
    let settings = format!(
        "device {device}, batch {batch_size} × {ranks} rank(s), seq {}, steps {steps} (warm-up {warmup}) × {repeat} interleaved run(s), {probe}, precision {}, seed {}{auto_note}{engine_notes}",
        seq_used.iter().map(|s| s.to_string()).collect::<Vec<_>>().join("/"),
        precisions.join("/"),
        args.seed
    );
    Ok(RunPlan { runs, jobs, train_flops_per_sample, settings, auto_batch })
}

/// The data file a model's runs read (a tokenised `--dataset`, `--data`, or none for synthetic
/// batches of `batch`) and their sequence length; `rows` is the batch across ranks.
fn model_data(
    args: &RunArgs,
    model: &str,
    resolved: &ResolvedModel,
    seq_arg: Option<usize>,
    cuda: bool,
    rows: usize,
    batch: usize,
) -> Result<(Option<PathBuf>, usize)> {
    // Default 128 (512 on a GPU), or the model's positions when it has fewer.
    let default_seq = (if cuda { 512 } else { 128 }).min(resolved.config.max_positions());
    // --dataset: tokenised (or found in the cache) once here; the workers read the file.
    let data = match &args.dataset {
        Some(ds) => {
            let cols = ortbench_models::text::Columns {
                text: args.text_column.clone(),
                label: args.label_column.clone(),
            };
            let max = seq_arg.unwrap_or(default_seq);
            Some(crate::dataset::prepare(resolved, &resolved.config, ds, &cols, max)?)
        }
        None => args.data.clone(),
    };
    // A tokenised dataset sets its own length (its longest row); --seq-len was its cap.
    let seq_for_file = if args.dataset.is_some() { None } else { seq_arg };
    let seq_len = match &data {
        Some(path) => {
            DataSource::from_file(&resolved.config, path, rows, seq_for_file, args.seed)
                .with_context(|| format!("model '{model}'"))?
                .seq_len
        }
        None => {
            let s = seq_arg.unwrap_or(default_seq);
            DataSource::synthetic(&resolved.config, batch, s, args.seed)
                .with_context(|| format!("model '{model}'"))?;
            s
        }
    };
    Ok((data, seq_len))
}

/// The settings' note of the engine configs' passes when ORTBENCH_PASSES narrows them (the
/// results depend on it), else empty; a bad value stops the run before any worker starts.
fn passes_note() -> Result<String> {
    use ortbench_engine::passes::{PassConfig, ENV_VAR};
    PassConfig::from_env()?;
    Ok(match std::env::var(ENV_VAR) {
        Ok(v) => format!(", engine passes {ENV_VAR}={v}"),
        Err(_) => String::new(),
    })
}

/// The settings' note when ORTBENCH_CPU_BF16_GEMM or ORTBENCH_CPU_AMX chooses what multiplies
/// the CPU engine's bf16 matmuls (the step time depends on it), else empty; a bad value stops
/// the run.
fn bf16_gemm_note() -> Result<String> {
    use ortbench_engine::backend::cpu::blas::{
        amx_setting, bf16_gemm_setting, AMX_VAR, BF16_GEMM_VAR,
    };
    let mut note = String::new();
    for (var, setting) in [(BF16_GEMM_VAR, bf16_gemm_setting()), (AMX_VAR, amx_setting())] {
        if let Some(on) = setting.map_err(|e| anyhow::anyhow!(e))? {
            note += &format!(", {var}={}", u8::from(on));
        }
    }
    Ok(note)
}

/// The training and harness flags that are numbers: finite, in range, and (time limits) short
/// enough for a `Duration`; and the flags that do not combine.
fn check_training_flags(args: &RunArgs) -> Result<()> {
    for (name, v) in [
        ("--lr", args.lr),
        ("--weight-decay", args.weight_decay),
        ("--max-grad-norm", args.max_grad_norm),
    ] {
        if !v.is_finite() || v < 0.0 {
            bail!("{name} must be a finite non-negative number, got {v}");
        }
    }
    if let Some(p) = args.dropout {
        if !(0.0..1.0).contains(&p) {
            bail!("--dropout must be in [0, 1), got {p}");
        }
    }
    for (flag, v) in [
        ("--timeout-s", args.timeout_s),
        ("--collective-timeout-s", args.collective_timeout_s),
        ("--hang-deadline-s", args.hang_deadline_s),
        ("--first-step-deadline-s", args.first_step_deadline_s),
    ] {
        if let Some(t) = v.filter(|t| !t.is_finite() || *t <= 0.0) {
            bail!("{flag} must be a positive number of seconds, got {t}");
        }
        // A finite value can still be too long for a Duration (which would panic later).
        if let Some(t) = v.filter(|&t| t > MAX_SECONDS) {
            bail!("{flag} {t:e} is too long: at most {MAX_SECONDS:e} seconds (~31 years)");
        }
    }
    if args.collective_timeout_s.is_some() && args.launch == "threads" {
        bail!("--collective-timeout-s with --launch threads: thread ranks share one process and wait on in-process channels, with no collective timeout to set; use --launch processes or drop the flag");
    }
    if let Some(t) = args.diverge_tol {
        if !t.is_finite() || t < 0.0 {
            bail!("--diverge-tol must be a finite non-negative number, got {t}");
        }
    }
    if !args.parity_lr.is_finite() || args.parity_lr <= 0.0 {
        bail!("--parity-lr must be a finite positive number, got {}", args.parity_lr);
    }
    if !["constant", "linear"].contains(&args.lr_schedule.as_str()) {
        bail!("unknown --lr-schedule '{}': use constant or linear", args.lr_schedule);
    }
    Ok(())
}

/// The configs to run (the default set when none is given), each known and implemented, and
/// torch-compile's own conditions when it is among them.
fn select_configs(args: &RunArgs, ranks: usize, steps: usize) -> Result<Vec<String>> {
    let configs: Vec<String> = if args.configs.is_empty() {
        DEFAULT_CONFIGS.iter().map(|s| s.to_string()).collect()
    } else {
        args.configs.iter().map(|s| s.trim().to_string()).collect()
    };
    for c in &configs {
        if !CONFIGS.contains(&c.as_str()) {
            bail!("unknown config '{c}': known configs are {}", CONFIGS.join(", "));
        }
        if !IMPLEMENTED_CONFIGS.contains(&c.as_str()) {
            bail!(
                "config '{c}' is not implemented in this build yet; available: {}",
                IMPLEMENTED_CONFIGS.join(", ")
            );
        }
    }
    if configs.iter().any(|c| c == crate::torch_compile::CONFIG) {
        let tc = crate::torch_compile::CONFIG;
        if ranks > 1 {
            bail!("config '{tc}' runs one rank (HF + torch.compile without DDP): drop --ranks {ranks} or the config");
        }
        if steps < 2 {
            bail!("config '{tc}' needs --steps ≥ 2: its first step compiles and is never timed");
        }
        crate::torch_compile::check_available()?;
    }
    Ok(configs)
}

/// Loads a weights file once, so that an unreadable or mismatched file fails before any run,
/// and says what HF would warn about: weights initialised because the file lacks them (a new
/// head), tensors of the file that the model does not use (the old one).
fn check_weights_file(model: &str, resolved: &ResolvedModel, path: &Path, seed: u64) -> Result<()> {
    let (_, report) =
        Weights::load(&resolved.config, path, seed).with_context(|| format!("model '{model}'"))?;
    let list = |v: &[String]| {
        let mut s = v.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
        if v.len() > 4 {
            s += &format!(" and {} more", v.len() - 4);
        }
        s
    };
    if !report.missing.is_empty() {
        eprintln!(
            "model '{model}': {} weights are not in {} and are newly initialised: {}",
            report.missing.len(),
            path.display(),
            list(&report.missing)
        );
    }
    if !report.unexpected.is_empty() {
        eprintln!(
            "model '{model}': {} tensors of {} are not used by {}: {}",
            report.unexpected.len(),
            path.display(),
            resolved.config.arch.hf_name(),
            list(&report.unexpected)
        );
    }
    Ok(())
}

/// `--weights`: auto | random | DIR | FILE.safetensors | HUB_ID.
fn weights_source(arg: &str, model: &ResolvedModel, hub: &HubOptions) -> Result<WeightsSource> {
    Ok(match arg {
        "random" => WeightsSource::Random,
        "auto" => match &model.weights_file {
            Some(f) => WeightsSource::File(f.clone()),
            None => WeightsSource::Random,
        },
        other => {
            let p = Path::new(other);
            if p.is_dir() {
                let f = p.join("model.safetensors");
                if !f.is_file() {
                    bail!("--weights {other}: the directory has no model.safetensors");
                }
                WeightsSource::File(f)
            } else if p.is_file() {
                WeightsSource::File(PathBuf::from(p))
            } else if other.contains('/')
                && !p.exists()
                && !other.starts_with('.')
                && !other.starts_with('/')
            {
                WeightsSource::File(ortbench_models::spec::fetch_hub_file(
                    other,
                    "model.safetensors",
                    hub,
                )?)
            } else {
                bail!("--weights {other}: no such file or directory (use auto, random, a directory, a .safetensors file or a hub id)");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_interleave_with_the_order_rotated() {
        let jobs = interleave(3, 3, 3, true);
        let order: Vec<(usize, &str, usize)> =
            jobs.iter().map(|j| (j.spec, j.phase.name(), j.repeat)).collect();
        assert_eq!(
            order,
            vec![
                (3, "parity", 0),
                (4, "parity", 0),
                (5, "parity", 0),
                (3, "timed", 0),
                (4, "timed", 0),
                (5, "timed", 0),
                (4, "timed", 1),
                (5, "timed", 1),
                (3, "timed", 1),
                (5, "timed", 2),
                (3, "timed", 2),
                (4, "timed", 2),
            ]
        );
        assert_eq!(interleave(0, 2, 1, false).len(), 2);
    }
}
