//! `ortbench train`: the ORTTrainer of this project — one model, one config (`ort` by default),
//! one rank on the CPU, on a dataset for `--epochs` or `--max-steps`, HF Trainer's defaults
//! (AdamW lr 5e-5, linear schedule, clipping at 1, no decay on biases and LayerNorm weights,
//! a reshuffle per epoch), evaluation every `--eval-steps`, checkpoints every `--save-steps`
//! that `--resume` continues bit for bit, and at the end an HF-format directory (config.json,
//! model.safetensors, tokenizer files) that Transformers loads unchanged.
//!
//! Output directory: `steps.csv`/`.parquet` (the run tables' step schema, phase `train`),
//! `eval.csv`/`.parquet` (step, epoch, eval_loss, eval_accuracy), `checkpoint-N/` (the model as
//! HF saves it, `optimizer.safetensors`, `trainer_state.json`), and the final model.
//!
//! Evaluation runs the model's inference graph on the engine's reference executor for every
//! config (the same numbers for `ort` and `pytorch` weights): eval_loss is the task's loss over
//! all evaluated labels (rows for classification, labelled tokens for language models),
//! eval_accuracy the share of argmax hits (element-wise at logit 0 for multi-label; none for
//! regression). Batches of the training set are full (the last partial batch of an epoch is
//! dropped, as the engine's graphs have one static shape); evaluation covers every row.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use ortbench_engine::backend::cuda::gpu::CudaGpu;
use ortbench_engine::backend::gpu::GpuDevice;
use ortbench_engine::DType;
use ortbench_models::config::ProblemType;
use ortbench_models::data::Task;
use ortbench_models::graph::trainer::{
    EngineOptions, EngineState, EngineTrainer, GpuEngineTrainer,
};
use ortbench_models::graph::{GraphOptions, InferenceModel};
use ortbench_models::rng::Rng;
use ortbench_models::torch::{TorchTrainer, TrainOptions};
use ortbench_models::{
    resolve, with_task, Batch, DataSource, HubOptions, LrSchedule, ModelConfig, ResolvedModel,
    Weights, IGNORE_INDEX,
};
use ortbench_report::output::StepRow;
use ortbench_report::polars::prelude::{Column, DataFrame, NamedFrom, Series};
use serde_json::json;

use crate::cli::{ExportArgs, TrainArgs};

/// Files a model directory may carry besides config.json and the weights: copied into every
/// saved directory, so that AutoTokenizer loads from it too.
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
];

/// The trainer of a run: the engine on the CPU or on GPU `D`, or libtorch (CPU or CUDA).
enum Trainer<D: GpuDevice> {
    Engine(Box<EngineTrainer>),
    Gpu(Box<GpuEngineTrainer<D>>),
    Torch(Box<TorchTrainer>),
}

struct StepOut {
    loss: f64,
    grad_norm: f64,
    loss_scale: f64,
    skipped: bool,
}

impl<D: GpuDevice> Trainer<D> {
    fn step(&mut self, batch: &Batch) -> Result<StepOut> {
        let engine = |s: ortbench_engine::session::StepStats| StepOut {
            loss: s.loss as f64,
            grad_norm: s.grad_norm as f64,
            loss_scale: s.loss_scale as f64,
            skipped: s.skipped,
        };
        Ok(match self {
            Trainer::Engine(t) => engine(t.step(batch)?),
            Trainer::Gpu(t) => engine(t.step(batch)?),
            Trainer::Torch(t) => {
                let s = t.step(batch)?;
                StepOut {
                    loss: s.loss,
                    grad_norm: s.grad_norm,
                    loss_scale: s.loss_scale,
                    skipped: s.skipped,
                }
            }
        })
    }

    fn weights(&self) -> Result<Weights> {
        Ok(match self {
            Trainer::Engine(t) => t.weights()?,
            Trainer::Gpu(t) => t.weights()?,
            Trainer::Torch(t) => t.weights(),
        })
    }

    /// The engine's resumable state (None for the baseline, whose optimizer state is not
    /// checkpointed).
    fn state(&self) -> Result<Option<EngineState>> {
        Ok(match self {
            Trainer::Engine(t) => Some(t.state()?),
            Trainer::Gpu(t) => Some(t.state()?),
            Trainer::Torch(_) => None,
        })
    }

