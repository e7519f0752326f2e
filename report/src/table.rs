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

/// "1.59× [1.52–1.66]", with " n.s." when the interval contains 1.0.
pub fn speedup_cell(r: &ResultRow) -> String {
    ratio_cell(
        r.speedup,
        r.speedup_lo,
        r.speedup_hi,
        r.speedup_significant.filter(|_| r.config != "pytorch"),
    )
}

/// The engine's speedup over `torch-compile`, as [`speedup_cell`] writes it.
pub fn speedup_vs_torch_compile_cell(r: &ResultRow) -> String {
    ratio_cell(
        r.speedup_vs_torch_compile,
        r.speedup_vs_torch_compile_lo,
        r.speedup_vs_torch_compile_hi,
        r.speedup_vs_torch_compile_significant,
    )
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

/// The terminal table (colours only when stdout is a terminal).
pub fn summary_table(results: &[ResultRow]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(SUMMARY_HEADER);
    for (cells, r) in summary_rows(results) {
        let n = cells.len();
        t.add_row(cells.into_iter().enumerate().map(|(i, c)| {
            let cell = Cell::new(c);
            if i + 1 == n {
                cell.fg(if r.status == "ok" { Color::Green } else { Color::Red })
            } else {
                cell
            }
        }));
    }
    for i in 3..SUMMARY_HEADER.len() - 1 {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
    t
}
