//! The report's charts as SVG strings (plotters' SVG backend: text stays text, rendered by
//! the browser, so no font files are needed): grouped bars of speedup, throughput and peak
//! memory per model, and per model the loss curves and the step times of every config.

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::output::{MemSplit, ResultRow, StepRow};
use crate::CONFIGS;

/// One chart of the report.
#[derive(Clone, Debug)]
pub struct Chart {
    /// File stem (charts/<id>.svg) and HTML anchor.
    pub id: String,
    pub title: String,
    pub svg: String,
}

const WIDTH: u32 = 960;
const HEIGHT: u32 = 400;
const FONT: &str = "sans-serif";

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e:?}")
}

/// Decimals that tell apart the labels of an axis over `lo..hi` (plotters puts about ten of
/// them on it): one more than the order of magnitude of the tick spacing asks for, so a loss
/// axis over 10.5991..10.6012 reads 10.5995, 10.6000, … rather than ten times "10.6".
fn axis_decimals(lo: f64, hi: f64) -> usize {
    let step = (hi - lo).abs() / 10.0;
    if !step.is_finite() || step <= 0.0 {
        return 2;
    }
    (-step.log10().floor()).clamp(0.0, 12.0) as usize
}

/// An axis number with `decimals` decimals; tiny or huge magnitudes in scientific notation.
fn axis_number(v: f64, decimals: usize) -> String {
    let a = v.abs();
    if v != 0.0 && !(1e-3..1e7).contains(&a) {
        format!("{v:.2e}")
    } else {
        format!("{v:.decimals$}")
    }
}

/// A fixed colour per config, so that every chart reads alike.
pub fn config_color(config: &str) -> RGBColor {
    match config {
        "pytorch" => RGBColor(0xEE, 0x4C, 0x2C),
        "torch-compile" => RGBColor(0x94, 0x67, 0xBD),
        "ort" => RGBColor(0x1F, 0x77, 0xB4),
        "ort-zero1" => RGBColor(0x2C, 0xA0, 0x2C),
        _ => RGBColor(0x7F, 0x7F, 0x7F),
    }
}

/// What the bars and curves are grouped by: a model at one precision and rank count.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub model: String,
    pub precision: String,
    pub ranks: usize,
    pub label: String,
}

impl Group {
    pub fn contains(&self, r: &ResultRow) -> bool {
        r.model == self.model && r.precision == self.precision && r.ranks == self.ranks
    }
}

/// The groups in order of first appearance; labels name the precision and ranks only when
/// they vary.
pub fn groups(results: &[ResultRow]) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    let varies = |f: fn(&ResultRow) -> String| {
        results.iter().map(f).collect::<std::collections::BTreeSet<_>>().len() > 1
    };
    let (p, k) = (varies(|r| r.precision.clone()), varies(|r| r.ranks.to_string()));
    for r in results {
        if out.iter().any(|g| g.contains(r)) {
            continue;
        }
        let mut label = r.model.clone();
        if p {
            label.push_str(&format!(" · {}", r.precision));
        }
        if k {
            label.push_str(&format!(" · {} rank{}", r.ranks, if r.ranks == 1 { "" } else { "s" }));
        }
        out.push(Group {
            model: r.model.clone(),
            precision: r.precision.clone(),
            ranks: r.ranks,
            label,
        });
    }
    out
}

/// The configs present, in CONFIGS order.
pub fn configs(results: &[ResultRow]) -> Vec<String> {
    let mut out: Vec<String> = CONFIGS
        .iter()
        .filter(|c| results.iter().any(|r| r.config == **c))
        .map(|c| c.to_string())
        .collect();
    for r in results {
        if !out.contains(&r.config) {
            out.push(r.config.clone());
        }
    }
    out
}