    fn restore(&mut self, state: EngineState) -> Result<()> {
        match self {
            Trainer::Engine(t) => t.restore(state)?,
            Trainer::Gpu(t) => t.restore(state)?,
            Trainer::Torch(_) => unreachable!("checked: --resume is ort only"),
        }
        Ok(())
    }
}

/// The learning rate at step `step` of `total`: HF's linear schedule (warm-up, then to 0) or
/// constant after warm-up.
fn lr_at(args: &TrainArgs, total: usize, step: usize) -> f64 {
    args.lr * schedule(args, total).factor(step)
}

fn schedule(args: &TrainArgs, total: usize) -> LrSchedule {
    match args.lr_schedule.as_str() {
        "constant" => LrSchedule::Constant { warmup_steps: args.warmup_steps },
        _ => LrSchedule::Linear { warmup_steps: args.warmup_steps, total_steps: total },
    }
}

/// Rows of epoch `epoch` in training order: a permutation of 0..n from the seed (HF Trainer's
/// RandomSampler reshuffles every epoch).
fn epoch_order(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng::for_stream(seed, &format!("epoch-{epoch}"));
    for i in (1..n).rev() {
        let j = rng.range(0, i as i64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// Evaluation: (eval_loss, eval_accuracy) of `params` over every row of `data`.
fn evaluate(cfg: &ModelConfig, params: &[f32], data: &DataSource) -> Result<(f64, Option<f64>)> {
    let n = data.n_rows().context("evaluation needs rows from a file")?;
    let task = Task::for_config(cfg);
    let b = data.batch_size.min(n);
    let opts = |rows: usize| {
        GraphOptions::new(rows, data.seq_len).with_attention_mask(data.has_attention_mask())
    };
    let full = InferenceModel::new(cfg, &opts(b))?;
    let rest = (n % b != 0).then(|| InferenceModel::new(cfg, &opts(n % b))).transpose()?;
    let (mut loss_sum, mut count, mut hits, mut judged) = (0.0f64, 0usize, 0usize, 0usize);
    for (k, start) in (0..n).step_by(b).enumerate() {
        let rows: Vec<usize> = (start..(start + b).min(n)).collect();
        let model = if rows.len() == b { &full } else { rest.as_ref().expect("a remainder model") };
        let batch = data.batch_of_rows(&rows, k);
        let logits = model.logits(params, &batch)?;
        let width = *model.graph.shape(model.logits).last().expect("logits have a last dim");
        score(task, &logits, width, &batch, &mut loss_sum, &mut count, &mut hits, &mut judged);
    }
    if count == 0 {
        bail!("the evaluation rows have no labels");
    }
    Ok((loss_sum / count as f64, (judged > 0).then(|| hits as f64 / judged as f64)))
}

/// Adds one batch's loss terms (f64) and accuracy counts.
#[allow(
    clippy::too_many_arguments,
    reason = "the evaluation's inputs, each used once; a struct would only rename them"
)]
fn score(
    task: Task,
    logits: &[f32],
    width: usize,
    batch: &Batch,
    loss: &mut f64,
    count: &mut usize,
    hits: &mut usize,
    judged: &mut usize,
) {
    let ce = |row: &[f32], label: usize| {
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() - row[label] as f64
    };
    let argmax = |row: &[f32]| {
        row.iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |a, (i, &v)| if v > a.1 { (i, v) } else { a })
            .0
    };
    match task {
        Task::MaskedLm | Task::CausalLm | Task::TokenClassification { .. } => {
            let t = batch.seq_len;
            for (i, row) in logits.chunks_exact(width).enumerate() {
                // Causal LM: position t predicts token t+1 (HF's shift).
                let label = if task == Task::CausalLm {
                    if i % t == t - 1 {
                        IGNORE_INDEX
                    } else {
                        batch.labels[i + 1]
                    }
                } else {
                    batch.labels[i]
                };
                if label == IGNORE_INDEX {
                    continue;
                }
                *loss += ce(row, label as usize);
                *count += 1;
                *hits += usize::from(argmax(row) == label as usize);
                *judged += 1;
            }
        }
        Task::SequenceClassification { problem: ProblemType::SingleLabel, .. } => {
            for (row, &label) in logits.chunks_exact(width).zip(&batch.labels) {
                *loss += ce(row, label as usize);
                *count += 1;
                *hits += usize::from(argmax(row) == label as usize);
                *judged += 1;
            }
        }
        Task::SequenceClassification { problem: ProblemType::MultiLabel, .. } => {
            // BCEWithLogits per element, mean over rows · labels.
            for (&x, &y) in logits.iter().zip(&batch.labels) {
                let x = x as f64;
                *loss += x.max(0.0) - x * y as f64 + (-x.abs()).exp().ln_1p();
                *count += 1;
                *hits += usize::from((x > 0.0) == (y == 1));
                *judged += 1;
            }
        }
        Task::SequenceClassification { problem: ProblemType::Regression, .. } => {
            for (&x, &y) in logits.iter().zip(batch.targets.as_deref().unwrap_or_default()) {
                *loss += (x as f64 - y as f64).powi(2);
                *count += 1;
            }
        }
    }
}

