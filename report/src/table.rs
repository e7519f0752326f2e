//! The summary table: printed by `run` (comfy-table) and shown in index.html, from the same
//! cells.

use comfy_table::{presets, Cell, Color, ContentArrangement, Table};

use crate::output::ResultRow;

pub const SUMMARY_HEADER: [&str; 16] = [
    "model",
    "config",
    "prec",
    "ranks",
    "runs",
    "step ms median (p90)",
    "compile s",
    "samples/s",
    "speedup [95% CI]",
    "vs torch-compile [95% CI]",
    "MFU / HFU",
    "peak MiB",
    "optim MiB/rank",
    "max batch: samples/s (peak MiB)",
    "parity Δloss / Δgnorm₀",
    "status",
];

pub fn f(v: Option<f64>, decimals: usize) -> String {
    v.filter(|x| x.is_finite()).map_or("-".to_string(), |x| format!("{x:.decimals$}"))
}

pub fn mib(bytes: Option<u64>, decimals: usize) -> String {
    bytes.map_or("-".to_string(), |b| format!("{:.decimals$}", b as f64 / (1u64 << 20) as f64))
}

/// A relative difference as "1.2e-7", "0" for exactly equal, "-" for none.
pub fn rel(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(0.0) => "0".into(),
        Some(x) => format!("{x:.1e}"),
    }
}

/// Rows in plan order, grouped by model (first appearance).
pub fn ordered(results: &[ResultRow]) -> Vec<&ResultRow> {
    let mut models: Vec<&str> = Vec::new();
    for r in results {
        if !models.contains(&r.model.as_str()) {
            models.push(&r.model);
        }
    }
    models.iter().flat_map(|m| results.iter().filter(move |r| r.model == *m)).collect()
}

/// "1.59× [1.52–1.66]", with " n.s." when the interval contains 1.0; "1.59× n<3" when the
/// row's runs were too few for an interval (bench's `metrics::MIN_INTERVAL_RUNS`).
pub fn speedup_cell(r: &ResultRow) -> String {
    let s = ratio_cell(
        r.speedup,
        r.speedup_lo,
        r.speedup_hi,
        r.speedup_significant.filter(|_| r.config != "pytorch"),
    );
    few_runs(s, r, r.speedup_lo)
}

/// Marks a ratio shown without an interval because the row had fewer than 3 runs.
fn few_runs(s: String, r: &ResultRow, lo: Option<f64>) -> String {
    if s != "-" && lo.is_none() && r.config != "pytorch" && r.repeats < 3 {
        format!("{s} n<3")
    } else {
        s
    }
}

/// The engine's speedup over `torch-compile`, as [`speedup_cell`] writes it.
pub fn speedup_vs_torch_compile_cell(r: &ResultRow) -> String {
    let s = ratio_cell(
        r.speedup_vs_torch_compile,
        r.speedup_vs_torch_compile_lo,
        r.speedup_vs_torch_compile_hi,
        r.speedup_vs_torch_compile_significant,
    );
    few_runs(s, r, r.speedup_vs_torch_compile_lo)
}

fn ratio_cell(
    x: Option<f64>,
    lo: Option<f64>,
    hi: Option<f64>,
    significant: Option<bool>,
) -> String {
    let Some(x) = x.filter(|x| x.is_finite()) else { return "-".into() };
    let mut s = format!("{x:.2}×");
    if let (Some(lo), Some(hi)) = (lo, hi) {
        s.push_str(&format!(" [{lo:.2}–{hi:.2}]"));
    }
    if significant == Some(false) {
        s.push_str(" n.s.");
    }
    s
}

