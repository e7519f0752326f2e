//! Ranks as processes: `ortbench run --ranks N` starts one worker per rank, joined over TCP
//! with torchrun's variables. N processes on the global batch reproduce one rank for all three
//! configs; a worker started by hand with the launcher variables joins; a rank that is killed
//! ends the run within seconds, named, with no process left behind.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn run(out: &Path, ranks: usize, global: usize, extra: &[&str]) {
    let (r, b) = (ranks.to_string(), (global / ranks).to_string());
    let mut args: Vec<&str> = vec![
        "run",
        "--models",
        "tiny-gpt2",
        "--configs",
        "pytorch,ort,ort-zero1",
        "--ranks",
        &r,
        "--batch-size",
        &b,
        "--seq-len",
        "16",
        "--steps",
        "3",
        "--warmup",
        "1",
    ];
    args.extend([
        "--dropout",
        "0",
        "--repeat",
        "1",
        "--parity-steps",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    args.extend(extra);
    let o = ortbench(&args, &[], false);
    assert!(o.status.success(), "{ranks} ranks: {}", stderr(&o));
}

#[test]
fn two_and_four_processes_reproduce_one_rank_on_the_global_batch() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one");
    run(&one, 1, 4, &[]);
    for ranks in [2, 4] {
        let out = dir.path().join(format!("p{ranks}"));
        run(&out, ranks, 4, &[]);
        let (h, rows) = read_csv(&out.join("steps.csv"));
        // Every rank process reported its steps.
        assert_eq!(rows.len(), 3 * 3 * ranks, "configs × steps × ranks");
        assert!(rows.iter().any(|r| r[col(&h, "rank")] == (ranks - 1).to_string()));
        for config in ["pytorch", "ort", "ort-zero1"] {
            let (a, b) = (losses(&one, config), losses(&out, config));
            assert_eq!(a.len(), 3);
            for (s, (x, y)) in a.iter().zip(&b).enumerate() {
                let rel = ((x - y) / x).abs();
                assert!(rel <= 1e-5, "{config} on {ranks} processes, step {s}: loss {y} vs one rank {x} (rel {rel:e})");
            }
        }
        let (h, rows) = read_csv(&out.join("results.csv"));
        for r in &rows {
            assert_eq!(r[col(&h, "status")], "ok", "{r:?}");
            assert!(r[col(&h, "peak_mem_bytes")].parse::<f64>().unwrap() > 0.0);
        }
    }
}

#[test]
fn threads_still_run_ranks_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (p, t) = (dir.path().join("p"), dir.path().join("t"));
    run(&p, 2, 4, &[]);
    run(&t, 2, 4, &["--launch", "threads"]);
    for config in ["pytorch", "ort", "ort-zero1"] {
        assert_eq!(
            losses(&p, config),
            losses(&t, config),
            "{config}: the same collectives, bit for bit"
        );
    }
}

