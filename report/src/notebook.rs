//! What results look like in Jupyter (the evcxr kernel).
//!
//! evcxr shows the last expression of a cell by calling `.evcxr_display()` on it when that
//! method exists (else it prints `{:?}`); the method prints `EVCXR_BEGIN_CONTENT <mime>`, the
//! content, and `EVCXR_END_CONTENT` on stdout, once per MIME type (one output per cell: a later
//! block of the same type replaces an earlier one). [`EvcxrDisplay`] gives that method to the
//! types a user looks at — a Polars `DataFrame` (an HTML table, with the plain-text table as
//! fallback) and a [`Chart`] (SVG) — and [`Html`] / [`Svg`] wrap any markup:
//!
//! ```no_run
//! use ortbench_report::notebook::*;
//! let run = ortbench_report::results::load_run("reports/sample").unwrap();
//! run.results.evcxr_display(); // as a cell's last expression: `run.results`
//! ```

use std::fmt::Write;

use polars::prelude::{AnyValue, DataFrame};

use crate::charts::Chart;
use crate::output::ResultRow;
use crate::table::{summary_rows, SUMMARY_HEADER};

/// The evcxr display hook (import it with `use ortbench_report::notebook::*;`).
pub trait EvcxrDisplay {
    fn evcxr_display(&self);
}

/// Prints one evcxr content block per (mime type, content).
fn emit(parts: &[(&str, &str)]) {
    let mut out = String::new();
    for (mime, content) in parts {
        // A content line equal to the end marker would end the block early; none of ours is.
        let _ = write!(out, "EVCXR_BEGIN_CONTENT {mime}\n{content}\nEVCXR_END_CONTENT\n");
    }
    print!("{out}");
}

/// Markup shown as HTML.
#[derive(Clone, Debug)]
pub struct Html(pub String);

impl EvcxrDisplay for Html {
    fn evcxr_display(&self) {
        emit(&[("text/html", &self.0)]);
    }
}

/// An SVG document shown as an image.
#[derive(Clone, Debug)]
pub struct Svg(pub String);

impl EvcxrDisplay for Svg {
    fn evcxr_display(&self) {
        emit(&[("image/svg+xml", &self.0)]);
    }
}

impl EvcxrDisplay for Chart {
    fn evcxr_display(&self) {
        emit(&[("image/svg+xml", &self.svg)]);
    }
}

/// Several charts in one output: one HTML block with each chart's title and inline SVG.
impl EvcxrDisplay for [Chart] {
    fn evcxr_display(&self) {
        let mut html = String::new();
        for c in self {
            let _ = write!(html, "<h4>{}</h4>\n<div>{}</div>\n", escape(&c.title), c.svg);
        }
        emit(&[("text/html", &html)]);
    }
}

impl EvcxrDisplay for Vec<Chart> {
    fn evcxr_display(&self) {
        self.as_slice().evcxr_display();
    }
}

impl EvcxrDisplay for DataFrame {
    fn evcxr_display(&self) {
        emit(&[("text/plain", &self.to_string()), ("text/html", &frame_html(self, MAX_ROWS))]);
    }
}

/// Rows an HTML table shows before it says how many it left out.
pub const MAX_ROWS: usize = 40;

/// `df` as an HTML table: a header of column names and dtypes, at most `max_rows` rows.
pub fn frame_html(df: &DataFrame, max_rows: usize) -> String {
    let mut h = String::from("<table class=\"dataframe\">\n<thead><tr>");
    for c in df.columns() {
        let _ = write!(
            h,
            "<th>{}<br><small>{}</small></th>",
            escape(c.name()),
            escape(&c.dtype().to_string())
        );
    }
    h.push_str("</tr></thead>\n<tbody>\n");
    let shown = df.height().min(max_rows);
    for i in 0..shown {
        h.push_str("<tr>");
        for c in df.columns() {
            let cell = c.get(i).map(|v| cell_text(&v)).unwrap_or_default();
            let align =
                if c.dtype().is_primitive_numeric() { " style=\"text-align:right\"" } else { "" };
            let _ = write!(h, "<td{align}>{}</td>", escape(&cell));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</tbody>\n</table>\n");
    let _ = write!(h, "<p><small>{} rows × {} columns", df.height(), df.width());
    if shown < df.height() {
        let _ = write!(h, " (first {shown} shown)");
    }
    h.push_str("</small></p>\n");
    h
}

/// A cell as a person reads it: strings bare, nulls empty, floats with 4 significant digits.
fn cell_text(v: &AnyValue) -> String {
    match v {
        AnyValue::Null => String::new(),
        AnyValue::String(s) => s.to_string(),
        AnyValue::StringOwned(s) => s.to_string(),
        AnyValue::Float64(x) => float(*x),
        AnyValue::Float32(x) => float(f64::from(*x)),
        other => other.to_string(),
    }
}

fn float(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        format!("{x}")
    } else if (1e-3..1e6).contains(&x.abs()) {
        let decimals = (3 - x.abs().log10().floor() as i32).max(0) as usize;
        format!("{x:.decimals$}")
    } else {
        format!("{x:.3e}")
    }
}

/// The run's summary table (the cells `ortbench run` prints and index.html shows) as HTML.
pub fn summary_table(results: &[ResultRow]) -> Html {
    let mut h = String::from("<table class=\"dataframe\">\n<thead><tr>");
    for name in SUMMARY_HEADER {
        let _ = write!(h, "<th>{}</th>", escape(name));
    }
    h.push_str("</tr></thead>\n<tbody>\n");
    for (cells, _) in summary_rows(results) {
        h.push_str("<tr>");
        for c in cells {
            let _ = write!(h, "<td>{}</td>", escape(&c));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</tbody>\n</table>\n");
    Html(h)
}

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use polars::prelude::*;

    #[test]
    fn frames_become_escaped_html_tables() {
        let df =
            df!("model" => ["<b>", "gpt2"], "samples_per_s" => [Some(2.345678), None]).unwrap();
        let h = frame_html(&df, 1);
        assert!(h.contains("<th>model<br><small>str</small></th>"), "{h}");
        assert!(h.contains("<td>&lt;b&gt;</td>"), "{h}");
        assert!(h.contains("<td style=\"text-align:right\">2.346</td>"), "{h}");
        assert!(h.contains("2 rows × 2 columns (first 1 shown)"), "{h}");
        assert_eq!(float(1234.56), "1235");
        assert_eq!(float(0.5), "0.5000");
        assert_eq!(float(0.00012), "1.200e-4");
    }

    #[test]
    fn summary_has_a_row_per_run() {
        let r = ResultRow {
            model: "m".into(),
            config: "ort".into(),
            status: "ok".into(),
            ..Default::default()
        };
        let Html(h) = summary_table(&[r.clone(), ResultRow { config: "pytorch".into(), ..r }]);
        assert_eq!(h.matches("<tr>").count(), 3);
        assert!(h.contains("<th>samples/s</th>"));
    }
}