/// Every chart of a run.
pub fn all_charts(results: &[ResultRow], steps: &[StepRow]) -> Result<Vec<Chart>> {
    let groups = groups(results);
    let configs = configs(results);
    let mut charts = vec![Chart {
        id: "speedup".into(),
        title: "Speedup over pytorch (ratio of median step times)".into(),
        svg: bar_chart(
            "Speedup over pytorch",
            "× pytorch (median step time)",
            &groups,
            &configs,
            results,
            |r| r.speedup,
            Some(1.0),
            2,
        )?,
    }];
    // With a torch-compile row: the engine's speedup over it, beside the one over pytorch.
    if results.iter().any(|r| r.speedup_vs_torch_compile.is_some()) {
        charts.push(Chart {
            id: "speedup-torch-compile".into(),
            title: "Speedup of the engine over torch-compile (ratio of median step times)".into(),
            svg: bar_chart(
                "Speedup over torch-compile",
                "× torch-compile (median step time)",
                &groups,
                &configs,
                results,
                |r| r.speedup_vs_torch_compile,
                Some(1.0),
                2,
            )?,
        });
    }
    charts.extend([
        Chart {
            id: "throughput".into(),
            title: "Throughput (samples/s)".into(),
            svg: bar_chart(
                "Throughput",
                "samples/s",
                &groups,
                &configs,
                results,
                |r| r.samples_per_s,
                None,
                2,
            )?,
        },
        Chart {
            id: "memory".into(),
            title: MEMORY_SPLIT_CAPTION.into(),
            svg: memory_split_chart(&groups, &configs, results)?,
        },
    ]);
    for (i, g) in groups.iter().enumerate() {
        let runs: Vec<&ResultRow> = results.iter().filter(|r| g.contains(r)).collect();
        let of = |r: &ResultRow| -> Vec<&StepRow> {
            steps
                .iter()
                .filter(|s| {
                    s.model == r.model
                        && s.config == r.config
                        && s.precision == r.precision
                        && s.rank < r.ranks
                })
                .collect()
        };
        // The loss curves that decide parity: the parity probe's when the run had one (dropout
        // 0, so the configs must agree), else the first timed run's.
        let probed = steps.iter().any(|s| {
            s.phase == "parity"
                && runs.iter().any(|r| s.model == r.model && s.precision == r.precision)
        });
        let loss_phase = if probed { "parity" } else { "timed" };
        let loss: Vec<(String, Vec<(f64, f64)>)> = runs
            .iter()
            .map(|r| {
                let pts = of(r).into_iter().filter(|s| {
                    s.rank == 0 && s.repeat == 0 && s.phase == loss_phase && s.loss.is_finite()
                });
                (r.config.clone(), pts.map(|s| (s.step as f64, s.loss)).collect())
            })
            .collect();
        let what = if probed { "parity probe" } else { "first run" };
        charts.push(Chart {
            id: format!("loss-{i}"),
            title: format!("Loss ({what}): {}", g.label),
            svg: line_chart(&format!("Loss · {} ({what})", g.label), "loss (rank 0)", &loss, None)?,
        });
        // Step times of the timed runs: per step the slowest rank, then the median over the
        // repeats.
        let times: Vec<(String, Vec<(f64, f64)>)> = runs
            .iter()
            .map(|r| {
                let mut per: std::collections::BTreeMap<(usize, usize), f64> =
                    std::collections::BTreeMap::new();
                // torch-compile's first step is its compilation (the table's compile column),
                // orders of magnitude above a step: left out so the other steps stay readable.
                let compiles = r.config == "torch-compile";
                for s in
                    of(r).into_iter().filter(|s| s.phase == "timed" && !(compiles && s.step == 0))
                {
                    let e = per.entry((s.step, s.repeat)).or_insert(0.0);
                    *e = e.max(s.step_ms);
                }
                let mut by_step: std::collections::BTreeMap<usize, Vec<f64>> =
                    std::collections::BTreeMap::new();
                for ((step, _), v) in per {
                    by_step.entry(step).or_default().push(v);
                }
                let median = |mut v: Vec<f64>| {
                    v.sort_by(f64::total_cmp);
                    let n = v.len();
                    if n % 2 == 1 {
                        v[n / 2]
                    } else {
                        0.5 * (v[n / 2 - 1] + v[n / 2])
                    }
                };
                (
                    r.config.clone(),
                    by_step.into_iter().map(|(k, v)| (k as f64, median(v))).collect(),
                )
            })
            .collect();
        let warmup = runs.first().map(|r| r.warmup as f64 - 0.5);
        let note = if runs.iter().any(|r| r.config == "torch-compile") {
            "; torch-compile's first step, its compilation, left out"
        } else {
            ""
        };
        charts.push(Chart {
            id: format!("steptime-{i}"),
            title: format!("Step time: {}{note}", g.label),
            svg: line_chart(
                &format!("Step time · {} (median of the repeats; dashed: end of warm-up)", g.label),
                "ms per step (slowest rank)",
                &times,
                warmup,
            )?,
        });
    }
    Ok(charts)
}

