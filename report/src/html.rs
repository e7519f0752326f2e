//! index.html: one self-contained file (inline CSS and SVG; no scripts, no network) rendered
//! with minijinja. The template auto-escapes every value (it is named `.html`); only the
//! charts, which plotters wrote with their text escaped, go in as trusted markup.

use anyhow::{Context, Result};
use minijinja::{context, Environment, Value};
use serde::Serialize;

use crate::charts::{config_color, configs, Chart};
use crate::display_value;
use crate::output::ResultRow;
use crate::table::{summary_rows, SUMMARY_HEADER};

const TEMPLATE: &str = include_str!("templates/report.html");

#[derive(Serialize)]
struct Row {
    cells: Vec<String>,
    ok: bool,
}

#[derive(Serialize)]
struct RunError {
    label: String,
    status: String,
    error: String,
}

/// Renders the report. `meta` is run.json.
pub fn render(results: &[ResultRow], charts: &[Chart], meta: &serde_json::Value) -> Result<String> {
    let mut env = Environment::new();
    env.add_template("report.html", TEMPLATE).context("the report template")?;
    let rows: Vec<Row> = summary_rows(results)
        .into_iter()
        .map(|(cells, r)| Row { cells, ok: r.status == "ok" })
        .collect();
    let errors: Vec<RunError> = results
        .iter()
        .filter(|r| r.status != "ok")
        .map(|r| RunError {
            label: format!("{} · {} · {} · {} rank(s)", r.model, r.config, r.precision, r.ranks),
            status: r.status.clone(),
            error: r.error.clone(),
        })
        .collect();
    let charts: Vec<Value> = charts
        .iter()
        .map(|c| context! { id => c.id, title => c.title, svg => Value::from_safe_string(c.svg.clone()) })
        .collect();
    let configs: Vec<Value> = configs(results)
        .into_iter()
        .map(|c| {
            let RgbHex(hex) = RgbHex::of(&c);
            context! { name => c, color => hex }
        })
        .collect();
    let environment: Vec<(String, String)> = meta
        .get("environment")
        .and_then(|e| e.as_object())
        .map(|m| m.iter().map(|(k, v)| (k.clone(), display_value(v))).collect())
        .unwrap_or_default();
    let s = |k: &str| meta.get(k).map(display_value).unwrap_or_default();
    let html = env.get_template("report.html")?.render(context! {
        title => format!("{} run(s) · {}", results.len(), s("started_at")),
        settings => s("settings"),
        interrupted => meta.get("interrupted").and_then(|v| v.as_bool()).unwrap_or(false),
        runs_planned => s("runs_planned"),
        runs_recorded => s("runs_recorded"),
        header => SUMMARY_HEADER,
        rows => rows,
        peak_source => meta.get("peak").map(|p| format!("{} ({})", s_of(p, "device"), s_of(p, "source"))).unwrap_or_else(|| "-".into()),
        diverge_tol => s("diverge_tol"),
        charts => charts,
        configs => configs,
        errors => errors,
        command_line => s("command_line"),
        environment => environment,
        version => s("ortbench_version"),
        started_at => s("started_at"),
        finished_at => meta.get("finished_at").filter(|v| !v.is_null()).map(display_value),
    })?;
    Ok(html)
}

fn s_of(v: &serde_json::Value, k: &str) -> String {
    v.get(k).map(display_value).unwrap_or_default()
}

struct RgbHex(String);

impl RgbHex {
    fn of(config: &str) -> RgbHex {
        let c = config_color(config);
        RgbHex(format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_from_input_is_escaped() {
        let r = ResultRow {
            model: "<script>alert(1)</script>".into(),
            config: "ort".into(),
            precision: "fp32".into(),
            ranks: 1,
            status: "error".into(),
            error: "boom <img src=x onerror=alert(1)>".into(),
            ..Default::default()
        };
        let meta = serde_json::json!({
            "command_line": "ortbench run --models '<x>'",
            "environment": {"cpu": "A & B <cpu>"},
        });
        let chart =
            Chart { id: "c".into(), title: "<t>".into(), svg: "<svg><text>ok</text></svg>".into() };
        let html = render(&[r], &[chart], &meta).unwrap();
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("<img"));
        assert!(!html.contains("<x>") && !html.contains("<cpu>") && !html.contains("<t>"));
        assert!(html.contains("&lt;script&gt;"));
        assert!(html.contains("A &amp; B"));
        assert!(html.contains("<svg><text>ok</text></svg>"), "charts are inlined as markup");
        for external in ["src=\"http", "href=\"http", "<link", "<script"] {
            assert!(!html.contains(external), "external resource {external}");
        }
    }
}
