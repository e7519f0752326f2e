//! Runs that fail for real — a worker that crashes, runs out of memory, is killed, hangs past
//! --timeout-s, or a `run` interrupted with SIGINT, a libtorch error or a CUDA out-of-memory in
//! the baseline's step — are recorded and the others complete. Failures are injected with
//! ORTBENCH_FAULT (see worker::Fault).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

fn run_with_fault(out: &Path, fault: &str, extra: &[&str]) -> std::process::Output {
    let args =
        [&["run", "--models", "tiny-gpt2", "--out", out.to_str().unwrap()], QUICK, extra].concat();
    ortbench(&args, &[("ORTBENCH_FAULT", fault)], false)
}

#[test]
fn a_crashing_worker_is_an_error_and_the_other_runs_complete() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = run_with_fault(&out, "crash-at-step:1@ort", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(rows.len(), 3);
    assert_eq!(cell(&h, &rows, "ort", "status"), "error");
    let err = cell(&h, &rows, "ort", "error");
    assert!(err.contains("signal 6 (SIGABRT)") && err.contains("after 1/3 steps"), "{err}");
    for ok in ["pytorch", "ort-zero1"] {
        assert_eq!(cell(&h, &rows, ok, "status"), "ok");
        assert!(cell(&h, &rows, ok, "samples_per_s").parse::<f64>().unwrap() > 0.0);
    }
    // The crashed run keeps the step it finished; the others all of theirs.
    let (sh, steps) = read_csv(&out.join("steps.csv"));
    let n = |c: &str| steps.iter().filter(|r| r[col(&sh, "config")] == c).count();
    assert_eq!((n("pytorch"), n("ort"), n("ort-zero1")), (3, 1, 3));
    // The error is in the report too.
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("SIGABRT"));
    assert_eq!(ortbench::results::load_run(&out).unwrap().results.height(), 3);
}

#[test]
fn an_out_of_memory_worker_is_reported_as_oom() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // The worker caps its address space and allocates past it: the allocator fails for real.
    let o = run_with_fault(&out, "oom-at-step:1@ort-zero1", &["--configs", "pytorch,ort-zero1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(cell(&h, &rows, "pytorch", "status"), "ok");
    assert_eq!(
        cell(&h, &rows, "ort-zero1", "status"),
        "oom",
        "{}",
        cell(&h, &rows, "ort-zero1", "error")
    );
    assert!(cell(&h, &rows, "ort-zero1", "error").contains("memory allocation of"));
}

#[test]
fn a_sigkill_far_from_the_memory_limit_is_an_error_not_oom() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = run_with_fault(&out, "sigkill-at-step:0@ort", &["--configs", "ort"]);
    assert_eq!(o.status.code(), Some(1));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(cell(&h, &rows, "ort", "status"), "error");
    assert!(cell(&h, &rows, "ort", "error").contains("signal 9 (SIGKILL)"));
}

#[test]
fn a_hanging_worker_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let t = Instant::now();
    let o = run_with_fault(&out, "hang-at-step:1@ort", &["--timeout-s", "4"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(t.elapsed() < Duration::from_secs(120));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(rows.len(), 3);
    assert_eq!(cell(&h, &rows, "ort", "status"), "timeout");
    assert!(cell(&h, &rows, "ort", "error").contains("--timeout-s 4"));
    assert_eq!(cell(&h, &rows, "ort-zero1", "status"), "ok");
}

#[test]
fn sigint_keeps_the_finished_runs_and_writes_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let child = ortbench_cmd()
        .args([&["run", "--models", "tiny-gpt2", "--out", out.to_str().unwrap()], QUICK].concat())
        .env("ORTBENCH_CPU_PEAK_GFLOPS", "100")
        // pytorch runs first and finishes; ort then hangs until the interrupt.
        .env("ORTBENCH_FAULT", "hang-at-step:0@ort")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let results = out.join("results.csv");
    loop {
        let done = results.is_file() && read_csv(&results).1.len() == 1;
        if done {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "the first run did not finish");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500)); // the ort worker is now hanging
                                                    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let (h, rows) = read_csv(&results);
    assert_eq!(rows.len(), 2, "the finished run and the interrupted one; ort-zero1 never started");
    assert_eq!(cell(&h, &rows, "pytorch", "status"), "ok");
    assert_eq!(cell(&h, &rows, "ort", "status"), "interrupted");
    let run = ortbench::results::load_run(&out).expect("valid files after SIGINT");
    assert_eq!(run.results.height(), 2);
    assert_eq!(run.steps.height(), 3, "pytorch's steps");
    assert_eq!(run.env["interrupted"], true);
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("interrupted"));
    // No temporary files are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_libtorch_error_in_the_baseline_step_is_an_error_with_libtorch_s_text() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // Step 1 runs a matmul on mismatched shapes inside libtorch: tch panics on libtorch's error,
    // as it would on a CUDA error; the step returns it instead.
    let o = run_with_fault(&out, "torch-error-at-step:1", &["--configs", "pytorch,ort"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(cell(&h, &rows, "ort", "status"), "ok");
    assert_eq!(cell(&h, &rows, "pytorch", "status"), "error");
    let err = cell(&h, &rows, "pytorch", "error");
    assert!(
        err.contains("pytorch step 1: libtorch: ")
            && err.contains("shapes cannot be multiplied (2x3 and 4x5)"),
        "{err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("Exception raised from") && !err.contains('\n'),
        "{err}"
    );
    let (sh, steps) = read_csv(&out.join("steps.csv"));
    assert_eq!(
        steps.iter().filter(|r| r[col(&sh, "config")] == "pytorch").count(),
        1,
        "the step before the error"
    );
}

#[test]
fn a_cuda_out_of_memory_in_the_baseline_step_is_oom() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // libtorch raises its CUDA out-of-memory text in step 0, through the path a real one takes.
    let o = run_with_fault(&out, "cuda-oom", &["--configs", "pytorch"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    let err = cell(&h, &rows, "pytorch", "error");
    assert_eq!(cell(&h, &rows, "pytorch", "status"), "oom", "{err}");
    assert!(err.contains("libtorch: CUDA out of memory. Tried to allocate 2.00 GiB."), "{err}");
}