/// Grouped bars: one group per model, one bar per config, the value printed above each bar.
#[allow(clippy::too_many_arguments, reason = "the chart's data, labels and scale, each used once")]
fn bar_chart(
    title: &str,
    y_desc: &str,
    groups: &[Group],
    configs: &[String],
    results: &[ResultRow],
    value: impl Fn(&ResultRow) -> Option<f64>,
    reference: Option<f64>,
    decimals: usize,
) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let n = groups.len().max(1);
        let max = results
            .iter()
            .filter_map(&value)
            .filter(|v| v.is_finite())
            .fold(reference.unwrap_or(0.0), f64::max);
        let top = if max > 0.0 { max * 1.25 } else { 1.0 };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..top)
            .map_err(err)?;
        // The group names under the bars (plotters' own x labels would sit at round numbers).
        let under = TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        for (i, g) in groups.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(i as f64, 0.0));
            root.draw(&Text::new(g.label.clone(), (x, y + 8), under.clone())).map_err(err)?;
        }
        let dec = axis_decimals(0.0, top);
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .y_label_formatter(&|v| axis_number(*v, dec))
            .y_desc(y_desc)
            .y_label_style((FONT, 13))
            .draw()
            .map_err(err)?;
        let k = configs.len().max(1) as f64;
        let width = 0.8 / k;
        for (j, config) in configs.iter().enumerate() {
            let color = config_color(config);
            let bars: Vec<(f64, f64)> = groups
                .iter()
                .enumerate()
                .filter_map(|(i, g)| {
                    let r = results.iter().find(|r| g.contains(r) && &r.config == config)?;
                    value(r)
                        .filter(|v| v.is_finite())
                        .map(|v| (i as f64 - 0.4 + j as f64 * width, v))
                })
                .collect();
            chart
                .draw_series(bars.iter().map(|&(x0, v)| {
                    Rectangle::new(
                        [(x0 + 0.05 * width, 0.0), (x0 + 0.95 * width, v)],
                        color.filled(),
                    )
                }))
                .map_err(err)?
                .label(config.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())
                });
            let text =
                TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
            chart
                .draw_series(bars.iter().map(|&(x0, v)| {
                    Text::new(format!("{v:.decimals$}"), (x0 + 0.5 * width, v), text.clone())
                }))
                .map_err(err)?;
        }
        if let Some(y) = reference {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(-0.5, y), (n as f64 - 0.5, y)],
                    6,
                    4,
                    BLACK.mix(0.5).stroke_width(1),
                ))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .label_font((FONT, 14))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// The colour of each part of the memory split, in stacking order (`MemSplit::parts`), and of
