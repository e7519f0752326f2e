//! libtorch's libraries as the processes really load them, read from the dynamic loader's own
//! trace (`LD_DEBUG`, one file per process through `LD_DEBUG_OUTPUT`):
//!
//! - a run asking for `--device cuda` loads libtorch_cuda (the linker drops it from the binary's
//!   needed libraries, so without the explicit load libtorch counts 0 CUDA devices), from beside
//!   the libtorch_cpu mapped in the process — the harness for its device check and a worker for
//!   its run; a `--device cpu` run loads it in no process, so CPU memory figures are unchanged;
//! - a binary carried elsewhere finds libtorch through a `torch-lib` link beside it (its first
//!   RUNPATH entry, `$ORIGIN/torch-lib`) with a clean environment, reports the torch it found,
//!   and a CUDA run of it loads libtorch_cuda from that torch;
//! - the torch wheel's folders are found from the libtorch mapped in this process.
//!
//! Without a GPU the CUDA runs then stop at "0 CUDA device(s)", as they should; what is tested
//! here is the loading.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use ortbench_engine::torch_wheel::{self, Source, LIBTORCH_CPU, LIBTORCH_CUDA};

/// The wheel of the libtorch this test binary has mapped.
fn wheel() -> torch_wheel::TorchWheel {
    // A use of libtorch, so that the linker keeps it among this binary's needed libraries
    // (with --as-needed a binary that calls none of it does not load it).
    assert_eq!(tch::Tensor::from(2i64).int64_value(&[]), 2);
    torch_wheel::from_mapped().expect("this test binary has libtorch mapped")
}

/// The loader's trace files `LD_DEBUG_OUTPUT=dir/ld` left: (pid, text) per process.
fn traces(dir: &Path) -> Vec<(u32, String)> {
    let mut v: Vec<(u32, String)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.strip_prefix("ld.")?.parse().ok()?;
            Some((pid, std::fs::read_to_string(e.path()).ok()?))
        })
        .collect();
    v.sort();
    v
}

/// Whether a trace shows `lib` loaded (`file=…/lib [0];  …`, the loader's record of a new object).
fn loaded(trace: &str, lib: &str) -> bool {
    trace.lines().any(|l| l.contains("file=") && l.contains(lib))
}

fn with_trace(c: &mut Command, dir: &Path, what: &str) {
    c.env("LD_DEBUG", what).env("LD_DEBUG_OUTPUT", dir.join("ld"));
}

const NO_GPU: &str = "0 CUDA device(s)";

#[test]
fn a_cuda_run_loads_libtorch_cuda_beside_the_mapped_libtorch() {
    let dir = tempfile::tempdir().unwrap();
    let ld = dir.path().join("ld-cuda");
    std::fs::create_dir(&ld).unwrap();
    let out = dir.path().join("run");
    let mut c = ortbench_cmd();
    c.args(
        [
            &[
                "run",
                "--models",
                "tiny-gpt2",
                "--configs",
                "pytorch",
                "--device",
                "cuda",
                "--out",
                out.to_str().unwrap(),
            ],
            QUICK,
        ]
        .concat(),
    );
    with_trace(&mut c, &ld, "files");
    let child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    let traces = traces(&ld);
    let (_, harness) = traces.iter().find(|(p, _)| *p == pid).expect("the harness's trace");
    // Loaded by path from the real folder of the libtorch_cpu this process mapped.
    let expect = format!("file={}", wheel().lib_dir().join(LIBTORCH_CUDA).display());
    assert!(
        harness.lines().any(|l| l.contains(&expect)),
        "no '{expect}' in the harness's trace:\n{}",
        harness.lines().filter(|l| l.contains("libtorch")).collect::<Vec<_>>().join("\n")
    );
    if err.contains(NO_GPU) {
        // No GPU: one line, the device check's, and no worker started.
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("--device cuda: 0 CUDA device(s) available"), "{err}");
    } else {
        assert!(o.status.success(), "{err}");
    }
}

