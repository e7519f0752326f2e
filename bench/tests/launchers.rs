//! Ranks started by the launchers clusters use rather than by the harness: Open MPI's real
//! `mpirun` and the variables Slurm's `srun` sets (`bench/tests/fake-srun`, one node, the
//! master from `SLURM_JOB_NODELIST=localhost`), each two worker processes on loopback
//! reproducing one rank's losses on the global batch; two launchers' variables that place the
//! process differently are refused in one line; and `ortbench run` inside an sbatch step is not
//! confused by the step's variables. How each launcher's variables are read: `launch_env`'s
//! unit tests (`cargo test --release -p ortbench --lib launch_env`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

/// A shell command for a launcher to start on every rank: the worker, its stdout to
/// `<prefix>.<rank>` by the launcher's own rank variable (so ranks' lines never interleave).
fn worker_to_file(spec: &serde_json::Value, prefix: &Path, rank_var: &str) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!("exec \"$0\" worker --spec \"$1\" > \"$2.${rank_var}\""),
        env!("CARGO_BIN_EXE_ortbench").into(),
        spec.to_string(),
        prefix.to_str().unwrap().into(),
    ]
}

/// Each rank's output file holds its own steps, with `want`'s losses, and a summary.
fn assert_ranks_reproduce(prefix: &Path, want: &[f64], launcher: &str) {
    assert_eq!(want.len(), 3);
    for r in 0..2 {
        let path = PathBuf::from(format!("{}.{r}", prefix.display()));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{launcher} rank {r}: {}: {e}", path.display()));
        let events: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let steps: Vec<&serde_json::Value> =
            events.iter().filter(|e| e["event"] == "step").collect();
        assert!(steps.iter().all(|e| e["rank"] == r), "{launcher}: rank {r} reports as itself");
        assert!(events.iter().any(|e| e["event"] == "summary"), "{launcher} rank {r}: {text}");
        let got: Vec<f64> = steps.iter().map(|e| e["loss"].as_f64().unwrap()).collect();
        assert_eq!(got.len(), want.len(), "{launcher} rank {r}: {text}");
        for (s, (x, y)) in want.iter().zip(&got).enumerate() {
            let rel = ((x - y) / x).abs();
            assert!(rel <= 1e-5, "{launcher} rank {r} step {s}: loss {y} vs one rank {x}");
        }
    }
}

fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A launcher command with no launcher variables of this test process's own, ended after two
/// minutes (rank 0 would otherwise wait its 5-minute join timeout for a rank that never comes).
fn launcher(program: &str) -> Command {
    let mut c = Command::new("timeout");
    c.args(["120", program]);
    for v in ortbench::launch_env::LAUNCH_VARS {
        c.env_remove(v);
    }
    c.env_remove("ORTBENCH_FAULT");
    c
}

#[test]
#[ignore = "needs Open MPI's mpirun (apt-get install openmpi-bin); scripts/test installs it (scripts/setup-mpi) and runs this"]
fn two_ranks_under_mpirun_reproduce_one_rank() {
    let found = Command::new("sh").args(["-c", "command -v mpirun"]).output().unwrap();
    assert!(
        found.status.success(),
        "mpirun not found: install Open MPI (scripts/setup-mpi: apt-get install openmpi-bin)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (want, spec) = one_rank_reference(dir.path());
    let prefix = dir.path().join("mpirun.out");
    // As a cluster would run it, on loopback: MASTER_ADDR/MASTER_PORT exported to every rank
    // (-x), root allowed (CI runs as root), more ranks than cores allowed.
    let o = launcher("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .args(["-x", "MASTER_ADDR=127.0.0.1", "-x", &format!("MASTER_PORT={}", free_port())])
        .args(worker_to_file(&spec, &prefix, "OMPI_COMM_WORLD_RANK"))
        .output()
        .unwrap();
    assert!(o.status.success(), "mpirun: {}", text(&o));
    assert_ranks_reproduce(&prefix, &want, "mpirun");

    // Without MASTER_ADDR every rank says what mpirun must pass, as torch does, and exits.
    let bare = dir.path().join("bare.out");
    let o = launcher("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .args(worker_to_file(&spec, &bare, "OMPI_COMM_WORLD_RANK"))
        .output()
        .unwrap();
    assert!(!o.status.success(), "mpirun without MASTER_ADDR: {}", text(&o));
    for r in 0..2 {
        let out = std::fs::read_to_string(format!("{}.{r}", bare.display())).unwrap();
        assert!(
            out.contains("MASTER_ADDR is not set") && out.contains("mpirun -x MASTER_ADDR"),
            "rank {r}: {out}"
        );
    }
}

#[test]
fn two_ranks_with_the_variables_srun_sets_reproduce_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let (want, spec) = one_rank_reference(dir.path());
    let prefix = dir.path().join("srun.out");
    // No MASTER_ADDR: rank 0's host is SLURM_JOB_NODELIST's first (localhost). The port is
    // given, as a test that runs beside others cannot take the fixed default.
    let fake_srun = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake-srun");
    let o = launcher("bash")
        .args([fake_srun, "-n", "2"])
        .args(worker_to_file(&spec, &prefix, "SLURM_PROCID"))
        .env("MASTER_PORT", free_port())
        .output()
        .unwrap();
    assert!(o.status.success(), "fake srun: {}", text(&o));
    assert_ranks_reproduce(&prefix, &want, "srun");
}

#[test]
fn launchers_that_place_the_rank_differently_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let (_, spec) = one_rank_reference(dir.path());
    // A wrapper under `srun -n 2` that exported RANK=1 to task 0. (Were it not refused, it
    // would wait for a rank 0 that never comes: ended after a minute.)
    let port = free_port();
    let o = Command::new("timeout")
        .args(["60", env!("CARGO_BIN_EXE_ortbench"), "worker", "--spec", &spec.to_string()])
        .envs([
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "0"),
            ("SLURM_TASKS_PER_NODE", "2"),
            ("SLURM_JOB_NODELIST", "localhost"),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "one error event: {out}");
    let e: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    let msg = e["message"].as_str().unwrap();
    assert!(!msg.contains('\n'), "one line: {msg}");
    println!("{msg}");
    assert!(
        msg.starts_with("launch variables disagree: RANK=1 WORLD_SIZE=2 (torchrun) but SLURM_PROCID=0 SLURM_NTASKS=2"),
        "{msg}"
    );
}

#[test]
fn a_run_inside_an_sbatch_step_keeps_the_steps_variables_from_its_workers() {
    // `ortbench run` in an sbatch script of 8 tasks: the batch step is task 0 of 8. The run's
    // one worker is the harness's, not the step's 8th of a world of 8.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut args = vec!["run", "--models", "tiny-gpt2", "--configs", "ort", "--out"];
    args.push(out.to_str().unwrap());
    args.extend(QUICK);
    let o = ortbench(
        &args,
        &[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "0"),
            ("SLURM_TASKS_PER_NODE", "8"),
            ("SLURM_JOB_NODELIST", "node[01-02]"),
        ],
        false,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(cell(&h, &rows, "ort", "status"), "ok", "{}", cell(&h, &rows, "ort", "error"));
}
