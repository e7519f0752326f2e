//! `--batch-size auto --memory-budget MiB`: every config's largest batch within the budget,
//! searched on the same grid, its run's measured peak within the budget, beside the
//! fixed-batch comparison; and the flags' refusals.

mod common;

use std::collections::BTreeMap;

use common::{cell, ortbench, read_csv, stderr};
use ortbench::batch_search::{largest_fitting, MAX_BATCH, STOP_SHARE};

const MIB: u64 = 1 << 20;

/// A `max_batch_search` log ("1✓ 2✓ 4✗ 3✓ · run 3✓") as (a run?, batch, fits).
fn parse_log(log: &str) -> Vec<(bool, usize, bool)> {
    let mut out = Vec::new();
    let mut run = false;
    for tok in log.split_whitespace() {
        match tok {
            "·" => {}
            "run" => run = true,
            t => {
                let fits = t.ends_with('✓');
                assert!(fits || t.ends_with('✗'), "bad entry '{t}' in '{log}'");
                let n = t.trim_end_matches(['✓', '✗']).parse().expect("a batch");
                out.push((run, n, fits));
                run = false;
            }
        }
    }
    out
}

/// Replays a config's log against the grid: every batch it tried must be the one
/// `largest_fitting` asks for given the answers so far, and each search must end in a run at
/// the batch found (a run that did not fit rules out that batch and the search goes on below
/// it). Returns the batch the last run confirmed.
fn replay_on_the_grid(log: &str) -> usize {
    let mut entries = parse_log(log).into_iter();
    let mut known: BTreeMap<usize, bool> = BTreeMap::new();
    loop {
        let best = largest_fitting(MAX_BATCH, |b| {
            if let Some(&f) = known.get(&b) {
                return f;
            }
            let (run, batch, fits) = entries.next().expect("the log ends inside a search");
            assert!(!run && batch == b, "'{log}': tried {batch}, the grid asks for {b}");
            known.insert(b, fits);
            fits
        });
        let b = best.unwrap_or_else(|| panic!("'{log}': no batch fits"));
        let (run, batch, fits) = entries.next().expect("a run at the batch found");
        assert!(run && batch == b, "'{log}': the run is at {batch}, the search found {b}");
        if fits {
            assert!(entries.next().is_none(), "'{log}': entries after the confirmed run");
            return b;
        }
        for (_, f) in known.range_mut(b..) {
            *f = false;
        }
        known.insert(b, false);
    }
}