#[test]
fn a_cuda_worker_loads_libtorch_cuda_itself() {
    // The worker (a process of its own, started by the harness with a run spec) loads it too,
    // before its first CUDA query. Without a GPU it then fails to open the device.
    let dir = tempfile::tempdir().unwrap();
    let ld = dir.path().join("ld-worker");
    std::fs::create_dir(&ld).unwrap();
    let spec = serde_json::json!({
        "model": "tiny-gpt2", "config": "pytorch", "precision": "fp32", "device": "cuda",
        "batch_size": 2, "ranks": 1, "seq_len": 16, "steps": 2, "warmup": 1, "seed": 0,
        "lr": 1e-4, "weight_decay": 0.0, "max_grad_norm": 1.0, "lr_schedule": "constant",
        "lr_warmup_steps": 0, "dropout": 0.0, "data": null, "weights": "Random"
    });
    let mut c = ortbench_cmd();
    c.args(["worker", "--spec", &spec.to_string()]);
    with_trace(&mut c, &ld, "files");
    let o = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let traces = traces(&ld);
    let worker = traces
        .iter()
        .find(|(_, t)| loaded(t, LIBTORCH_CPU))
        .map(|(_, t)| t)
        .expect("the worker's trace");
    assert!(
        loaded(worker, LIBTORCH_CUDA),
        "the cuda worker did not load {LIBTORCH_CUDA}; stdout: {stdout}"
    );
    if !o.status.success() {
        // One error event, not a crash: e.g. "measuring GPU 0: libcuda not found".
        let last = stdout.lines().last().unwrap_or_default();
        assert!(last.contains("\"event\":\"error\""), "{stdout}\n{}", stderr(&o));
    }
}

#[test]
fn a_cpu_run_loads_libtorch_cuda_in_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let ld = dir.path().join("ld-cpu");
    std::fs::create_dir(&ld).unwrap();
    let out = dir.path().join("run");
    let mut c = ortbench_cmd();
    c.args(
        [
            &[
                "run",
                "--models",
                "tiny-gpt2",
                "--configs",
                "pytorch,ort",
                "--device",
                "cpu",
                "--out",
                out.to_str().unwrap(),
            ],
            QUICK,
        ]
        .concat(),
    );
    c.env("ORTBENCH_CPU_PEAK_GFLOPS", "100");
    with_trace(&mut c, &ld, "files");
    let child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(
        (cell(&h, &rows, "pytorch", "status"), cell(&h, &rows, "ort", "status")),
        ("ok", "ok")
    );
    let traces = traces(&ld);
    // The harness and its two workers (other children, e.g. git, map no libtorch).
    let ortbench: Vec<u32> =
        traces.iter().filter(|(_, t)| loaded(t, LIBTORCH_CPU)).map(|(p, _)| *p).collect();
    assert!(
        ortbench.contains(&pid) && ortbench.len() >= 3,
        "harness {pid}, processes with libtorch {ortbench:?}"
    );
    for (p, t) in &traces {
        assert!(!loaded(t, LIBTORCH_CUDA), "process {p} of a CPU run loaded {LIBTORCH_CUDA}");
    }
}

#[test]
fn the_wheel_is_found_from_the_mapped_libtorch() {
    let w = wheel();
    assert_eq!(w.source, Source::Mapped);
    assert_eq!(torch_wheel::find().as_ref(), Some(&w), "the mapped libtorch comes first");
    // The same torch as the venv's (the one this binary was built against).
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        assert_eq!(
            torch_wheel::from_virtual_env(Path::new(&venv)).map(|v| v.torch_dir),
            Some(w.torch_dir.clone())
        );
        let py = Path::new(&venv).join("bin/python3");
        assert_eq!(
            torch_wheel::from_python(py.to_str().unwrap()).map(|v| v.torch_dir),
            Some(w.torch_dir.clone())
        );
    }
    let site = w.site_packages();
    assert_eq!(w.cuda_lib_dirs(), vec![site.join("nvidia/cu13/lib")]);
    assert!(w.nccl_lib_dir().is_some_and(|d| d.join("libnccl.so.2").is_file()));
    assert!(
        w.lib_dir().join(LIBTORCH_CUDA).is_file(),
        "the test machine's torch is the CUDA wheel"
    );
}

