//! `scripts/gpu-validate`, rehearsed without a GPU (`--rehearse`): the validation a GPU lease
//! runs in one command must end within its budget, leave at most 8 files (the device tool's
//! limit) and say per step what happened — so here, with a 60-second budget, the steps a CPU
//! can run (the kernel tests and the GPU executor test on the host SIMT harness, the NVRTC
//! gate) run under their time slices, the longest is cut by its slice and reported as
//! such, and the GPU-only steps are reported as not run; the exit status says the run was
//! incomplete (3) and the summary's first line says so. A SIGTERM mid-step still leaves the
//! summary and the archive. A pack built from another commit or other sources is refused in one
//! line before anything runs (exit 2).
//!
//! The test binaries are the ones cargo built beside this one (GPU_VALIDATE_DEPS), which
//! `cargo test --workspace` (scripts/test) builds before running any test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The two rehearsals take turns: each wants the machine's cores to itself.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const BUDGET_S: u64 = 60;
/// Start-up, the final summary and archive, a step's kill grace: what the budget may be
/// overrun by.
const SLACK_S: u64 = 10;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// target/<profile>/deps, where cargo put this test binary and the engine's kernel tests.
fn deps_dir() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().to_path_buf()
}

/// A rehearsal writing to `out`, with `pack` as its pack folder (GPU_VALIDATE_BIN): an empty
/// folder unless a test puts a BUILD there, so that a pack left in the checkout plays no part.
fn rehearsal(out: &Path, pack: &Path) -> Command {
    let mut c = Command::new(root().join("scripts/gpu-validate"));
    c.args(["--rehearse", "--budget-s", &BUDGET_S.to_string(), "--out", out.to_str().unwrap()])
        .env("GPU_VALIDATE_DEPS", deps_dir())
        .env("GPU_VALIDATE_BIN", pack)
        .env_remove("OUT")
        .env_remove("ORTBENCH_KERNEL_DEVICE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Ok(py) = std::env::var("ORTBENCH_PYTHON") {
        c.env("PYTHON", py);
    }
    c
}

/// Every file under `dir`, as paths relative to it.
fn files(dir: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(
                files(&p)
                    .into_iter()
                    .map(|f| format!("{}/{f}", p.file_name().unwrap().to_string_lossy())),
            );
        } else {
            v.push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    v
}

/// The verdict column of a step's row in summary.txt (`| step | verdict | s | detail |`).
fn verdict(summary: &str, step: &str) -> String {
    summary
        .lines()
        .find(|l| l.starts_with(&format!("| {step} |")))
        .unwrap_or_else(|| panic!("no row for {step} in:\n{summary}"))
        .split('|')
        .nth(2)
        .unwrap()
        .trim()
        .to_string()
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The files the device tool would return: at most 8, no deeper than 2 folders, the summary
/// and one archive of the logs among them.
fn check_out_folder(out: &Path, o: &Output) -> String {
    let fs = files(out);
    assert!(fs.len() <= 8, "{} files in the out folder: {fs:?}", fs.len());
    assert!(fs.iter().all(|f| f.matches('/').count() <= 2), "{fs:?}");
    assert!(
        fs.contains(&"summary.txt".to_string()) && fs.contains(&"logs.tar.gz".to_string()),
        "{fs:?}\n{}",
        text(o)
    );
    assert_eq!(fs.iter().filter(|f| f.ends_with(".tar.gz")).count(), 1, "{fs:?}");
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    // The summary is also printed.
    let row = summary
        .lines()
        .find(|l| l.starts_with("| preflight |"))
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(String::from_utf8_lossy(&o.stdout).contains(row), "{}", text(o));
    let tar = Command::new("tar").arg("-tzf").arg(out.join("logs.tar.gz")).output().unwrap();
    assert!(tar.status.success());
    let listing = String::from_utf8_lossy(&tar.stdout).into_owned();
    assert!(listing.contains("logs/preflight.log"), "{listing}");
    summary
}

#[test]
fn the_rehearsal_ends_within_its_budget_with_a_step_cut_by_its_slice() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let t = Instant::now();
    let o = rehearsal(&out, dir.path()).output().unwrap();
    let wall = t.elapsed();
    println!("rehearsal: {:.1} s\n{}", wall.as_secs_f64(), String::from_utf8_lossy(&o.stdout));
    assert!(
        wall <= Duration::from_secs(BUDGET_S + SLACK_S),
        "{:.1} s for a {BUDGET_S} s budget\n{}",
        wall.as_secs_f64(),
        text(&o)
    );
    // A step was cut (below): incomplete, exit 3, and the verdict first.
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let summary = check_out_folder(&out, &o);
    let first = summary.lines().next().unwrap();
    assert!(
        first.starts_with("verdict: INCOMPLETE (exit 3) — nothing failed; cut or not reached: "),
        "{summary}"
    );

    // Each step's verdict was printed when it ended, before the summary.
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("[gpu-validate] preflight: passed"), "{}", text(&o));
    assert_eq!(verdict(&summary, "preflight"), "passed", "{summary}");
    for gpu_only in ["speed", "kernel-times", "memcheck", "racecheck", "compile", "nccl"] {
        assert_eq!(verdict(&summary, gpu_only), "not run (no GPU)", "{summary}");
    }
    let cpu = ["kernels", "executor", "parity", "nvrtc-gate"];
    for step in cpu {
        let v = verdict(&summary, step);
        assert!(
            v == "passed" || v.starts_with("cut by its time slice") || v.starts_with("not reached"),
            "{step}: {v}\n{summary}"
        );
    }
    assert!(!summary.contains("| failed"), "{summary}");
    // The parity step (bert and gpt2 under pytorch and ort on the CPU) takes minutes here: its
    // slice cuts it (the kernel and executor tests on the SIMT fibers finish in seconds).
    let cut: Vec<_> =
        cpu.iter().filter(|s| verdict(&summary, s).starts_with("cut by its time slice")).collect();
    assert!(!cut.is_empty(), "no step was cut by its time slice:\n{summary}");
    // ... and the summary says how far the kernel tests got.
    let kernels = summary.lines().find(|l| l.starts_with("| kernels |")).unwrap();
    assert!(kernels.contains("binaries passed"), "{summary}");
    if verdict(&summary, "kernels").starts_with("cut") {
        assert!(kernels.contains(", cut in simt_"), "{summary}");
    }
}

