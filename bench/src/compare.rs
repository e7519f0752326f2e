//! `ortbench compare A B`: the change from run A to run B per (model, config, precision,
//! ranks): throughput ratio, peak memory, loss parity and status. A regression is B slower
//! or larger by more than the threshold, a run that was ok and is not, or parity that was
//! within tolerance and is not.

use anyhow::Result;
use comfy_table::{presets, Cell, Color, ContentArrangement, Table};

use crate::cli::CompareArgs;
use crate::output::ResultRow;
use crate::report::table::{f, mib, rel};
use crate::results::load_run;

type Key = (String, String, String, usize);

fn key(r: &ResultRow) -> Key {
    (r.model.clone(), r.config.clone(), r.precision.clone(), r.ranks)
}

/// One compared (model, config, precision, ranks).
pub struct Change {
    pub key: Key,
    pub a: Option<ResultRow>,
    pub b: Option<ResultRow>,
    pub throughput_ratio: Option<f64>,
    pub memory_ratio: Option<f64>,
    /// Why this is a regression; empty when it is not.
    pub regressions: Vec<String>,
}

pub fn changes(a: &[ResultRow], b: &[ResultRow], threshold: f64) -> Vec<Change> {
    let mut keys: Vec<Key> = a.iter().map(key).collect();
    for r in b {
        if !keys.contains(&key(r)) {
            keys.push(key(r));
        }
    }
    keys.into_iter()
        .map(|k| {
            let ra = a.iter().find(|r| key(r) == k).cloned();
            let rb = b.iter().find(|r| key(r) == k).cloned();
            let ratio = |fa: Option<f64>, fb: Option<f64>| match (fa, fb) {
                (Some(x), Some(y)) if x > 0.0 => Some(y / x),
                _ => None,
            };
            let tr = ratio(
                ra.as_ref().and_then(|r| r.samples_per_s),
                rb.as_ref().and_then(|r| r.samples_per_s),
            );
            let mr = ratio(
                ra.as_ref().and_then(|r| r.peak_mem_bytes.map(|v| v as f64)),
                rb.as_ref().and_then(|r| r.peak_mem_bytes.map(|v| v as f64)),
            );
            let mut why = Vec::new();
            if let (Some(x), Some(y)) = (&ra, &rb) {
                if tr.is_some_and(|t| t < 1.0 - threshold) {
                    why.push(format!("samples/s ×{:.3}", tr.unwrap_or(0.0)));
                }
                if mr.is_some_and(|m| m > 1.0 + threshold) {
                    why.push(format!("peak memory ×{:.3}", mr.unwrap_or(0.0)));
                }
                if x.status == "ok" && y.status != "ok" {
                    why.push(format!("status {} → {}", x.status, y.status));
                }
            }
            if ra.is_some() && rb.is_none() {
                why.push("missing in B".into());
            }
            Change {
                key: k,
                a: ra,
                b: rb,
                throughput_ratio: tr,
                memory_ratio: mr,
                regressions: why,
            }
        })
        .collect()
}

/// Prints the comparison; returns the exit code.
pub fn run(args: &CompareArgs) -> Result<i32> {
    if !args.threshold.is_finite() || args.threshold < 0.0 {
        anyhow::bail!("--threshold must be a finite non-negative number, got {}", args.threshold);
    }
    let a = load_run(&args.a)?.result_rows()?;
    let b = load_run(&args.b)?.result_rows()?;
    let list = changes(&a, &b, args.threshold);
    println!("A: {}\nB: {}", args.a.display(), args.b.display());
    println!("{}", table(&list));
    let n = list.iter().filter(|c| !c.regressions.is_empty()).count();
    if n == 0 {
        println!("no regressions (threshold {:.0}%)", args.threshold * 100.0);
    } else {
        println!("{n} regression(s) (threshold {:.0}%)", args.threshold * 100.0);
    }
    Ok(if n > 0 && args.fail_on_regression { 1 } else { 0 })
}

fn table(list: &[Change]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(vec![
            "model".to_string(),
            "config".into(),
            "prec".into(),
            "ranks".into(),
            "samples/s A → B".into(),
            "ratio".into(),
            "peak MiB A → B".into(),
            "loss rel. diff A → B".into(),
            "status A → B".into(),
            "verdict".into(),
        ]);
    for c in list {
        let (ra, rb) = (c.a.as_ref(), c.b.as_ref());
        let get = |r: Option<&ResultRow>, g: fn(&ResultRow) -> String| r.map_or("-".to_string(), g);
        let bad = !c.regressions.is_empty();
        let verdict = if bad {
            Cell::new(format!("REGRESSION: {}", c.regressions.join(", "))).fg(Color::Red)
        } else if c.throughput_ratio.is_some_and(|r| r > 1.0) {
            Cell::new("faster").fg(Color::Green)
        } else {
            Cell::new("ok")
        };
        let ratio = Cell::new(c.throughput_ratio.map_or("-".into(), |r| format!("{r:.3}×")));
        t.add_row(vec![
            Cell::new(&c.key.0),
            Cell::new(&c.key.1),
            Cell::new(&c.key.2),
            Cell::new(c.key.3),
            Cell::new(format!(
                "{} → {}",
                get(ra, |r| f(r.samples_per_s, 2)),
                get(rb, |r| f(r.samples_per_s, 2))
            )),
            if c.throughput_ratio.is_some_and(|r| r < 1.0) && bad {
                ratio.fg(Color::Red)
            } else {
                ratio
            },
            Cell::new(format!(
                "{} → {}",
                get(ra, |r| mib(r.peak_mem_bytes, 0)),
                get(rb, |r| mib(r.peak_mem_bytes, 0))
            )),
            Cell::new(format!(
                "{} → {}",
                get(ra, |r| rel(r.max_loss_rel_diff)),
                get(rb, |r| rel(r.max_loss_rel_diff))
            )),
            Cell::new(format!(
                "{} → {}",
                get(ra, |r| r.status.clone()),
                get(rb, |r| r.status.clone())
            )),
            verdict,
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(config: &str, sps: f64, mem: u64, status: &str) -> ResultRow {
        ResultRow {
            model: "m".into(),
            config: config.into(),
            precision: "fp32".into(),
            ranks: 1,
            status: status.into(),
            samples_per_s: Some(sps),
            peak_mem_bytes: Some(mem),
            ..Default::default()
        }
    }

    #[test]
    fn regressions_are_found() {
        let a = vec![
            row("pytorch", 10.0, 100, "ok"),
            row("ort", 20.0, 100, "ok"),
            row("ort-zero1", 20.0, 100, "ok"),
        ];
        let b = vec![
            row("pytorch", 10.2, 100, "ok"),
            row("ort", 17.0, 120, "ok"),
            row("ort-zero1", 20.0, 100, "error"),
        ];
        let c = changes(&a, &b, 0.05);
        assert!(c[0].regressions.is_empty());
        assert_eq!(c[1].regressions.len(), 2, "{:?}", c[1].regressions);
        assert!(c[2].regressions[0].contains("status ok → error"));
        assert!((c[1].throughput_ratio.unwrap() - 0.85).abs() < 1e-12);
    }
}