/// Saves `weights` as an HF model directory: config.json (the model's, with its architecture),
/// model.safetensors (HF names, tied weights once) and the source's tokenizer files.
fn save_hf_dir(
    dir: &Path,
    cfg: &ModelConfig,
    weights: &Weights,
    source_dir: Option<&Path>,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut raw = cfg.raw.clone();
    raw["architectures"] = json!([cfg.arch.hf_name()]);
    ortbench_report::output::write_text(
        &dir.join("config.json"),
        &serde_json::to_string_pretty(&raw)?,
    )?;
    weights.save(&dir.join("model.safetensors"))?;
    if let Some(src) = source_dir {
        for f in TOKENIZER_FILES {
            let p = src.join(f);
            if p.is_file() {
                std::fs::copy(&p, dir.join(f))
                    .with_context(|| format!("cannot copy {}", p.display()))?;
            }
        }
    }
    Ok(())
}

/// optimizer.safetensors: the engine's fp32 parameters and Adam moments (flat).
fn save_state(dir: &Path, s: &EngineState) -> Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (p, m, v) = (le(&s.params), le(&s.exp_avg), le(&s.exp_avg_sq));
    let n = s.params.len();
    let views = vec![
        ("params".to_string(), TensorView::new(Dtype::F32, vec![n], &p)?),
        ("exp_avg".to_string(), TensorView::new(Dtype::F32, vec![n], &m)?),
        ("exp_avg_sq".to_string(), TensorView::new(Dtype::F32, vec![n], &v)?),
    ];
    let path = dir.join("optimizer.safetensors");
    let tmp = dir.join(".optimizer.safetensors.tmp");
    safetensors::serialize_to_file(views, None, &tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn load_state(dir: &Path, state: &serde_json::Value) -> Result<EngineState> {
    let path = dir.join("optimizer.safetensors");
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{} is not a safetensors file", path.display()))?;
    let get = |name: &str| -> Result<Vec<f32>> {
        let t = st.tensor(name).with_context(|| format!("{} has no '{name}'", path.display()))?;
        Ok(t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    };
    let u = |k: &str| state[k].as_u64().with_context(|| format!("trainer_state.json has no '{k}'"));
    Ok(EngineState {
        params: get("params")?,
        exp_avg: get("exp_avg")?,
        exp_avg_sq: get("exp_avg_sq")?,
        adam_step: u("adam_step")?,
        steps_taken: u("global_step")? as usize,
        loss_scaler: state["loss_scale"]
            .as_f64()
            .map(|s| (s as f32, state["loss_scale_clean_steps"].as_u64().unwrap_or(0) as u32)),
    })
}

/// `--overwrite`: the earlier run's `checkpoint-N/` folders go, so that a later `--resume` can
/// only continue this run (its other files are replaced as this run writes them).
fn remove_checkpoints(out: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(out) else { return Ok(()) };
    let mut removed = 0;
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.strip_prefix("checkpoint-").is_some_and(|n| n.parse::<usize>().is_ok()) {
            std::fs::remove_dir_all(e.path())
                .with_context(|| format!("--overwrite: cannot remove {}", e.path().display()))?;
            removed += 1;
        }
    }
    if removed > 0 {
        eprintln!(
            "--overwrite: removed {removed} checkpoint folder(s) of the earlier run in {}",
            out.display()
        );
    }
    Ok(())
}

/// The checkpoint with the highest step in `out`.
fn latest_checkpoint(out: &Path) -> Option<(usize, PathBuf)> {
    std::fs::read_dir(out)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("checkpoint-")?.parse::<usize>().ok()?;
            e.path().join("trainer_state.json").is_file().then(|| (step, e.path()))
        })
        .max_by_key(|(s, _)| *s)
}