/// what the parts leave of the measured peak; the same categorical palette as the configs'.
const PART_COLORS: [RGBColor; 5] = [
    RGBColor(0x1F, 0x77, 0xB4),
    RGBColor(0x2C, 0xA0, 0x2C),
    RGBColor(0x94, 0x67, 0xBD),
    RGBColor(0xFF, 0x7F, 0x0E),
    RGBColor(0xD6, 0x27, 0x28),
];
const UNATTRIBUTED: RGBColor = RGBColor(0xC7, 0xC7, 0xC7);
/// Activations that are what the measured peak leaves of the other parts: activations' orange,
/// lighter.
const REMAINDER: RGBColor = RGBColor(0xFF, 0xBB, 0x78);

/// The memory chart's caption: how each part is obtained, so that a reader can weigh it.
pub const MEMORY_SPLIT_CAPTION: &str = "Peak memory per rank (MiB), split by what holds it; \
the tick and number over each bar are the measured peak. Engine configs (plan): parameters, \
gradients and optimizer state are its flat buffers; its memory plan's arena (one block sized by \
its peak) is split by address into logits (the bytes that hold the loss head's logits, their \
gradient or its scratch) and activations (the rest of the arena); grey is what the process holds \
beyond them (runtime, libraries, data). Torch configs (analytic): fp32 parameters, gradients \
and both AdamW moments from the parameter count; pytorch's logits are the three B·T·V fp32 \
tensors libtorch's cross-entropy holds at its backward; its activations are what the measured \
peak leaves of the other four (light orange: activations and the rest, its runtime included). \
A part not known is not drawn and is named over the bar.";

/// Stacked bars of the memory split: per model group one bar per config, its known parts
/// stacked (`MemSplit::parts`' order), the measured peak marked by a tick and its value, what
/// the parts leave of it grey; a part not known is named over the bar, never drawn.
fn memory_split_chart(
    groups: &[Group],
    configs: &[String],
    results: &[ResultRow],
) -> Result<String> {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT + 40)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let n = groups.len().max(1);
        let max = results
            .iter()
            .flat_map(|r| [r.peak_mem_bytes.unwrap_or(0), r.mem_split().known_bytes()])
            .map(mib)
            .fold(0.0, f64::max);
        // Room above the bars for their labels and the legend's seven entries.
        let top = if max > 0.0 { max * 1.8 } else { 1.0 };
        let mut chart = ChartBuilder::on(&root)
            .caption("Peak memory per rank, split", (FONT, 22))
            .margin(12)
            .x_label_area_size(56)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..top)
            .map_err(err)?;
        let dec = axis_decimals(0.0, top);
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .y_label_formatter(&|v| axis_number(*v, dec))
            .y_desc("MiB")
            .y_label_style((FONT, 13))
            .draw()
            .map_err(err)?;
        let k = configs.len().max(1) as f64;
        let width = 0.8 / k;
        // (x0, x1, row) of every bar.
        let mut bars: Vec<(f64, f64, &ResultRow)> = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            for (j, config) in configs.iter().enumerate() {
                if let Some(r) = results.iter().find(|r| g.contains(r) && &r.config == config) {
                    let x0 = i as f64 - 0.4 + j as f64 * width;
                    bars.push((x0 + 0.08 * width, x0 + 0.92 * width, r));
                }
            }
        }
        // Activations that are what a peak leaves (`MemSplit::activations_are_remainder`) are
        // drawn in their own, lighter colour: they hold the process's runtime too.
        let mut remainders = Vec::new();
        for (p, color) in PART_COLORS.iter().enumerate() {
            let mut rects = Vec::new();
            for &(x0, x1, r) in &bars {
                let split = r.mem_split();
                let parts = split.parts();
                let below: u64 = parts[..p].iter().filter_map(|q| q.1).sum();
                if let Some(b) = parts[p].1.filter(|&b| b > 0) {
                    let q = [(x0, mib(below)), (x1, mib(below + b))];
                    if p == 3 && split.activations_are_remainder() {
                        remainders.push(q);
                    } else {
                        rects.push(q);
                    }
                }
            }
            let (name, color) = (MemSplit::default().parts()[p].0, *color);
            chart
                .draw_series(rects.iter().map(|q| Rectangle::new(*q, color.filled())))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())
                });
        }
        if !remainders.is_empty() {
            chart
                .draw_series(remainders.iter().map(|q| Rectangle::new(*q, REMAINDER.filled())))
                .map_err(err)?
                .label("activations and the rest (the peak less the other parts)")
                .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], REMAINDER.filled()));
        }
        // What the known parts leave of the measured peak.
        let rest: Vec<[(f64, f64); 2]> = bars
            .iter()
            .filter_map(|&(x0, x1, r)| {
                let known = r.mem_split().known_bytes();
                let peak = r.peak_mem_bytes?;
                (peak > known).then(|| [(x0, mib(known)), (x1, mib(peak))])
            })
            .collect();
        chart
            .draw_series(rest.iter().map(|q| Rectangle::new(*q, UNATTRIBUTED.filled())))
            .map_err(err)?
            .label("not attributed (runtime, libraries, data; unknown parts)")
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], UNATTRIBUTED.filled()));
        bar_labels(&mut chart, &root, &bars, groups, width)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .label_font((FONT, 13))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// The memory chart's coordinates: a float x (groups at integers) and MiB.
