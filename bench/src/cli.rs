//! Command-line interface (clap).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::run_spec::{CONFIGS, IMPLEMENTED_CONFIGS, PRECISIONS};

#[derive(Parser, Debug)]
#[command(
    name = "ortbench",
    version,
    about = "Train HF transformer models under pytorch / ort / ort-zero1 and compare them"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train each model under each config and write steps.csv and results.csv.
    Run(RunArgs),
    /// List the known models, configs and precisions.
    List,
    /// Print the environment (CPU, memory, GPUs, OS, versions, git commit) that `run` stores
    /// in run.json.
    Env {
        /// Print JSON instead of aligned lines.
        #[arg(long)]
        json: bool,
    },
    /// Regenerate index.html and the charts of a run directory.
    Report {
        /// A directory written by `ortbench run`.
        dir: PathBuf,
    },
    /// Compare two run directories per (model, config, precision, ranks): throughput ratio,
    /// peak memory, loss parity; regressions are marked.
    Compare(CompareArgs),
    /// Fine-tune one model under one config on a dataset (HF Trainer's defaults), evaluate,
    /// checkpoint, resume, and save an HF-format directory.
    Train(TrainArgs),
    /// Export a model directory's inference graph as ONNX (inputs input_ids and
    /// attention_mask, dynamic batch and sequence axes).
    Export(ExportArgs),
    /// Runs one run of a plan (internal: `run` starts one worker process per run).
    #[command(hide = true)]
    Worker {
        /// The run, as JSON.
        #[arg(long)]
        spec: String,
    },
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Comma-separated models: aliases (bert, gpt2, bert-large, gpt2-medium, smollm2-135m,
    /// qwen2.5-0.5b, qwen3-0.6b, llama-3.2-1b, and tiny-bert, tiny-gpt2, tiny-llama,
    /// tiny-mistral, tiny-qwen2, tiny-qwen3 for tests: `ortbench list`), HF-format directories,
    /// or hub ids (org/name, from the HF cache).
    #[arg(long, value_delimiter = ',', required = true)]
    pub models: Vec<String>,
    /// Comma-separated configs: pytorch, torch-compile, ort, ort-zero1 (`list` says what each
    /// is) [default: pytorch,ort,ort-zero1].
    #[arg(long, value_delimiter = ',')]
    pub configs: Vec<String>,
    /// Comma-separated precisions: fp32, fp16, bf16 [default: fp32 on cpu, bf16 on cuda].
    #[arg(long, value_delimiter = ',')]
    pub precision: Vec<String>,
    /// cpu, cuda or cuda:N (defaults on cuda: 50 steps, 10 warm-up); rocm[:N] is recognised
    /// and refused with the reason (no config runs on AMD GPUs yet).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Training steps per run [default: 8 on cpu, 50 on cuda].
    #[arg(long)]
    pub steps: Option<i64>,
    /// Steps excluded from throughput [default: 2 on cpu, 10 on cuda].
    #[arg(long)]
    pub warmup: Option<i64>,
    /// Rows per step and rank [default: 8 on cpu, 32 on cuda]; the global batch is
    /// --batch-size × --ranks. `auto`: the fixed-batch comparison at the default batch, then
    /// per config the largest batch whose peak memory fits --memory-budget, searched on one
    /// grid for every config (powers of two, then bisection), and its throughput there.
    #[arg(long)]
    pub batch_size: Option<String>,
    /// With --batch-size auto: the memory one worker process (one rank) may peak at, in MiB
    /// [default: 70 % of the memory available now on the CPU (divided among rank processes),
    /// 90 % of the GPU's memory].
    #[arg(long)]
    pub memory_budget: Option<f64>,
    /// Data-parallel ranks for every config (on the CPU they split the cores).
    #[arg(long)]
    pub ranks: Option<i64>,
    /// How ranks run: `processes` — one worker process per rank, joined over TCP with the
    /// variables torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so peak memory is
    /// per rank and a failing rank ends the others — or `threads` of one worker.
    #[arg(long, default_value = "processes")]
    pub launch: String,
    /// Tokens per row [default: 128 on cpu, 512 on cuda (at most the model's positions), or T
    /// of --data].
    #[arg(long)]
    pub seq_len: Option<i64>,
    /// Seed of weights, data and dropout.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Peak learning rate.
    #[arg(long, default_value_t = 5e-5)]
    pub lr: f64,
    /// AdamW weight decay (not applied to biases and LayerNorm weights).
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Clip gradients at this global L2 norm (0: no clipping).
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f64,
    /// constant or linear (warm-up then linear decay to 0 at the last step).
    #[arg(long, default_value = "constant")]
    pub lr_schedule: String,
    /// Linear LR warm-up steps.
    #[arg(long, default_value_t = 0)]
    pub lr_warmup_steps: usize,
    /// Overrides every dropout probability of the models.
    #[arg(long)]
    pub dropout: Option<f64>,
    /// A safetensors file with `input_ids` (int64, [N, T]) and optionally `labels` and HF's
    /// `attention_mask` (padded rows); any other tensor is refused.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A text dataset (.txt, .jsonl, .csv, .parquet) tokenised with each model's tokenizer.json
    /// (and cached): lines for masked-lm, blocks of --seq-len for causal-lm, rows with labels
    /// for sequence classification.
    #[arg(long, conflicts_with = "data")]
    pub dataset: Option<PathBuf>,
    /// The text column of --dataset.
    #[arg(long, default_value = "text")]
    pub text_column: String,
    /// The label column of --dataset (strings through config.json's label2id).
    #[arg(long, default_value = "label")]
    pub label_column: String,
    /// What to train: masked-lm, causal-lm or sequence-classification [default: the
    /// checkpoint's `architectures`]. Another head than the checkpoint's is newly initialised.
    #[arg(long)]
    pub task: Option<String>,
    /// auto (the model's own file if it has one, else random), random, a directory or
    /// .safetensors file, or a hub id.
    #[arg(long, default_value = "auto")]
    pub weights: String,
    /// Output directory [default: reports/<run-id>].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write into --out even if it is not empty.
    #[arg(long)]
    pub force: bool,
    /// Kill a run's worker after this many seconds and record the run as `timeout`
    /// [default: no limit].
    #[arg(long)]
    pub timeout_s: Option<f64>,
    /// How long a rank's collective waits for a silent peer (stopped, hung, unreachable)
    /// before the rank fails naming the peer, the collective and the step [default: 120 on the
    /// CPU; 600 on GPUs, torch's NCCL default].
    #[arg(long)]
    pub collective_timeout_s: Option<f64>,
    /// A hang is a failure: after its first step, a worker that reports no step for longer
    /// than max(this, 10 × the run's median step time) is killed with its peers and the run
    /// recorded as `error` naming the silent rank [default: the collective timeout + 60, so
    /// that a rank's own collective error, which names the collective, normally comes first].
    #[arg(long)]
    pub hang_deadline_s: Option<f64>,
    /// The allowance for a worker's first step report, from its start: loading the model,
    /// kernel compilation, GEMM heuristics, torch-compile's compilation [default: 900].
    #[arg(long)]
    pub first_step_deadline_s: Option<f64>,
    /// Timed runs per (model, config, precision): run interleaved with the other configs, the
    /// order rotated each time, and their step times pooled; the speedup's interval comes
    /// from them [default: 3].
    #[arg(long)]
    pub repeat: Option<i64>,
    /// Steps of the parity probe: before the timed runs, every config trains this many steps
    /// with dropout 0 and --parity-lr on the same weights and batches, and its loss and
    /// gradient-norm curves are compared with pytorch's (0: no probe, no parity verdict).
    /// [default: 6, 3 with --quick]
    #[arg(long)]
    pub parity_steps: Option<usize>,
    /// Learning rate of the parity probe: large enough that the loss moves step by step, so a
    /// wrong update shows in the curve.
    #[arg(long, default_value_t = 1e-3)]
    pub parity_lr: f64,
    /// Tolerance of the parity probe: a config whose loss or gradient norm differs from
    /// pytorch's by more than this (relative, at any step) is `diverged` [default: from the
    /// precision: fp32 1e-3, fp16 8·2^-11 ≈ 3.9e-3, bf16 8·2^-8 ≈ 3.1e-2].
    #[arg(long)]
    pub diverge_tol: Option<f64>,
    /// A first look in a few minutes on the CPU: what is not given defaults to the pytorch and
    /// ort configs, batch 4 × seq 64, 6 steps (1 warm-up) × 3 repeats (the fewest that give a
    /// speedup interval) and a 3-step parity probe. It trades precision for time: three short
    /// repeats give wide intervals, and a small batch weighs each step's fixed costs more than
    /// a training batch does.
    #[arg(long)]
    pub quick: bool,
}