/// An evaluation: (step, epoch, eval loss, eval accuracy).
type EvalRow = (usize, f64, f64, Option<f64>);

fn write_logs(
    out: &Path,
    steps: &[StepRow],
    evals: &[(usize, f64, f64, Option<f64>)],
) -> Result<()> {
    ortbench_report::results::write_steps(out, steps)?;
    let mut df = DataFrame::new(
        evals.len(),
        vec![
            Column::from(Series::new(
                "step".into(),
                evals.iter().map(|e| e.0 as u64).collect::<Vec<u64>>(),
            )),
            Column::from(Series::new(
                "epoch".into(),
                evals.iter().map(|e| e.1).collect::<Vec<f64>>(),
            )),
            Column::from(Series::new(
                "eval_loss".into(),
                evals.iter().map(|e| e.2).collect::<Vec<f64>>(),
            )),
            Column::from(Series::new(
                "eval_accuracy".into(),
                evals.iter().map(|e| e.3).collect::<Vec<Option<f64>>>(),
            )),
        ],
    )?;
    ortbench_report::results::write_frame(&mut df, &out.join("eval.parquet"), &out.join("eval.csv"))
}

pub fn run(args: &TrainArgs) -> Result<i32> {
    check_args(args)?;
    let device = crate::worker::parse_device(&args.device)?;
    match (device, args.config.as_str()) {
        (tch::Device::Cuda(i), "ort") => {
            let gpu =
                CudaGpu::open(i).map_err(|e| anyhow!("train --device {}: {e}", args.device))?;
            run_on(args, Some(gpu))
        }
        (tch::Device::Cuda(_), _) if !tch::Cuda::is_available() => {
            bail!("train --device {}: libtorch sees no CUDA GPU", args.device)
        }
        _ => run_on::<CudaGpu>(args, None),
    }
}