type MemChart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Over each bar (x0, x1, row) of the memory chart its measured peak, as a tick and a value,
/// and the parts not known; under it its config, under each group its label.
fn bar_labels(
    chart: &mut MemChart<'_, '_>,
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    bars: &[(f64, f64, &ResultRow)],
    groups: &[Group],
    width: f64,
) -> Result<()> {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    // The measured peak: a tick over the bar and its value; unknown parts named above it.
    let above = TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    for &(x0, x1, r) in bars {
        let split = r.mem_split();
        let known = mib(split.known_bytes());
        let top_of_bar = r.peak_mem_bytes.map(mib).unwrap_or(known).max(known);
        if let Some(peak) = r.peak_mem_bytes.map(mib) {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x0 - 0.04 * width, peak), (x1 + 0.04 * width, peak)],
                    BLACK.stroke_width(2),
                )))
                .map_err(err)?;
        }
        let unknown: Vec<&str> =
            split.parts().iter().filter(|p| p.1.is_none()).map(|p| p.0).collect();
        let mut label = match r.peak_mem_bytes {
            Some(b) => format!("{:.0}", mib(b)),
            None => "peak n/a".to_string(),
        };
        if split.known_bytes() > r.peak_mem_bytes.unwrap_or(u64::MAX) {
            label.push_str(" < parts!");
        }
        let (x, y) = chart.backend_coord(&(0.5 * (x0 + x1), top_of_bar));
        root.draw(&Text::new(label, (x, y - 2), above.clone())).map_err(err)?;
        if !unknown.is_empty() {
            let text = if unknown.len() == 5 {
                "split unknown".to_string()
            } else {
                format!("unknown: {}", unknown.join(", "))
            };
            let small =
                TextStyle::from((FONT, 10).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
            root.draw(&Text::new(text, (x, y - 16), small)).map_err(err)?;
        }
    }
    // Under each bar its config, under each group its label.
    let under = TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for &(x0, x1, r) in bars {
        let (x, y) = chart.backend_coord(&(0.5 * (x0 + x1), 0.0));
        root.draw(&Text::new(r.config.clone(), (x, y + 6), under.clone())).map_err(err)?;
    }
    let group = TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for (i, g) in groups.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64, 0.0));
        root.draw(&Text::new(g.label.clone(), (x, y + 26), group.clone())).map_err(err)?;
    }
    Ok(())
}