/// `--batch-size auto`: "48: 61.20 (7712)" — the largest batch within the budget, the
/// throughput and measured peak of its run; "none fits" when not even batch 1 did, "search
/// stopped" when a probe failed for another reason than memory (`max_batch_search` says
/// which); "-" without auto.
pub fn max_batch_cell(r: &ResultRow) -> String {
    match (r.max_batch_size, r.memory_budget_bytes) {
        (Some(b), _) => format!(
            "{b}: {} ({})",
            f(r.max_batch_samples_per_s, 2),
            mib(r.max_batch_peak_mem_bytes, 0)
        ),
        (None, Some(_)) if r.max_batch_search.contains("stopped:") => "search stopped".into(),
        (None, Some(_)) => "none fits".into(),
        (None, None) => "-".into(),
    }
}

/// The cells of one row; the model is named on the first row of its group only.
pub fn summary_cells(r: &ResultRow, show_model: bool) -> Vec<String> {
    let pct = |v: Option<f64>| {
        v.filter(|x| x.is_finite()).map_or("-".to_string(), |x| format!("{:.1}%", x * 100.0))
    };
    vec![
        if show_model { r.model.clone() } else { String::new() },
        r.config.clone(),
        r.precision.clone(),
        r.ranks.to_string(),
        r.repeats.to_string(),
        format!("{} ({})", f(r.step_ms_median, 1), f(r.step_ms_p90, 1)),
        f(r.compile_s, 1),
        f(r.samples_per_s, 2),
        speedup_cell(r),
        speedup_vs_torch_compile_cell(r),
        format!("{} / {}", pct(r.mfu), pct(r.hfu)),
        mib(r.peak_mem_bytes, 0),
        mib(r.optimizer_bytes_per_rank.map(|b| b as u64), 1),
        max_batch_cell(r),
        match (r.max_loss_rel_diff, r.grad_norm_rel_diff_step0) {
            (None, None) => "-".into(),
            (l, g) => format!("{} / {}", rel(l), rel(g)),
        },
        r.status.clone(),
    ]
}

/// All rows' cells, in display order.
pub fn summary_rows(results: &[ResultRow]) -> Vec<(Vec<String>, &ResultRow)> {
    let mut last = None;
    ordered(results)
        .into_iter()
        .map(|r| {
            let show = last != Some(r.model.as_str());
            last = Some(r.model.as_str());
            (summary_cells(r, show), r)
        })
        .collect()
}

/// The terminal's column headers: [`SUMMARY_HEADER`] with line breaks, so that a default run's
/// table fits 160 characters.
const TERMINAL_HEADER: [&str; 16] = [
    "model",
    "config",
    "prec",
    "ranks",
    "runs",
    "step ms\nmedian (p90)",
    "compile s",
    "samples/s",
    "speedup\n[95% CI]",
    "vs torch-compile\n[95% CI]",
    "MFU /\nHFU",
    "peak MiB",
    "optim\nMiB/rank",
    "max batch: samples/s\n(peak MiB)",
    "parity Δloss\n/ Δgnorm₀",
    "status",
];

/// The columns the terminal table shows: a column no row fills (every cell "-" or empty: no
/// torch-compile config, no `--batch-size auto`) is left out, and so are precision, ranks and
/// runs when every row has the same (the run's header line says them). results.csv, the HTML
/// report and the notebooks keep every column.
pub fn shown_columns(rows: &[Vec<String>]) -> Vec<usize> {
    let same = |i: usize| rows.iter().all(|r| r[i] == rows[0][i]);
    (0..SUMMARY_HEADER.len())
        .filter(|&i| {
            let name = SUMMARY_HEADER[i];
            if ["model", "config", "status"].contains(&name) || rows.is_empty() {
                return true;
            }
            let filled = rows.iter().any(|r| !(r[i] == "-" || r[i].is_empty()));
            filled && !(["prec", "ranks", "runs"].contains(&name) && same(i))
        })
        .collect()
}

