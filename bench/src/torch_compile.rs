//! The `torch-compile` config: HF Transformers + `torch.compile` (inductor, default mode) — what
//! HF Trainer's `torch_compile=True` runs — trained by `scripts/torch-compile.py --worker`
//! under the venv's python instead of `ortbench worker`, speaking the same protocol (step
//! records, a summary, or an error).
//!
//! Same inputs as the other configs: before starting it, the harness builds the run's model
//! config, initial weights and global batches with the function every Rust worker uses
//! ([`crate::worker::model_inputs`]) and writes them into a scratch directory of the run — the
//! weights as an HF model directory (config.json + model.safetensors, what `save_pretrained`
//! writes), the batches as the `--data` format, steps × batch rows in step order — and the run
//! spec with the threads a one-rank Rust worker uses. Each run gets its own directory, removed
//! when it ends, and in it its own `TORCHINDUCTOR_CACHE_DIR` and `TRITON_CACHE_DIR`: the
//! compile cache is never shared between repeats, so every run pays (and reports) the full
//! compilation.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use ortbench_models::config::ProblemType;
use ortbench_models::{DataSource, Task};
use safetensors::tensor::{Dtype, TensorView};

use crate::run_spec::RunSpec;

pub const CONFIG: &str = "torch-compile";

/// The worker, embedded so that the binary runs it wherever it is installed.
pub const SCRIPT: &str = include_str!("../../scripts/torch-compile.py");

/// `ORTBENCH_TORCH_COMPILE=eager` runs the torch-compile worker without `torch.compile` (HF
/// eager through the same loop): for tests that compare its losses with HF's own.
pub const MODE_VAR: &str = "ORTBENCH_TORCH_COMPILE";

/// Whether the worker compiles: yes when `ORTBENCH_TORCH_COMPILE` is unset or `compile`, no
/// when it is `eager`; any other value is an error (never silently read as "compile").
pub fn compiles() -> Result<bool> {
    compiles_with(std::env::var(MODE_VAR).ok().as_deref())
}

fn compiles_with(mode: Option<&str>) -> Result<bool> {
    match mode.map(str::trim) {
        None | Some("") | Some("compile") => Ok(true),
        Some("eager") => Ok(false),
        Some(other) => bail!("{MODE_VAR}={other}: it takes compile (the default) or eager (HF eager through the torch-compile worker's loop)"),
    }
}

/// The python that runs the worker: `ORTBENCH_PYTHON`, else the active venv's
/// (`$VIRTUAL_ENV`, which scripts/env.sh sets), else this checkout's `.venv`, else `python3`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("ORTBENCH_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let venvs = [
        std::env::var_os("VIRTUAL_ENV").map(PathBuf::from),
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(|r| r.join(".venv")),
    ];
    venvs
        .into_iter()
        .flatten()
        .map(|v| v.join("bin/python"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// The C++ compiler inductor (torch 2.11) uses on Linux: `$CXX`, else `g++`
/// (`torch._inductor.config.cpp.cxx`, tried with `--version`).
pub fn cxx() -> String {
    std::env::var("CXX").ok().filter(|c| !c.trim().is_empty()).unwrap_or_else(|| "g++".into())
}

/// Whether this machine can run the config: a C++ compiler for inductor, found the way inductor
/// finds one, and a python with torch, transformers and safetensors. The error is one line.
pub fn check_available() -> Result<()> {
    compiles()?;
    let cxx = cxx();
    let ok = Command::new(&cxx)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!("config '{CONFIG}' needs a C++ compiler for inductor and `{cxx} --version` fails on this machine (inductor uses $CXX, else g++ on PATH): install g++ or set CXX");
    }
    let py = python();
    let probe = "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in ('torch', 'transformers', 'safetensors')) else 3)";
    let found = Command::new(&py)
        .args(["-c", probe])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match found {
        Ok(s) if s.success() => Ok(()),
        Ok(_) => bail!("config '{CONFIG}' needs torch, transformers and safetensors in {} (run scripts/setup, or set ORTBENCH_PYTHON)", py.display()),
        Err(e) => bail!("config '{CONFIG}' needs a python with torch and transformers: cannot run {} ({e}; run scripts/setup, or set ORTBENCH_PYTHON)", py.display()),
    }
}

/// What the torch-compile runs ran on, for run.json: the python, its torch and transformers
/// versions (`python -c`, a few seconds: transformers' import), inductor's C++ compiler and the
/// compile-cache rule.
pub fn describe() -> serde_json::Value {
    let py = python();
    let code = "import json, torch, transformers; print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__}))";
    let versions = Command::new(&py)
        .args(["-c", code])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .unwrap_or(serde_json::Value::Null);
    let cxx = cxx();
    let cxx_version = Command::new(&cxx)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_string));
    serde_json::json!({
        "python": py,
        "versions": versions,
        "cxx": cxx,
        "cxx_version": cxx_version,
        "mode": if compiles().is_ok_and(|c| !c) { "eager (ORTBENCH_TORCH_COMPILE=eager: no torch.compile)" } else { "torch.compile, inductor, default mode" },
        "compile_cache": "fresh per run (TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR in the run's scratch directory): never shared between runs",
        "compile_s": "the first step's wall time (compilation of forward and backward, and that step's compute); never a timed step",
    })
}