/// One line per config over the steps; `vline`: a dashed vertical marker (end of warm-up).
fn line_chart(
    title: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
    vline: Option<f64>,
) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let points = series.iter().flat_map(|(_, p)| p.iter());
        let (mut xmax, mut ymin, mut ymax) = (1.0f64, f64::INFINITY, f64::NEG_INFINITY);
        for &(x, y) in points {
            xmax = xmax.max(x);
            ymin = ymin.min(y);
            ymax = ymax.max(y);
        }
        if !ymin.is_finite() {
            (ymin, ymax) = (0.0, 1.0);
        }
        let pad = ((ymax - ymin) * 0.08).max(ymax.abs() * 1e-4).max(1e-9);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..xmax, (ymin - pad)..(ymax + pad))
            .map_err(err)?;
        let dec = axis_decimals(ymin - pad, ymax + pad);
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc(y_desc)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|v| axis_number(*v, dec))
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .x_labels((xmax as usize + 1).min(12))
            .label_style((FONT, 13))
            .draw()
            .map_err(err)?;
        // Later series are drawn thinner on top, so curves that coincide (as they should)
        // stay visible one inside the other.
        for (j, (config, pts)) in series.iter().enumerate() {
            let color = config_color(config);
            let width = 5u32.saturating_sub(2 * j as u32).max(1);
            chart
                .draw_series(
                    LineSeries::new(pts.iter().copied(), color.stroke_width(width))
                        .point_size(width + 1),
                )
                .map_err(err)?
                .label(config.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        if let Some(x) = vline.filter(|x| *x > 0.0) {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x, ymin - pad), (x, ymax + pad)],
                    5,
                    4,
                    BLACK.mix(0.4).stroke_width(1),
                ))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .label_font((FONT, 14))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// One arena buffer of a memory plan: live from schedule position `first` to `last`
/// (inclusive) at bytes `offset..offset + len` of the arena.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanBlock {
    pub first: usize,
    pub last: usize,
    pub offset: usize,
    pub len: usize,
    /// A kernel's scratch rather than tensors.
    pub workspace: bool,
}