impl RunArgs {
    /// Steps of the parity probe.
    pub fn parity_steps(&self) -> usize {
        self.parity_steps.unwrap_or(if self.quick { 3 } else { 6 })
    }

    /// The arguments with --quick's defaults in what the user left unset (given flags win);
    /// unchanged without --quick.
    pub fn with_quick_defaults(&self) -> RunArgs {
        let mut a = self.clone();
        if a.quick {
            a.steps = a.steps.or(Some(6));
            a.warmup = a.warmup.or(Some(1));
            a.batch_size = a.batch_size.or(Some("4".into()));
            a.repeat = a.repeat.or(Some(3));
            if a.data.is_none() && a.dataset.is_none() {
                a.seq_len = a.seq_len.or(Some(64));
            }
            if a.configs.is_empty() {
                a.configs = vec!["pytorch".into(), "ort".into()];
            }
            a.parity_steps = Some(a.parity_steps());
        }
        a
    }
}

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// The earlier run directory (the reference).
    pub a: PathBuf,
    /// The later run directory.
    pub b: PathBuf,
    /// Relative change counted as a regression: samples/s lower, or peak memory higher, by
    /// more than this.
    #[arg(long, default_value_t = 0.05)]
    pub threshold: f64,
    /// Exit with status 1 when there is a regression.
    #[arg(long)]
    pub fail_on_regression: bool,
}