/// A copy of the ortbench binary in a folder of its own with `torch-lib` → this machine's
/// torch/lib, as a packed binary sits on a GPU machine.
fn packed(dir: &Path) -> PathBuf {
    let pack = dir.join("pack");
    std::fs::create_dir(&pack).unwrap();
    let exe = pack.join("ortbench");
    std::fs::copy(env!("CARGO_BIN_EXE_ortbench"), &exe).unwrap();
    std::os::unix::fs::symlink(wheel().lib_dir(), pack.join("torch-lib")).unwrap();
    exe
}

/// The packed binary with nothing in its environment but a system PATH (`env -i`).
fn clean(exe: &Path) -> Command {
    let mut c = Command::new(exe);
    c.env_clear().env("PATH", "/usr/bin:/bin");
    c
}

#[test]
fn the_binary_s_first_runpath_entry_is_the_torch_lib_link_beside_it() {
    let Ok(o) = Command::new("readelf").args(["-d", env!("CARGO_BIN_EXE_ortbench")]).output()
    else {
        eprintln!("no readelf: skipped");
        return;
    };
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("(RUNPATH)"))
        .unwrap_or_else(|| panic!("no RUNPATH:\n{text}"));
    assert!(line.contains("[$ORIGIN/torch-lib:"), "{line}");
    // libtorch_cuda is not among the needed libraries (rustc's --as-needed drops it): it is loaded.
    assert!(text.contains(LIBTORCH_CPU) && !text.contains(LIBTORCH_CUDA), "{text}");
}

#[test]
fn a_packed_binary_finds_torch_through_the_link_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let exe = packed(dir.path());
    let pack = exe.parent().unwrap();
    let w = wheel();
    // The loader resolves `torch-lib/..` physically (the link's target's parent), so libtorch's
    // own `$ORIGIN/../../nvidia/...` runpaths hold when it is loaded through the link.
    assert_eq!(
        pack.join("torch-lib/../../nvidia/cu13/lib").canonicalize().unwrap(),
        w.site_packages().join("nvidia/cu13/lib")
    );

    let ld = dir.path().join("ld-list");
    std::fs::create_dir(&ld).unwrap();
    let mut c = clean(&exe);
    c.arg("list");
    with_trace(&mut c, &ld, "libs");
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("tiny-gpt2"));
    let (_, trace) = &traces(&ld)[0];
    let through_link =
        format!("calling init: {}", pack.join("torch-lib").join(LIBTORCH_CPU).display());
    assert!(
        trace.contains(&through_link),
        "libtorch_cpu not loaded through the link:\n{}",
        trace.lines().filter(|l| l.contains("libtorch_cpu")).collect::<Vec<_>>().join("\n")
    );

    // `env` reports the torch it runs on, found from the mapped libtorch.
    let o = clean(&exe).args(["env", "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let env: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(env["libtorch_path"].as_str(), Some(w.torch_dir.to_str().unwrap()));
    assert!(env["torch_version"].as_str().is_some_and(|v| v.starts_with("2.")), "{env:#}");
    assert!(env["libtorch_cuda_loaded"].is_null(), "`env` asks for no CUDA");

    // A CUDA run loads libtorch_cuda from that torch.
    let ld = dir.path().join("ld-cuda");
    std::fs::create_dir(&ld).unwrap();
    let mut c = clean(&exe);
    c.args(
        [
            &[
                "run",
                "--models",
                "tiny-gpt2",
                "--configs",
                "pytorch",
                "--device",
                "cuda",
                "--out",
                dir.path().join("run").to_str().unwrap(),
            ],
            QUICK,
        ]
        .concat(),
    );
    with_trace(&mut c, &ld, "files");
    let o = c.output().unwrap();
    let traces = traces(&ld);
    let expect = format!("file={}", w.lib_dir().join(LIBTORCH_CUDA).display());
    assert!(
        traces.iter().any(|(_, t)| t.contains(&expect)),
        "no '{expect}' in the packed binary's traces; stderr: {}",
        stderr(&o)
    );
    if stderr(&o).contains(NO_GPU) {
        assert_eq!(o.status.code(), Some(2));
    }
}