/// The terminal table (colours only when stdout is a terminal), of the columns
/// [`shown_columns`] keeps.
pub fn summary_table(results: &[ResultRow]) -> Table {
    let rows = summary_rows(results);
    let cells: Vec<Vec<String>> = rows.iter().map(|(c, _)| c.clone()).collect();
    let cols = shown_columns(&cells);
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(cols.iter().map(|&i| TERMINAL_HEADER[i]));
    for (cells, r) in rows {
        t.add_row(cols.iter().map(|&i| {
            let cell = Cell::new(&cells[i]);
            if SUMMARY_HEADER[i] == "status" {
                cell.fg(if r.status == "ok" { Color::Green } else { Color::Red })
            } else {
                cell
            }
        }));
    }
    // Numbers right-aligned: every column after config and precision, but the status.
    for (k, &i) in cols.iter().enumerate() {
        if (3..SUMMARY_HEADER.len() - 1).contains(&i) {
            if let Some(c) = t.column_mut(k) {
                c.set_cell_alignment(comfy_table::CellAlignment::Right);
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A default `--models bert,gpt2` run's rows (configs pytorch, ort, ort-zero1; fp32; one
    /// rank; three runs), with the widest values such a run prints: five-digit peaks, an
    /// interval marked n.s., both parity differences.
    fn default_run() -> Vec<ResultRow> {
        let mut rows = Vec::new();
        for model in ["bert-base-uncased", "gpt2"] {
            for (config, speedup) in [("pytorch", 1.0), ("ort", 1.62), ("ort-zero1", 0.99)] {
                let base = config == "pytorch";
                rows.push(ResultRow {
                    model: model.into(),
                    config: config.into(),
                    precision: "fp32".into(),
                    ranks: 1,
                    repeats: 3,
                    status: if config == "ort-zero1" { "diverged" } else { "ok" }.into(),
                    step_ms_median: Some(12345.6),
                    step_ms_p90: Some(13456.7),
                    samples_per_s: Some(1234.56),
                    speedup: Some(speedup),
                    speedup_lo: Some(speedup - 0.11),
                    speedup_hi: Some(speedup + 0.12),
                    speedup_significant: Some(config == "ort"),
                    mfu: Some(0.123),
                    hfu: Some(0.456),
                    peak_mem_bytes: Some(12345 << 20),
                    optimizer_bytes_per_rank: Some(1234 << 20),
                    max_loss_rel_diff: (!base).then_some(2.5e-5),
                    grad_norm_rel_diff_step0: (!base).then_some(3.1e-4),
                    ..Default::default()
                });
            }
        }
        rows
    }

    #[test]
    fn a_default_runs_table_fits_160_characters_without_its_empty_columns() {
        let rows = default_run();
        let text = summary_table(&rows).to_string();
        println!("{text}");
        let widest = text.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(widest <= 160, "{widest} characters wide:\n{text}");
        // Left out: columns no row fills, and prec/ranks/runs, the same on every row.
        for gone in ["compile s", "torch-compile", "max batch", "prec", "ranks", "runs"] {
            assert!(!text.contains(gone), "{gone} shown:\n{text}");
        }
        for kept in ["speedup", "1.62× [1.51–1.74]", "0.99× [0.88–1.11] n.s.", "2.5e-5", "diverged"]
        {
            assert!(text.contains(kept), "{kept} missing:\n{text}");
        }
        // A column some row fills stays: one bf16 row brings the precision back.
        let mut mixed = rows.clone();
        mixed[1].precision = "bf16".into();
        assert!(summary_table(&mixed).to_string().contains("prec"));
    }

    #[test]
    fn a_ratio_from_fewer_than_three_runs_says_so_instead_of_an_interval() {
        let r = ResultRow {
            config: "ort".into(),
            repeats: 2,
            speedup: Some(1.5),
            ..Default::default()
        };
        assert_eq!(speedup_cell(&r), "1.50× n<3");
        let three = ResultRow { repeats: 3, speedup_lo: Some(1.4), speedup_hi: Some(1.6), ..r };
        assert_eq!(speedup_cell(&three), "1.50× [1.40–1.60]");
    }
}