#[test]
fn a_sigterm_mid_step_still_leaves_the_summary_and_the_archive() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let child = rehearsal(&out, dir.path()).spawn().unwrap();
    // Into the kernel tests, or at least past the preflight.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
        let s = std::fs::read_to_string(out.join("summary.txt")).unwrap_or_default();
        if s.lines().any(|l| l.starts_with("| kernels | running")) {
            break;
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    let st = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
    let killed = Instant::now();
    let o = child.wait_with_output().unwrap();
    println!(
        "after SIGTERM: {:.1} s\n{}",
        killed.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "{:.1} s after SIGTERM\n{}",
        killed.elapsed().as_secs_f64(),
        text(&o)
    );
    assert_eq!(o.status.code(), Some(143), "{}", text(&o));
    let summary = check_out_folder(&out, &o);
    assert!(summary.contains("cut (script killed by SIGTERM)"), "{summary}");
    assert!(summary.starts_with("verdict: STOPPED by SIGTERM (exit 143)"), "{summary}");
    assert!(summary.contains("not reached (script killed by SIGTERM)"), "{summary}");
    assert!(!summary.contains("(in progress)"), "{summary}");
}

/// A pack whose BUILD names another commit, or this commit with other sources (uncommitted
/// changes since), is refused in one line, exit 2, before any step: the summary holds the
/// verdict alone.
#[test]
fn a_pack_built_from_another_commit_or_other_sources_is_refused_in_one_line() {
    let head = Command::new("git")
        .args(["-C", root().to_str().unwrap(), "rev-parse", "HEAD"])
        .output()
        .unwrap();
    assert!(head.status.success(), "git rev-parse HEAD in {}", root().display());
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    let other = if head.starts_with('0') { "1" } else { "0" }.repeat(40);
    for (commit, want) in [
        (other.as_str(), "the pack was built from commit"),
        (head.as_str(), "the pack was built from other sources"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (out, pack) = (dir.path().join("out"), dir.path().join("pack"));
        std::fs::create_dir_all(&pack).unwrap();
        let build = format!("commit {commit}\ndirty yes\nsources 0123456789abcdef\ntorch 2.11.0 cuda 13.0\ndate 2026-11-28 00:00:00 UTC\n");
        std::fs::write(pack.join("BUILD"), build).unwrap();
        let t = Instant::now();
        let o = rehearsal(&out, &pack).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}\n{}", t.elapsed(), text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{}", text(&o));
        assert!(
            err.starts_with("gpu-validate: refused: ")
                && err.contains(want)
                && err.contains("--pack"),
            "{}",
            text(&o)
        );
        assert!(String::from_utf8_lossy(&o.stdout).is_empty(), "a step ran:\n{}", text(&o));
        let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
        assert_eq!(summary.lines().count(), 1, "{summary}");
        assert!(
            summary.starts_with("verdict: REFUSED (exit 2) — ") && summary.contains(want),
            "{summary}"
        );
        println!("{commit:.12}: {}", err.trim());
    }
}
