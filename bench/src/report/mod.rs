//! The report of a run directory: the summary table (`table`), the charts (`charts`, SVG) and
//! index.html (`html`). `run` writes it at the end; `ortbench report DIR` rewrites it from
//! the files alone.

pub mod charts;
pub mod html;
pub mod table;

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::output::write_text;
use crate::results::load_run;

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
