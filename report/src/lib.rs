//! `ortbench-report`: a run's tables as Polars DataFrames (Parquet + CSV, [`results::load_run`]),
//! the summary table, the SVG charts and index.html, and the notebook display hooks.
//!
//! Why a crate of its own (it was `ortbench::{output, results, report}`): the `ortbench` crate
//! links libtorch (tch) for the `pytorch` config, and evcxr notebooks compile their `:dep`s in
//! a cargo project of their own. Reading a run directory, drawing its charts and showing its
//! tables needs none of libtorch, so notebooks depend on this crate alone and never build or
//! load tch. `ortbench` re-exports these modules under their old paths
//! (`ortbench::results::load_run`, `ortbench::report::write_report`, …).
//!
//! - `output`: the rows of a run's two tables and atomic file writes;
//! - `results`: the rows as DataFrames, written and read back (`load_run`);
//! - `table`, `charts`, `html`: the summary table, the SVG charts, index.html ([`write_report`]);
//! - `notebook`: how DataFrames, charts and memory plans show in Jupyter (evcxr).

pub mod charts;
pub mod html;
pub mod notebook;
pub mod output;
pub mod results;
pub mod table;

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::Value;

use crate::output::write_text;
use crate::results::load_run;

pub use polars;

/// The configurations `ortbench run` compares, in the order tables and charts show them: the
/// libtorch eager baseline, HF + torch.compile, the engine, the engine under ZeRO-1.
pub const CONFIGS: &[&str] = &["pytorch", "torch-compile", "ort", "ort-zero1"];

/// A JSON value as a person reads it: strings bare, lists comma-separated, null as "-".
pub fn display_value(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "-".into(),
        Value::Array(a) => a.iter().map(display_value).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// Writes `DIR/charts/*.svg` and `DIR/index.html` from the run's files; returns the path of
/// index.html. Fails before writing anything when DIR is not a run directory.
pub fn write_report(dir: &Path) -> Result<PathBuf> {
    let run = load_run(dir)?;
    let results = run.result_rows()?;
    let steps = run.step_rows()?;
    let charts = charts::all_charts(&results, &steps)?;
    let html = html::render(&results, &charts, &run.env)?;
    let chart_dir = dir.join("charts");
    std::fs::create_dir_all(&chart_dir)?;
    let names: Vec<String> = charts.iter().map(|c| format!("{}.svg", c.id)).collect();
    // Charts of an earlier report that this one no longer has (fewer models) go.
    for entry in std::fs::read_dir(&chart_dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".svg") && !names.contains(&name) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    for (c, name) in charts.iter().zip(&names) {
        write_text(&chart_dir.join(name), &c.svg)?;
    }
    let index = dir.join("index.html");
    write_text(&index, &html)?;
    Ok(index)
}