/// A torch-compile run's scratch directory: the model, the batches, the spec, the script and
/// the compile caches (inductor's compiled libraries, which the worker loads and runs). A
/// private directory of an unpredictable name (`tempfile`, created anew with mode 0700 — its
/// default follows the umask, 0755 here), so no other user can plant, read or swap what runs;
/// removed on drop.
pub struct Scratch {
    tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl Scratch {
    /// Writes everything the worker reads for `spec`.
    pub fn prepare(spec: &RunSpec) -> Result<Scratch> {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::Builder::new()
            .prefix("ortbench-torch-compile-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .with_context(|| {
                format!("cannot create a directory in {}", std::env::temp_dir().display())
            })?;
        let dir = tmp.path().to_path_buf();
        let scratch = Scratch { tmp, dir };
        scratch.write(spec)?;
        Ok(scratch)
    }

    /// The directory (removed when the scratch is dropped).
    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    fn write(&self, spec: &RunSpec) -> Result<()> {
        let (cfg, weights, data) = crate::worker::model_inputs(spec)?;
        let model_dir = self.dir.join("model");
        std::fs::create_dir_all(&model_dir)?;
        let mut raw = cfg.raw.clone();
        raw["architectures"] = serde_json::json!([cfg.arch.hf_name()]);
        std::fs::write(model_dir.join("config.json"), serde_json::to_string_pretty(&raw)?)?;
        weights.save(&model_dir.join("model.safetensors"))?;
        let batches = self.dir.join("batches.safetensors");
        write_batches(&data, spec.steps, &batches)?;
        // The threads a one-rank Rust worker gives libtorch and the engine (worker::run).
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let compile = compiles()?;
        let mut json = serde_json::to_value(spec)?;
        json["torch_compile"] = serde_json::json!({
            "model_dir": model_dir,
            "data": batches,
            "threads": threads,
            "compile": compile,
        });
        std::fs::write(self.dir.join("spec.json"), serde_json::to_string_pretty(&json)?)?;
        std::fs::write(self.dir.join("torch-compile.py"), SCRIPT)?;
        Ok(())
    }

    /// The worker's command: the venv's python on the script, its compile caches in the
    /// scratch directory (fresh per run).
    pub fn command(&self) -> Command {
        let mut c = Command::new(python());
        c.arg(self.dir.join("torch-compile.py"))
            .arg("--worker")
            .arg(self.dir.join("spec.json"))
            .env("TORCHINDUCTOR_CACHE_DIR", self.dir.join("inductor-cache"))
            .env("TRITON_CACHE_DIR", self.dir.join("triton-cache"))
            .env("PYTHONUNBUFFERED", "1");
        c
    }
}