#[test]
fn every_configs_largest_batch_fits_the_budget_and_the_engines_is_at_least_pytorchs() {
    let dir = tempfile::tempdir().unwrap();
    let shape = ["--steps", "3", "--warmup", "1", "--seq-len", "64", "--repeat", "1"];
    let no_probe = ["--parity-steps", "0", "--dropout", "0"];
    // The budget: what a pytorch worker holds at batch 1 (libtorch and the process, which
    // differ between machines) plus 100 MiB for the batch to grow into.
    let base = dir.path().join("base");
    let o = ortbench(
        &[
            &["run", "--models", "tiny-gpt2", "--configs", "pytorch", "--batch-size", "1"][..],
            &shape,
            &no_probe,
            &["--out", base.to_str().unwrap()],
        ]
        .concat(),
        &[],
        false,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (h, rows) = read_csv(&base.join("results.csv"));
    let peak1: u64 = cell(&h, &rows, "pytorch", "peak_mem_bytes").parse().unwrap();
    let budget_mib = peak1 / MIB + 100;
    let budget = budget_mib * MIB;

    let out = dir.path().join("auto");
    let budget_arg = budget_mib.to_string();
    let o = ortbench(
        &[
            &["run", "--models", "tiny-gpt2", "--configs", "pytorch,ort"][..],
            &shape,
            &no_probe,
            &["--batch-size", "auto", "--memory-budget", &budget_arg],
            &["--out", out.to_str().unwrap()],
        ]
        .concat(),
        &[],
        false,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (h, rows) = read_csv(&out.join("results.csv"));
    assert_eq!(rows.len(), 2, "one row per config");
    let mut largest = BTreeMap::new();
    for config in ["pytorch", "ort"] {
        let c = |name: &str| cell(&h, &rows, config, name).to_string();
        // The fixed-batch comparison ran at the default batch and is complete.
        assert_eq!(c("status"), "ok");
        assert_eq!(c("batch_size"), "8");
        assert!(c("samples_per_s").parse::<f64>().unwrap() > 0.0);
        assert_eq!(c("memory_budget_bytes").parse::<u64>().unwrap(), budget);
        let b: usize = c("max_batch_size").parse().unwrap_or_else(|_| panic!("{config}: no batch"));
        let peak: u64 = c("max_batch_peak_mem_bytes").parse().unwrap();
        assert!(peak <= budget, "{config}: peak {peak} at batch {b} over the budget {budget}");
        assert!(
            (peak as f64) < budget as f64 * STOP_SHARE,
            "{config}: peak {peak} past the stop line"
        );
        assert!(c("max_batch_samples_per_s").parse::<f64>().unwrap() > 0.0);
        assert_eq!(
            c("max_batch_tokens_per_s").parse::<f64>().unwrap(),
            c("max_batch_samples_per_s").parse::<f64>().unwrap() * 64.0
        );
        // The budget binds: the search stopped below its cap.
        assert!(b > 1 && b < MAX_BATCH, "{config}: batch {b}");
        assert_eq!(replay_on_the_grid(&c("max_batch_search")), b, "{config}");
        largest.insert(config, b);
    }
    assert!(
        largest["ort"] >= largest["pytorch"],
        "the engine's largest batch {} < pytorch's {}",
        largest["ort"],
        largest["pytorch"]
    );

    // The runs at the largest batch: their steps are kept apart from the timed ones.
    let (sh, steps) = read_csv(&out.join("steps.csv"));
    let (phase, config) = (common::col(&sh, "phase"), common::col(&sh, "config"));
    for c in ["pytorch", "ort"] {
        let n = steps.iter().filter(|s| s[phase] == "max-batch" && s[config] == c).count();
        assert_eq!(n, 3, "{c}: its run at the largest batch has 3 steps");
    }
    // run.json: every batch tried, with its bytes, ending in the run that confirmed it.
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    let configs = run["batch_search"]["configs"].as_array().unwrap();
    assert_eq!(configs.len(), 2);
    for c in configs {
        let trials = c["outcome"]["trials"].as_array().unwrap();
        let last = trials.last().unwrap();
        assert_eq!((last["by"].as_str(), last["fits"].as_bool()), (Some("run"), Some(true)));
        assert_eq!(last["batch"].as_u64(), Some(largest[c["config"].as_str().unwrap()] as u64));
        // The engine's batches beyond 1 come from its plan, pytorch's from probes.
        let by: Vec<&str> = trials.iter().filter_map(|t| t["by"].as_str()).collect();
        if c["config"] == "ort" {
            assert!(by.contains(&"plan") && by.iter().filter(|b| **b == "probe").count() == 1);
        } else {
            assert!(!by.contains(&"plan"));
        }
    }
    // The summary table shows each config's largest batch.
    let table = String::from_utf8_lossy(&o.stdout);
    // (The terminal's header cell breaks over two lines: "max batch: samples/s" / "(peak MiB)".)
    assert!(table.contains("max batch: samples/s") && table.contains("(peak MiB)"), "{table}");
    assert!(table.contains(&format!("{}: ", largest["ort"])), "{table}");
}

#[test]
fn batch_size_and_memory_budget_refuse_bad_values_in_one_line() {
    let tiny = ["run", "--models", "tiny-gpt2", "--configs", "pytorch"];
    for (args, message) in [
        (
            &["--batch-size", "foo"][..],
            "--batch-size must be a positive integer or auto, got 'foo'",
        ),
        (&["--batch-size", "0"], "--batch-size must be a positive integer"),
        (
            &["--batch-size", "auto", "--memory-budget", "0"],
            "--memory-budget must be a positive number",
        ),
        (
            &["--batch-size", "auto", "--memory-budget=-3"],
            "--memory-budget must be a positive number",
        ),
        (&["--memory-budget", "100"], "--memory-budget 100 applies to --batch-size auto only"),
        (&["--batch-size", "8", "--memory-budget", "100"], "applies to --batch-size auto only"),
        (&["--batch-size", "auto", "--memory-budget", "1000000000"], "available on this machine"),
    ] {
        let o = ortbench(&[&tiny[..], args].concat(), &[], false);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err}");
    }
}