/// `ortbench train` with the engine on `gpu` when given (`--device cuda`, or the SIMT device in
/// the tests: the loop, logs, evaluation, checkpoints and `--resume` are the CPU's), else as
/// `--device` and `--config` say on the CPU or libtorch's device.
pub fn run_on<D: GpuDevice>(args: &TrainArgs, gpu: Option<D>) -> Result<i32> {
    check_args(args)?;
    let precision: DType = args.precision.parse()?;
    let out = &args.output_dir;
    let resume_from = prepare_output_dir(args)?;

    // The model, its task and weights (the checkpoint's when resuming: they are in its state).
    let hub = HubOptions::from_env();
    let model = resolve(&args.model, &hub)?;
    let mut cfg = with_task(model.config.clone(), args.task.as_deref(), &args.model)?;
    if let Some(p) = args.dropout {
        cfg.set_dropout(p);
    }
    let weights = load_weights(&cfg, model.weights_file.as_deref(), args.seed)?;

    // Data: the training rows and an evaluation set.
    let (train, eval) = load_data(args, &model, &cfg)?;
    let n = train.n_rows().expect("file rows");
    let per_epoch = n / args.batch_size;
    if per_epoch == 0 {
        bail!("{n} training rows make no batch of --batch-size {}", args.batch_size);
    }
    let total = args.max_steps.unwrap_or(args.epochs * per_epoch);

    // The trainer, HF Trainer's conventions.
    let schedule = schedule(args, total);
    let mut trainer = make_trainer(args, &cfg, &weights, &train, (schedule, precision), gpu)?;
    let mut steps: Vec<StepRow> = Vec::new();
    let mut evals: Vec<EvalRow> = Vec::new();
    let mut start = 0;
    if let Some((step, dir)) = &resume_from {
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("trainer_state.json"))?)?;
        if state["total_steps"].as_u64() != Some(total as u64) {
            bail!("--resume: {} was written for {} steps, this run has {total}: give the same --epochs/--max-steps and data", dir.display(), state["total_steps"]);
        }
        trainer.restore(load_state(dir, &state)?)?;
        // The logs up to the checkpoint, so the curve goes on in one table.
        steps = serde_json::from_value(state["log_history"].clone()).unwrap_or_default();
        evals = serde_json::from_value(state["eval_history"].clone()).unwrap_or_default();
        start = *step;
        eprintln!("resuming from {} at step {start} of {total}", dir.display());
    }

    let model_name = args.model.trim_end_matches('/').to_string();
    eprintln!(
        "training {} ({}) with {} on {n} rows: {total} steps of {} × {} ({per_epoch} per epoch){}",
        model_name,
        Task::for_config(&cfg).name(),
        args.config,
        args.batch_size,
        train.seq_len,
        eval.as_ref()
            .map_or(String::new(), |e| format!(", evaluating on {} rows", e.n_rows().unwrap_or(0)))
    );
    let eval_every = args.eval_steps.unwrap_or(per_epoch);
    let mut order = epoch_order(n, args.seed, start / per_epoch);
    let source_dir = match &model.source {
        ortbench_models::Source::Dir(d) => Some(d.clone()),
        ortbench_models::Source::Hub { snapshot, .. } => Some(snapshot.clone()),
        ortbench_models::Source::Builtin => None,
    };
    for step in start..total {
        let (epoch, k) = (step / per_epoch, step % per_epoch);
        if k == 0 && step != start {
            order = epoch_order(n, args.seed, epoch);
        }
        let batch =
            train.batch_of_rows(&order[k * args.batch_size..(k + 1) * args.batch_size], step);
        let t0 = Instant::now();
        let s = trainer.step(&batch)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if !s.loss.is_finite() {
            bail!("step {step}: the loss is {} (lower --lr?)", s.loss);
        }
        steps.push(StepRow {
            model: model_name.clone(),
            config: args.config.clone(),
            precision: args.precision.clone(),
            repeat: 0,
            phase: "train".into(),
            rank: 0,
            step,
            loss: s.loss,
            step_ms: ms,
            device_ms: None,
            grad_norm: s.grad_norm,
            loss_scale: s.loss_scale,
            skipped: s.skipped,
        });
        let done = step + 1;
        let epoch_f = done as f64 / per_epoch as f64;
        if done % args.logging_steps.max(1) == 0 || done == total {
            println!(
                "step {done}/{total}: loss {:.4}, grad_norm {:.4}, learning_rate {:.3e}, epoch {epoch_f:.2} ({ms:.0} ms)",
                s.loss,
                s.grad_norm,
                lr_at(args, total, step)
            );
        }
        if let Some(e) = &eval {
            if done % eval_every == 0 || done == total {
                let params = trainer.weights()?.flat(&cfg)?;
                let (loss, acc) = evaluate(&cfg, &params, e)?;
                println!(
                    "eval at step {done}: eval_loss {loss:.4}{}",
                    acc.map_or(String::new(), |a| format!(", eval_accuracy {a:.4}"))
                );
                evals.push((done, epoch_f, loss, acc));
            }
        }
        if args.save_steps.is_some_and(|s| s > 0 && done % s == 0) && done != total {
            let history = (&steps[..], &evals[..]);
            save_checkpoint(
                out,
                &cfg,
                &trainer,
                source_dir.as_deref(),
                (done, total, epoch_f),
                history,
            )?;
        }
        write_logs(out, &steps, &evals)?;
    }
    save_hf_dir(out, &cfg, &trainer.weights()?, source_dir.as_deref())?;
    write_logs(out, &steps, &evals)?;
    println!(
        "saved the model to {} (config.json, model.safetensors{})",
        out.display(),
        if source_dir.is_some() { ", tokenizer files" } else { "" }
    );
    Ok(0)
}

