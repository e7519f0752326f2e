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

/// A killed worker's own children go with it (its process group is killed, not its pid): the
/// hanging worker first starts a child, as torch-compile's inductor starts compile workers.
#[test]
fn a_timed_out_workers_children_are_killed_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let marker = format!("{}-{}", std::process::id(), out.display().to_string().len());
    let args = [
        &["run", "--models", "tiny-gpt2", "--configs", "ort", "--out", out.to_str().unwrap()],
        QUICK,
        &["--timeout-s", "4"],
    ]
    .concat();
    let o = ortbench(
        &args,
        &[("ORTBENCH_FAULT", "hang-at-step:1@ort"), ("ORTBENCH_FAULT_MARKER", &marker)],
        false,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let alive = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
            .filter(|c| {
                String::from_utf8_lossy(c).contains(&format!("ortbench-fault-child-{marker}"))
            })
            .count()
    };
    // The kill is asynchronous for the orphan: allow it a moment.
    let t = Instant::now();
    while alive() > 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(alive(), 0, "the worker's child outlived it");
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

/// fp16 at a learning rate of 100: after the first step every step's gradients overflow, the
/// loss scale halves each time and the step is skipped. Every step reaches steps.csv (the
/// workers write the NaN losses as strings JSON can carry), flagged `skipped`, with the loss
/// scale; the run is `diverged` with the count, never `ok`, and its final loss is no number.
#[test]
fn an_fp16_run_whose_steps_overflow_records_every_step_and_is_not_ok() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = [
        "run",
        "--models",
        "tiny-gpt2",
        "--configs",
        "ort",
        "--precision",
        "fp16",
        "--lr",
        "100",
        "--steps",
        "8",
        "--warmup",
        "0",
        "--repeat",
        "1",
        "--parity-steps",
        "0",
        "--out",
        out.to_str().unwrap(),
    ];
    let o = ortbench(&args, &[], false);
    let (sh, steps) = read_csv(&out.join("steps.csv"));
    let get = |r: &Vec<String>, c: &str| r[col(&sh, c)].clone();
    let text = format!("{}\n{steps:?}", stderr(&o));
    assert_eq!(steps.len(), 8, "{text}");
    let skipped: Vec<bool> = steps.iter().map(|r| get(r, "skipped") == "true").collect();
    let n_skipped = skipped.iter().filter(|&&s| s).count();
    assert!(n_skipped > 4, "{n_skipped} skipped: {text}");
    // The rows whose loss JSON cannot carry as a number are there (what used to be lost).
    let losses: Vec<f64> = steps.iter().map(|r| get(r, "loss").parse().unwrap()).collect();
    assert!(losses.iter().any(|l| !l.is_finite()), "no non-finite loss: {losses:?}");
    let scales: Vec<f64> = steps.iter().map(|r| get(r, "loss_scale").parse().unwrap()).collect();
    assert!(scales.last() < scales.first(), "the loss scale never came down: {scales:?}");
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(cell(&h, &rows, "ort", "status"), "diverged", "{text}");
    let err = cell(&h, &rows, "ort", "error");
    assert!(err.contains(&format!("{n_skipped} of 8 timed steps skipped")), "{err}");
    assert_eq!(o.status.code(), Some(1), "{text}");
}
