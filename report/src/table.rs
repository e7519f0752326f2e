//! The summary table: printed by `run` (comfy-table) and shown in index.html, from the same
//! cells.

use comfy_table::{presets, Cell, Color, ContentArrangement, Table};

use crate::output::ResultRow;

pub const SUMMARY_HEADER: [&str; 12] = [
    "model",
    "config",
    "prec",
    "ranks",
    "samples/s",
    "speedup",
    "step ms med / p90",
    "TFLOP/s (MFU)",
    "peak MiB",
    "optim MiB/rank",
    "loss rel. diff",
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
        Some(x) if x == 0.0 => "0".into(),
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

/// The cells of one row; the model is named on the first row of its group only.
pub fn summary_cells(r: &ResultRow, show_model: bool) -> Vec<String> {
    vec![
        if show_model { r.model.clone() } else { String::new() },
        r.config.clone(),
        r.precision.clone(),
        r.ranks.to_string(),
        f(r.samples_per_s, 2),
        r.speedup.map_or("-".into(), |s| format!("{s:.2}×")),
        format!("{} / {}", f(r.step_ms_median, 1), f(r.step_ms_p90, 1)),
        match (r.tflops, r.mfu) {
            (Some(t), Some(m)) => format!("{t:.3} ({:.1}%)", m * 100.0),
            (Some(t), None) => format!("{t:.3}"),
            _ => "-".into(),
        },
        mib(r.peak_mem_bytes, 0),
        mib(r.optimizer_bytes_per_rank.map(|b| b as u64), 1),
        rel(r.max_loss_rel_diff),
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
    t.load_preset(presets::UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Dynamic).set_header(SUMMARY_HEADER);
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