/// A memory plan drawn: time (node position in the graph, `steps` of them) across, arena offset (MiB) up, one rectangle
/// per buffer; buffers that share bytes never overlap in time. A dashed line marks the arena's
/// size. Takes plain blocks so that this crate needs no engine.
pub fn memory_plan_chart(
    title: &str,
    blocks: &[PlanBlock],
    steps: usize,
    arena_bytes: usize,
) -> Result<String> {
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    let tensor = RGBColor(0x1F, 0x77, 0xB4);
    let scratch = RGBColor(0xFF, 0x7F, 0x0E);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT + 100)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let top =
            blocks.iter().map(|b| mib(b.offset + b.len)).fold(mib(arena_bytes), f64::max).max(1e-6)
                * 1.05;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..steps.max(1) as f64, 0f64..top)
            .map_err(err)?;
        let dec = axis_decimals(0.0, top);
        chart
            .configure_mesh()
            .x_desc("schedule position (node)")
            .y_desc("arena offset (MiB)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|v| axis_number(*v, dec))
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .label_style((FONT, 13))
            .draw()
            .map_err(err)?;
        for (workspace, color, label) in
            [(false, tensor, "tensors"), (true, scratch, "kernel workspace")]
        {
            let rects: Vec<[(f64, f64); 2]> = blocks
                .iter()
                .filter(|b| b.workspace == workspace)
                .map(|b| {
                    [(b.first as f64, mib(b.offset)), ((b.last + 1) as f64, mib(b.offset + b.len))]
                })
                .collect();
            chart
                .draw_series(rects.iter().map(|r| Rectangle::new(*r, color.mix(0.45).filled())))
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.mix(0.45).filled())
                });
            chart
                .draw_series(rects.iter().map(|r| Rectangle::new(*r, color.stroke_width(1))))
                .map_err(err)?;
        }
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, mib(arena_bytes)), (steps.max(1) as f64, mib(arena_bytes))],
                6,
                4,
                BLACK.mix(0.6).stroke_width(1),
            ))
            .map_err(err)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .label_font((FONT, 14))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(model: &str, config: &str, sps: f64) -> ResultRow {
        ResultRow {
            model: model.into(),
            config: config.into(),
            precision: "fp32".into(),
            ranks: 1,
            warmup: 1,
            status: "ok".into(),
            samples_per_s: Some(sps),
            speedup: Some(sps / 10.0),
            peak_mem_bytes: Some(100 << 20),
            ..Default::default()
        }
    }

    #[test]
    fn axis_labels_tell_ticks_apart() {
        // A loss curve that barely moves (the chart that read "10.6, 10.6, 10.6").
        let (lo, hi) = (10.5991, 10.6012);
        let d = axis_decimals(lo, hi);
        let labels: Vec<String> =
            (0..=10).map(|i| axis_number(lo + (hi - lo) * i as f64 / 10.0, d)).collect();
        let mut uniq = labels.clone();
        uniq.dedup();
        assert_eq!(uniq.len(), labels.len(), "{labels:?}");
        assert_eq!(axis_number(1234.5, axis_decimals(0.0, 4000.0)), "1234");
        assert_eq!(axis_number(0.0, 3), "0.000");
        // And in a drawn chart: the loss axis labels are distinct numbers.
        let pts: Vec<(f64, f64)> = (0..8).map(|i| (i as f64, 10.6 + 1e-4 * i as f64)).collect();
        let svg = line_chart("t", "loss", &[("ort".into(), pts)], None).unwrap();
        let ticks: Vec<&str> = svg
            .split('>')
            .filter_map(|t| t.split('<').next())
            .map(str::trim)
            .filter(|t| t.parse::<f64>().is_ok_and(|v| (10.0..11.0).contains(&v)))
            .collect();
        assert!(ticks.len() >= 3, "{ticks:?}");
        let mut sorted = ticks.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), ticks.len(), "duplicate tick labels: {ticks:?}");
    }

    #[test]
    fn charts_are_svg_with_escaped_text() {
        let results = vec![
            row("<b>m</b>", "pytorch", 10.0),
            row("<b>m</b>", "ort", 15.0),
            row("n", "pytorch", 5.0),
        ];
        let steps: Vec<StepRow> = (0..4)
            .map(|s| StepRow {
                model: "<b>m</b>".into(),
                config: "ort".into(),
                precision: "fp32".into(),
                repeat: 0,
                phase: "timed".into(),
                rank: 0,
                step: s,
                loss: 10.0 - s as f64 * 0.1,
                step_ms: 5.0,
                device_ms: None,
                grad_norm: 1.0,
                loss_scale: 1.0,
                skipped: false,
            })
            .collect();
        let charts = all_charts(&results, &steps).unwrap();
        assert_eq!(charts.len(), 3 + 2 * 2);
        for c in &charts {
            assert!(c.svg.trim_start().starts_with("<svg"), "{}", c.id);
            assert!(!c.svg.contains("<b>"), "{} has unescaped text", c.id);
        }
        assert!(charts[0].svg.contains("1.50"), "bar values are printed");
        assert!(charts[0].svg.contains("&lt;b&gt;m&lt;/b&gt;"));
    }

    /// A row with a memory split: `parts` in MiB (None: unknown) and the measured peak.
    fn split_row(model: &str, config: &str, parts: [Option<u64>; 5], peak: u64) -> ResultRow {
        let mut r = row(model, config, 10.0);
        let b = |p: Option<u64>| p.map(|m| m << 20);
        r.set_mem_split(Some(&MemSplit {
            params_bytes: b(parts[0]),
            grads_bytes: b(parts[1]),
            optimizer_bytes: b(parts[2]),
            activations_bytes: b(parts[3]),
            logits_bytes: b(parts[4]),
            source: if config.starts_with("ort") { MemSplit::PLAN } else { MemSplit::ANALYTIC }
                .into(),
        }));
        r.peak_mem_bytes = Some(peak << 20);
        r
    }

    /// The SVG's texts, trimmed (plotters writes each on a line of its own).
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>')?.1.split("</text>").next())
            .map(|t| t.trim().to_string())
            .collect()
    }

    /// How many rectangles of `color` the SVG has (plotters writes fills as #RRGGBB).
    fn rects_of(svg: &str, color: RGBColor) -> usize {
        let fill = format!("fill=\"#{:02X}{:02X}{:02X}\"", color.0, color.1, color.2);
        svg.split("<rect")
            .skip(1)
            .filter(|r| r.split('>').next().unwrap_or("").contains(&fill))
            .count()
    }

    #[test]
    fn memory_chart_stacks_the_known_parts_of_every_config() {
        let all = |a, b, c, d, e| [Some(a), Some(b), Some(c), Some(d), Some(e)];
        let results = vec![
            split_row("gpt2", "pytorch", all(475, 475, 950, 963, 1150), 4013),
            split_row("gpt2", "torch-compile", [Some(475), Some(475), Some(950), None, None], 3507),
            split_row("gpt2", "ort", all(475, 475, 950, 700, 400), 3111),
            split_row("bert", "pytorch", all(420, 420, 840, 991, 350), 3021),
            split_row("bert", "ort", all(420, 420, 840, 500, 120), 2417),
        ];
        let charts = all_charts(&results, &[]).unwrap();
        let svg = &charts.iter().find(|c| c.id == "memory").unwrap().svg;
        let text = texts(svg);
        let count = |s: &str| text.iter().filter(|t| *t == s).count();
        for name in ["parameters", "gradients", "optimizer state", "activations", "logits"] {
            assert_eq!(count(name), 1, "the legend names {name}");
        }
        // One rectangle per config that knows the part, plus the legend's swatch.
        for (p, color) in PART_COLORS.iter().enumerate() {
            let known = results
                .iter()
                .filter(|r| r.mem_split().parts()[p].1.is_some())
                .filter(|r| p != 3 || !r.mem_split().activations_are_remainder())
                .count();
            assert_eq!(rects_of(svg, *color), known + 1, "part {p}");
        }
        // The analytic rows' activations are what their peaks leave: drawn as such.
        assert_eq!(rects_of(svg, REMAINDER), 2 + 1);
        assert_eq!(count("activations and the rest (the peak less the other parts)"), 1);
        // Every bar is named by its config and topped by its measured peak.
        for (config, n) in [("pytorch", 2), ("torch-compile", 1), ("ort", 2)] {
            assert_eq!(count(config), n, "{config}");
        }
        for peak in ["4013", "3507", "3111", "3021", "2417"] {
            assert_eq!(count(peak), 1, "peak {peak}");
        }
        assert_eq!(count("unknown: activations, logits"), 1);
        // Grey: what the known parts leave of the peak (not for pytorch, whose activations are
        // the remainder here).
        assert_eq!(rects_of(svg, UNATTRIBUTED), 3 + 1);
        assert!(!text.iter().any(|t| t.contains("parts!")), "no split exceeds its peak");
        // A split above its measured peak is a bug, and the chart says so.
        let over = split_row("gpt2", "ort", all(475, 475, 950, 700, 400), 2000);
        let one = std::slice::from_ref(&over);
        let svg = memory_split_chart(&groups(one), &configs(one), one).unwrap();
        assert!(texts(&svg).contains(&"2000 &lt; parts!".to_string()), "{svg}");
    }

    #[test]
    fn memory_plan_chart_draws_every_block() {
        let blocks = vec![
            PlanBlock { first: 0, last: 2, offset: 0, len: 1 << 20, workspace: false },
            PlanBlock { first: 3, last: 4, offset: 0, len: 1 << 19, workspace: true },
        ];
        let svg = memory_plan_chart("plan", &blocks, 5, 1 << 20).unwrap();
        assert!(svg.trim_start().starts_with("<svg"));
        assert!(svg.contains("kernel workspace") && svg.contains("arena offset (MiB)"));
    }
}