/// The batches of steps 0..steps as a `--data` file: `input_ids` [N, T], `labels` (LM and
/// token labels [N, T], single-label [N], multi-label [N, k], regression targets f32 [N]),
/// `attention_mask` [N, T] when the source has one; N = steps × batch rows, in step order, so
/// step s takes rows s·B .. (s+1)·B.
pub fn write_batches(data: &DataSource, steps: usize, path: &Path) -> Result<()> {
    let (b, t) = (data.batch_size, data.seq_len);
    let n = steps * b;
    let (mut ids, mut labels, mut targets, mut mask) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for s in 0..steps {
        let batch = data.batch(s);
        ids.extend(batch.input_ids);
        labels.extend(batch.labels);
        targets.extend(batch.targets.unwrap_or_default());
        if let Some(m) = batch.attention_mask {
            mask.extend(m);
        }
    }
    let le64 = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (ids_b, mask_b) = (le64(&ids), le64(&mask));
    let (label_bytes, label_dtype, label_shape) = match data.task() {
        Task::MaskedLm | Task::CausalLm | Task::TokenClassification { .. } => {
            (le64(&labels), Dtype::I64, vec![n, t])
        }
        Task::SequenceClassification { problem: ProblemType::SingleLabel, .. } => {
            (le64(&labels), Dtype::I64, vec![n])
        }
        Task::SequenceClassification { problem: ProblemType::MultiLabel, num_labels } => {
            (le64(&labels), Dtype::I64, vec![n, num_labels])
        }
        Task::SequenceClassification { problem: ProblemType::Regression, .. } => {
            (targets.iter().flat_map(|x| x.to_le_bytes()).collect(), Dtype::F32, vec![n])
        }
    };
    let mut views = vec![
        ("input_ids".to_string(), TensorView::new(Dtype::I64, vec![n, t], &ids_b)?),
        ("labels".to_string(), TensorView::new(label_dtype, label_shape, &label_bytes)?),
    ];
    if data.has_attention_mask() {
        views.push((
            "attention_mask".to_string(),
            TensorView::new(Dtype::I64, vec![n, t], &mask_b)?,
        ));
    }
    safetensors::serialize_to_file(views, None, path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_variable_takes_eager_or_nothing() {
        assert!(compiles_with(None).unwrap());
        assert!(compiles_with(Some("")).unwrap());
        assert!(!compiles_with(Some(" eager")).unwrap());
        assert!(compiles_with(Some("compile")).unwrap());
        let e = compiles_with(Some("eagre")).unwrap_err().to_string();
        assert!(e.contains("ORTBENCH_TORCH_COMPILE=eagre") && e.contains("eager"), "{e}");
    }

    /// The worker's scratch (which holds the script and the compiled libraries it runs) is a
    /// fresh private directory: mode 0700, a random name (not the pid and a counter), and gone
    /// once dropped.
    #[test]
    fn the_scratch_directory_is_private_fresh_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let spec: RunSpec = serde_json::from_value(serde_json::json!({
            "model": "tiny-gpt2", "config": "torch-compile", "precision": "fp32", "device": "cpu",
            "batch_size": 2, "ranks": 1, "seq_len": 16, "steps": 2, "warmup": 1, "seed": 0,
            "lr": 1e-3, "weight_decay": 0.0, "max_grad_norm": 1.0, "lr_schedule": "constant",
            "lr_warmup_steps": 0, "dropout": null, "data": null, "weights": "Random"
        }))
        .unwrap();
        let (a, b) = (Scratch::prepare(&spec).unwrap(), Scratch::prepare(&spec).unwrap());
        assert_ne!(a.path(), b.path());
        for s in [&a, &b] {
            let mode = std::fs::metadata(s.path()).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", s.path().display());
            let name = s.path().file_name().unwrap().to_string_lossy().into_owned();
            // tempfile's random suffix, not `ortbench-torch-compile-PID-N`.
            let suffix = name.strip_prefix("ortbench-torch-compile-").unwrap();
            assert!(suffix.len() >= 6 && !suffix.contains('-'), "{name}");
            assert!(s.path().join("torch-compile.py").is_file());
        }
        let gone = a.path().to_path_buf();
        drop(a);
        assert!(!gone.exists());
    }
}
