//! A hang is a failure: a rank stopped with SIGSTOP mid-run (alive, its sockets open, saying
//! nothing) ends its run within the deadline for every config, with the silent rank named and
//! no process left behind — by the harness's step deadline (`--hang-deadline-s`), or earlier by
//! its peer's collective timeout (`--collective-timeout-s`), whichever is shorter.

mod common;

use std::path::Path;
use std::time::Instant;

use common::*;

const CONFIGS: [&str; 3] = ["pytorch", "ort", "ort-zero1"];

/// results.csv as (header, rows).
type Table = (Vec<String>, Vec<Vec<String>>);

/// A 2-rank tiny-gpt2 run of every config in which rank 1 stops itself before step 2, with
/// `deadlines` (flags); returns its exit code, its stderr and its results.
fn run_with_rank_1_stopped(
    out: &Path,
    seed: &str,
    deadlines: &[&str],
) -> (Option<i32>, String, Table) {
    let configs = CONFIGS.join(",");
    let args = [
        &[
            "run",
            "--models",
            "tiny-gpt2",
            "--configs",
            &configs,
            "--ranks",
            "2",
            "--batch-size",
            "2",
            "--seq-len",
            "16",
            "--steps",
            "6",
            "--warmup",
            "1",
            "--repeat",
            "1",
            "--parity-steps",
            "0",
            "--seed",
            seed,
            "--out",
            out.to_str().unwrap(),
        ][..],
        deadlines,
    ]
    .concat();
    let o = ortbench(
        &args,
        &[("ORTBENCH_FAULT", "stop-at-step:2"), ("ORTBENCH_FAULT_RANK", "1")],
        false,
    );
    (o.status.code(), stderr(&o), read_csv(&out.join("results.csv")))
}

/// The harness's deadline ends the run; the peer's collective timeout is far longer here.
#[test]
fn a_stopped_rank_ends_the_run_at_the_step_deadline_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let seed = "527316490";
    let t0 = Instant::now();
    let (code, err, (h, rows)) = run_with_rank_1_stopped(
        &out,
        seed,
        &["--hang-deadline-s", "3", "--collective-timeout-s", "300"],
    );
    assert_eq!(code, Some(1), "{err}");
    for config in CONFIGS {
        assert_eq!(cell(&h, &rows, config, "status"), "error", "{config}");
        let e = cell(&h, &rows, config, "error");
        assert!(
            e.contains("rank 1 of 2 went silent after step 1")
                && e.contains("--hang-deadline-s 3.0")
                && e.contains("its process was stopped (SIGSTOP)"),
            "{config}: {e}"
        );
        // Within the deadline: long before the collective timeout would have ended it.
        let wall: f64 = cell(&h, &rows, config, "wall_s").parse().unwrap();
        assert!(wall < 300.0, "{config}: the run took {wall} s to end");
        println!("{config}: ended in {wall:.1} s: {e}");
    }
    assert_eq!(workers_with(seed), 0, "worker processes left behind");
    println!("3 configs in {:.1} s", t0.elapsed().as_secs_f64());
}

/// The peer's collective gives up first, naming the silent rank, the collective and the step;
/// the harness then kills the stopped rank.
#[test]
fn a_stopped_rank_fails_its_peers_collective_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let seed = "527316491";
    let (code, err, (h, rows)) = run_with_rank_1_stopped(
        &out,
        seed,
        &["--collective-timeout-s", "2", "--hang-deadline-s", "300"],
    );
    assert_eq!(code, Some(1), "{err}");
    for config in CONFIGS {
        assert_eq!(cell(&h, &rows, config, "status"), "error", "{config}");
        let e = cell(&h, &rows, config, "error");
        assert!(
            e.starts_with("rank 0 of 2: ")
                && (e.contains("pytorch step 2: DDP all-reduce: collective AllReduceSum")
                    || e.contains("engine step 2: collective "))
                && e.contains("rank 1 silent for 2.0 s"),
            "{config}: {e}"
        );
        let wall: f64 = cell(&h, &rows, config, "wall_s").parse().unwrap();
        assert!(wall < 300.0, "{config}: the run took {wall} s to end");
        println!("{config}: ended in {wall:.1} s: {e}");
    }
    assert_eq!(workers_with(seed), 0, "worker processes left behind");
}

/// A deadline that is not a positive number of seconds is refused in one line naming its flag,
/// before anything runs.
#[test]
fn deadline_flags_that_are_not_positive_seconds_are_one_line_errors() {
    for flag in ["--collective-timeout-s", "--hang-deadline-s", "--first-step-deadline-s"] {
        for bad in ["0", "-3", "nan", "inf"] {
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("out");
            // `--flag=-3`: as a separate word, clap would read "-3" as a flag.
            let given = format!("{flag}={bad}");
            let o = ortbench(
                &["run", "--models", "tiny-gpt2", "--out", out.to_str().unwrap(), &given],
                &[],
                false,
            );
            let err = stderr(&o);
            assert!(!o.status.success(), "{flag} {bad} succeeded");
            assert!(err.contains(&format!("{flag} must be a positive number of seconds")), "{err}");
            assert_eq!(err.trim().lines().count(), 1, "{flag} {bad}: not one line: {err}");
            assert!(!out.exists(), "{flag} {bad}: wrote {out:?}");
        }
    }
}