pub fn print_list() {
    println!("models:");
    let width = ortbench_models::spec::ALIASES.iter().map(|(a, _)| a.len()).max().unwrap_or(0);
    for (alias, name) in ortbench_models::spec::ALIASES {
        println!("  {alias:<width$} -> {name}");
    }
    for name in ortbench_models::spec::BUILTIN_NAMES {
        println!("  {name}");
    }
    println!("  <dir>        an HF-format directory (config.json + model.safetensors)");
    println!("  <org/name>   a hub id, resolved through the HF cache");
    println!("configs:");
    for c in CONFIGS {
        let state = if !IMPLEMENTED_CONFIGS.contains(c) {
            " (not in this build yet)".to_string()
        } else if *c == crate::torch_compile::CONFIG {
            format!(
                "  HF Transformers + torch.compile (inductor), run by {}; needs a C++ compiler ($CXX, else g++); not in the default --configs",
                crate::torch_compile::python().display()
            )
        } else {
            String::new()
        };
        println!("  {c}{state}");
    }
    println!("precisions: {}", PRECISIONS.join(", "));
}

#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// The model: an HF-format directory (with tokenizer.json for --dataset), a hub id or an
    /// alias.
    #[arg(long)]
    pub model: String,
    /// ort (the engine) or pytorch (libtorch eager).
    #[arg(long, default_value = "ort")]
    pub config: String,
    /// cpu, cuda or cuda:N: where the trainer runs (one rank; evaluation runs on the CPU).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// masked-lm, causal-lm or sequence-classification [default: the checkpoint's].
    #[arg(long)]
    pub task: Option<String>,
    /// Training rows as text (.txt, .jsonl, .csv, .parquet), tokenised with the model's
    /// tokenizer.json.
    #[arg(long, conflicts_with = "data")]
    pub dataset: Option<PathBuf>,
    /// Training rows already tokenised (a --data safetensors file).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Evaluation rows as text.
    #[arg(long)]
    pub eval_dataset: Option<PathBuf>,
    /// Evaluate on this share of the training rows (its last rows) instead.
    #[arg(long)]
    pub eval_split: Option<f64>,
    #[arg(long, default_value = "text")]
    pub text_column: String,
    #[arg(long, default_value = "label")]
    pub label_column: String,
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Total steps (overrides --epochs).
    #[arg(long)]
    pub max_steps: Option<usize>,
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    #[arg(long)]
    pub eval_batch_size: Option<usize>,
    /// The longest row in tokens (rows are padded to the longest of the dataset) [default: 128].
    #[arg(long)]
    pub seq_len: Option<usize>,
    #[arg(long, default_value_t = 5e-5)]
    pub lr: f64,
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f64,
    /// linear (HF's default) or constant.
    #[arg(long, default_value = "linear")]
    pub lr_schedule: String,
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: usize,
    /// Evaluate every N steps [default: every epoch] and at the end.
    #[arg(long)]
    pub eval_steps: Option<usize>,
    /// Write checkpoint-N/ every N steps.
    #[arg(long)]
    pub save_steps: Option<usize>,
    /// Print the loss every N steps.
    #[arg(long, default_value_t = 10)]
    pub logging_steps: usize,
    /// Where logs, checkpoints and the final model go.
    #[arg(long)]
    pub output_dir: PathBuf,
    /// Continue from the latest checkpoint-N/ in --output-dir.
    #[arg(long)]
    pub resume: bool,
    /// Write into a non-empty --output-dir.
    #[arg(long)]
    pub overwrite: bool,
    /// fp32, bf16 or fp16 (ort; pytorch on the CPU: fp32 or bf16).
    #[arg(long, default_value = "fp32")]
    pub precision: String,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Overrides every dropout probability of the model.
    #[arg(long)]
    pub dropout: Option<f64>,
}

#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// The model directory (e.g. what `ortbench train` saved).
    #[arg(long)]
    pub model: String,
    /// Write the ONNX model here.
    #[arg(long)]
    pub onnx: PathBuf,
    /// Export with another head than the checkpoint's (rarely useful: its weights must be in
    /// the file).
    #[arg(long)]
    pub task: Option<String>,
}