#[test]
fn workers_started_by_hand_with_launcher_variables_join() {
    let dir = tempfile::tempdir().unwrap();
    // The same run as two ranks of 2 rows, started the way torchrun starts a script.
    let (want, spec) = one_rank_reference(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let children: Vec<_> = (0..2)
        .map(|r| {
            ortbench_cmd()
                .args(["worker", "--spec", &spec.to_string()])
                .envs([
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", "2".into()),
                    ("LOCAL_RANK", r.to_string()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.to_string()),
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", stderr(o));
        let events: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let got: Vec<f64> = events
            .iter()
            .filter(|e| e["event"] == "step")
            .map(|e| e["loss"].as_f64().unwrap())
            .collect();
        assert!(
            events.iter().all(|e| e["event"] != "step" || e["rank"] == r),
            "rank {r} reports as itself"
        );
        assert!(events.iter().any(|e| e["event"] == "summary"), "rank {r}: no summary");
        for (s, (x, y)) in want.iter().zip(&got).enumerate() {
            assert!(((x - y) / x).abs() <= 1e-5, "rank {r} step {s}: {y} vs one rank {x}");
        }
    }
}

#[test]
fn a_killed_rank_ends_the_run_quickly_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let seed = "918273645";
    for config in ["ort", "pytorch"] {
        let t0 = Instant::now();
        let o = ortbench(
            &[
                "run",
                "--models",
                "tiny-gpt2",
                "--configs",
                config,
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
                "--force",
            ],
            &[("ORTBENCH_FAULT", "sigkill-at-step:2"), ("ORTBENCH_FAULT_RANK", "1")],
            false,
        );
        let took = t0.elapsed();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(took < Duration::from_secs(30), "{config}: the run took {took:?} to end");
        let (h, rows) = read_csv(&out.join("results.csv"));
        assert_eq!(cell(&h, &rows, config, "status"), "error");
        let err = cell(&h, &rows, config, "error");
        assert!(err.contains("rank 1 of 2") && err.contains("SIGKILL"), "{config}: {err}");
        assert_eq!(workers_with(seed), 0, "{config}: worker processes left behind");
        println!("{config}: ended in {:.1} s: {err}", took.as_secs_f64());
    }
}

/// The spec of a finished one-rank tiny-gpt2 `ort` run in `dir` (what a launcher would hand a
/// worker).
fn one_rank_spec(dir: &Path) -> serde_json::Value {
    let one = dir.join("one");
    let o = ortbench(
        &[
            "run",
            "--models",
            "tiny-gpt2",
            "--configs",
            "ort",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--repeat",
            "1",
            "--parity-steps",
            "0",
            "--out",
            one.to_str().unwrap(),
        ],
        &[],
        false,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    spec_of(&one)
}

#[test]
fn a_rank_count_that_disagrees_with_world_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = one_rank_spec(dir.path()); // ranks = 1
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let o = Command::new(env!("CARGO_BIN_EXE_ortbench"))
        .args(["worker", "--spec", &spec.to_string()])
        .envs([
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port.to_string()),
        ])
        .output()
        .unwrap();
    // WORLD_SIZE 1 = --ranks 1: a one-rank group is fine.
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let o = Command::new(env!("CARGO_BIN_EXE_ortbench"))
        .args(["worker", "--spec", &spec.to_string()])
        .envs([
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port.to_string()),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("WORLD_SIZE is '2' but the run has --ranks 1"), "{text}");
}

/// GPU ranks (`--device cuda`, ranks > 1): processes, one per GPU, joined by NCCL. Asked as
/// threads, the worker refuses before touching a GPU; as processes on a machine without GPUs
/// (CI), each rank fails to join NCCL with an error naming the rank and the GPU — never a
/// silent run on the CPU or over TCP. (Where GPUs exist the join is scripts/gpu-validate's.)
#[test]
fn gpu_ranks_are_nccl_processes_and_say_why_they_cannot_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = one_rank_spec(dir.path());
    spec["device"] = "cuda".into();
    spec["ranks"] = 2.into();
    for config in ["ort-zero1", "pytorch"] {
        spec["config"] = config.into();
        let o = Command::new(env!("CARGO_BIN_EXE_ortbench"))
            .args(["worker", "--spec", &spec.to_string()])
            .env_remove("RANK")
            .output()
            .unwrap();
        assert!(!o.status.success());
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("GPU ranks are processes, one per GPU"), "{config}: {text}");
    }
    if std::path::Path::new("/dev/nvidia0").exists() {
        println!("a GPU is here: the NCCL join is scripts/gpu-validate's to check");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let workers: Vec<_> = (0..2)
        .map(|r| {
            let r = r.to_string();
            Command::new(env!("CARGO_BIN_EXE_ortbench"))
                .args(["worker", "--spec", &spec.to_string()])
                .envs([
                    ("RANK", r.as_str()),
                    ("LOCAL_RANK", r.as_str()),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", port.as_str()),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (r, w) in workers.into_iter().enumerate() {
        let o = w.wait_with_output().unwrap();
        assert!(!o.status.success());
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains(&format!("rank {r} joining NCCL on GPU {r}")), "rank {r}: {text}");
        println!("rank {r}: {}", text.trim());
    }
}