/// The `train` flags that are checked before anything loads.
fn check_args(args: &TrainArgs) -> Result<()> {
    if !["ort", "pytorch"].contains(&args.config.as_str()) {
        bail!(
            "--config {}: train runs one rank, as ort or pytorch (ort-zero1 is ort on one rank)",
            args.config
        );
    }
    if !["linear", "constant"].contains(&args.lr_schedule.as_str()) {
        bail!("unknown --lr-schedule '{}': use linear or constant", args.lr_schedule);
    }
    if args.resume && args.config != "ort" {
        bail!("--resume continues ort runs only (the pytorch config's optimizer state is not checkpointed)");
    }
    if args.batch_size == 0 || args.epochs == 0 && args.max_steps.is_none() {
        bail!("--batch-size and --epochs (or --max-steps) must be positive");
    }
    if args.eval_split.is_some_and(|f| !(f > 0.0 && f < 1.0)) {
        bail!("--eval-split must be in (0, 1)");
    }
    Ok(())
}

/// The output directory, made ready: the checkpoint to resume from (with `--resume`), an
/// error for a non-empty directory without `--resume` or `--overwrite`, the earlier run's
/// checkpoints removed with `--overwrite`.
fn prepare_output_dir(args: &TrainArgs) -> Result<Option<(usize, PathBuf)>> {
    let out = &args.output_dir;
    let resume_from = if args.resume {
        Some(
            latest_checkpoint(out)
                .with_context(|| format!("--resume: {} has no checkpoint-N/", out.display()))?,
        )
    } else {
        None
    };
    if !args.resume && out.exists() && std::fs::read_dir(out)?.next().is_some() && !args.overwrite {
        bail!(
            "--output-dir {} is not empty (use --resume to continue it, or --overwrite)",
            out.display()
        );
    }
    if args.overwrite && !args.resume {
        remove_checkpoints(out)?;
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    Ok(resume_from)
}

/// The model's weights from its file (reporting the missing and unused tensors), or newly
/// initialised.
fn load_weights(cfg: &ModelConfig, file: Option<&Path>, seed: u64) -> Result<Weights> {
    Ok(match file {
        Some(f) => {
            let (w, report) = Weights::load(cfg, f, seed)?;
            if !report.missing.is_empty() {
                eprintln!(
                    "{} weights are not in {} and are newly initialised: {}",
                    report.missing.len(),
                    f.display(),
                    report.missing.join(", ")
                );
            }
            if !report.unexpected.is_empty() {
                eprintln!(
                    "{} tensors of {} are not used by {}: {}",
                    report.unexpected.len(),
                    f.display(),
                    cfg.arch.hf_name(),
                    report.unexpected.join(", ")
                );
            }
            w
        }
        None => Weights::init(cfg, seed),
    })
}

/// The training rows and the evaluation set (`--eval-dataset`, or `--eval-split` of the rows).
fn load_data(
    args: &TrainArgs,
    model: &ResolvedModel,
    cfg: &ModelConfig,
) -> Result<(DataSource, Option<DataSource>)> {
    let cols = ortbench_models::text::Columns {
        text: args.text_column.clone(),
        label: args.label_column.clone(),
    };
    let cap = args.seq_len.unwrap_or(128).min(cfg.max_positions());
    let file_for = |ds: &Path| crate::dataset::prepare(model, cfg, ds, &cols, cap);
    let train_file = match (&args.dataset, &args.data) {
        (Some(ds), None) => file_for(ds)?,
        (None, Some(f)) => f.clone(),
        _ => bail!("give the training rows as --dataset FILE (text) or --data FILE (tokenised safetensors)"),
    };
    let mut train = DataSource::from_file(cfg, &train_file, args.batch_size, None, args.seed)?;
    let eval_batch = args.eval_batch_size.unwrap_or(args.batch_size);
    let eval = match (&args.eval_dataset, args.eval_split) {
        (Some(ds), None) => {
            Some(DataSource::from_file(cfg, &file_for(ds)?, eval_batch, None, args.seed)?)
        }
        (None, Some(frac)) => {
            let n = train.n_rows().expect("file rows");
            let (t, e) =
                train.split_off(((n as f64 * frac).round() as usize).max(1), eval_batch)?;
            train = t;
            Some(e)
        }
        (None, None) => None,
        (Some(_), Some(_)) => bail!("give --eval-dataset or --eval-split, not both"),
    };
    Ok((train, eval))
}

/// The trainer, HF Trainer's conventions: the engine for `ort` (on `gpu` when given),
/// libtorch eager for `pytorch` (on `--device`).
fn make_trainer<D: GpuDevice>(
    args: &TrainArgs,
    cfg: &ModelConfig,
    weights: &Weights,
    train: &DataSource,
    (schedule, precision): (LrSchedule, DType),
    gpu: Option<D>,
) -> Result<Trainer<D>> {
    Ok(match args.config.as_str() {
        "ort" => {
            let opts = EngineOptions {
                lr: args.lr,
                weight_decay: args.weight_decay,
                max_grad_norm: args.max_grad_norm,
                schedule,
                precision,
                seed: args.seed,
            };
            let graph = GraphOptions::new(args.batch_size, train.seq_len)
                .with_attention_mask(train.has_attention_mask());
            if let Some(dev) = gpu {
                return Ok(Trainer::Gpu(Box::new(GpuEngineTrainer::new(
                    cfg, weights, &graph, opts, dev,
                )?)));
            }
            let group = ortbench_engine::collective::LocalGroup::new(1).pop().expect("one rank");
            Trainer::Engine(Box::new(EngineTrainer::with_graph_options(
                cfg,
                weights,
                &graph,
                opts,
                group,
                ortbench_engine::parallel::Strategy::Ddp,
            )?))
        }
        _ => {
            let device = crate::worker::parse_device(&args.device)?;
            let p = match (args.precision.as_str(), device) {
                ("fp32", _) => ortbench_models::torch::Precision::Fp32,
                ("bf16", _) => ortbench_models::torch::Precision::Bf16,
                ("fp16", tch::Device::Cuda(_)) => ortbench_models::torch::Precision::Fp16,
                (other, _) => bail!(
                    "--precision {other}: the pytorch config trains fp32 or bf16 on the CPU, and fp16 too on CUDA"
                ),
            };
            let opts = TrainOptions {
                lr: args.lr,
                weight_decay: args.weight_decay,
                max_grad_norm: args.max_grad_norm,
                schedule,
                precision: p,
                ..TrainOptions::default()
            };
            Trainer::Torch(Box::new(TorchTrainer::new(cfg, weights, device, opts)?))
        }
    })
}

/// `checkpoint-N/`: the model as HF saves it and, for the engine, its optimizer state and
/// `trainer_state.json` (the step, the loss scaler and the logs so far), for `--resume`.
fn save_checkpoint<D: GpuDevice>(
    out: &Path,
    cfg: &ModelConfig,
    trainer: &Trainer<D>,
    source_dir: Option<&Path>,
    (done, total, epoch_f): (usize, usize, f64),
    (steps, evals): (&[StepRow], &[EvalRow]),
) -> Result<()> {
    let dir = out.join(format!("checkpoint-{done}"));
    save_hf_dir(&dir, cfg, &trainer.weights()?, source_dir)?;
    if let Some(st) = trainer.state()? {
        save_state(&dir, &st)?;
        let state = json!({
            "global_step": done, "total_steps": total, "epoch": epoch_f, "adam_step": st.adam_step,
            "loss_scale": st.loss_scaler.map(|l| l.0), "loss_scale_clean_steps": st.loss_scaler.map(|l| l.1),
            "log_history": steps, "eval_history": evals,
        });
        ortbench_report::output::write_text(
            &dir.join("trainer_state.json"),
            &serde_json::to_string_pretty(&state)?,
        )?;
    }
    eprintln!("saved {}", dir.display());
    Ok(())
}

/// `ortbench export`: a model directory's inference graph as ONNX.
pub fn export(args: &ExportArgs) -> Result<i32> {
    let model = resolve(&args.model, &HubOptions::from_env())?;
    let cfg = with_task(model.config.clone(), args.task.as_deref(), &args.model)?;
    let weights = match &model.weights_file {
        Some(f) => {
            let (w, report) = Weights::load(&cfg, f, 0)?;
            if !report.missing.is_empty() {
                bail!(
                    "{} lacks {} weights ({}…): export a trained model directory",
                    f.display(),
                    report.missing.len(),
                    report.missing[0]
                );
            }
            w
        }
        None => bail!("{}: no model.safetensors to export", args.model),
    };
    let report = ortbench_models::onnx::export_onnx(&cfg, &weights.flat(&cfg)?, &args.onnx)?;
    println!("{report}");
    Ok(0)
}
