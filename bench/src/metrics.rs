//! What a run's records become: step-time statistics, throughput, achieved FLOP/s and MFU,
//! and the comparison of each config with the `pytorch` baseline (speedup, loss parity).

use std::collections::BTreeMap;

use ortbench_models::config::ModelConfig;
use serde::Serialize;

use crate::output::{ResultRow, StepRow};

/// Statistics of the measured step times (steps ≥ warm-up). A step lasts as long as its
/// slowest rank.
#[derive(Clone, Debug, PartialEq)]
pub struct StepStats {
    pub count: usize,
    pub median: f64,
    pub p90: f64,
    pub min: f64,
    pub max: f64,
    /// Population standard deviation.
    pub std: f64,
    pub total_ms: f64,
}

/// Step times of one run per step (the slowest rank), for steps ≥ `warmup` that were not
/// skipped: a skipped (overflowed) step's optimizer update did not run, so its time is not a
/// training step's.
pub fn step_times(steps: &[StepRow], warmup: usize) -> Vec<f64> {
    let mut per_step: BTreeMap<usize, f64> = BTreeMap::new();
    for s in steps.iter().filter(|s| s.step >= warmup && !s.skipped) {
        let e = per_step.entry(s.step).or_insert(0.0);
        *e = e.max(s.step_ms);
    }
    per_step.into_values().collect()
}

/// How a run whose worker ended well trained, from its rank-0 steps: `diverged` with the count
/// when more than half of its timed steps (≥ `warmup`) were skipped (their gradients overflowed:
/// the loss scale halved each time) or when its final loss is not finite; None when it trained.
pub fn step_status(steps: &[StepRow], warmup: usize) -> Option<String> {
    let rank0: Vec<&StepRow> = steps.iter().filter(|s| s.rank == 0).collect();
    let timed: Vec<&&StepRow> = rank0.iter().filter(|s| s.step >= warmup).collect();
    let skipped = timed.iter().filter(|s| s.skipped).count();
    let scales =
        |v: &[&&StepRow]| v.first().zip(v.last()).map(|(a, b)| (a.loss_scale, b.loss_scale));
    if !timed.is_empty() && 2 * skipped > timed.len() {
        let (from, to) = scales(&timed).unwrap();
        return Some(format!(
            "{skipped} of {} timed steps skipped (non-finite gradients; loss scale {from} → {to})",
            timed.len()
        ));
    }
    let last = rank0.last()?;
    (!last.loss.is_finite()).then(|| {
        let all = rank0.iter().filter(|s| s.skipped).count();
        format!(
            "final loss {} at step {} ({all} of {} steps skipped)",
            last.loss,
            last.step,
            rank0.len()
        )
    })
}

pub fn step_stats(times_ms: &[f64]) -> Option<StepStats> {
    if times_ms.is_empty() {
        return None;
    }
    let mut sorted = times_ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as f64;
    let total: f64 = sorted.iter().sum();
    let mean = total / n;
    let var = sorted.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / n;
    Some(StepStats {
        count: sorted.len(),
        median: percentile(&sorted, 0.5),
        p90: percentile(&sorted, 0.9),
        min: sorted[0],
        max: sorted[sorted.len() - 1],
        std: var.sqrt(),
        total_ms: total,
    })
}

/// Linear-interpolated percentile of sorted values (numpy's default).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Fills a row's throughput columns from its runs' measured step times (each run's steps ≥
/// warm-up, pooled): step-time statistics, samples/s and tokens/s at the median step time
/// (global batch = batch_size × ranks), achieved model TFLOP/s, MFU and HFU against the
/// device's theoretical peak.
pub fn fill_throughput(row: &mut ResultRow, pooled_ms: &[f64], peak_tflops: Option<f64>) {
    let Some(st) = step_stats(pooled_ms) else { return };
    let sps = (row.batch_size * row.ranks) as f64 / (st.median / 1e3);
    row.samples_per_s = Some(sps);
    row.tokens_per_s = Some(sps * row.seq_len as f64);
    row.step_ms_median = Some(st.median);
    row.step_ms_p90 = Some(st.p90);
    row.step_ms_min = Some(st.min);
    row.step_ms_max = Some(st.max);
    row.step_ms_std = Some(st.std);
    row.tflops = row.train_flops_per_sample.map(|f| f * sps / 1e12);
    row.peak_tflops = peak_tflops;
    set_utilisation(row);
}

/// MFU and HFU of a row from its throughput, FLOP counts and peak.
pub fn set_utilisation(row: &mut ResultRow) {
    let per_s = |flops: Option<f64>| flops.zip(row.samples_per_s).map(|(f, s)| f * s / 1e12);
    let util = |t: Option<f64>| match (t, row.peak_tflops) {
        (Some(t), Some(p)) if p > 0.0 => Some(t / p),
        _ => None,
    };
    row.mfu = util(per_s(row.train_flops_per_sample));
    row.hfu = util(per_s(row.hw_flops_per_sample));
}

/// Median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(v, 0.5)
}

/// SplitMix64: a small deterministic generator for the bootstrap (same run, same interval).
struct SplitMix(u64);

impl SplitMix {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// Bootstrap resamples behind a speedup interval.
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// 95 % percentile-bootstrap interval of the speedup `median(base) / median(other)`, where
/// each side is a list of runs' measured step times. A resample draws as many runs as the side
/// has, with replacement, then each drawn run's steps with replacement — a two-level bootstrap,
/// so run-to-run drift on a shared machine widens the interval as it should, which resampling
/// pooled steps alone would hide. None when a side has no step.
pub fn speedup_interval(
    base: &[Vec<f64>],
    other: &[Vec<f64>],
    resamples: usize,
    seed: u64,
) -> Option<(f64, f64)> {
    let base: Vec<&Vec<f64>> = base.iter().filter(|r| !r.is_empty()).collect();
    let other: Vec<&Vec<f64>> = other.iter().filter(|r| !r.is_empty()).collect();
    if base.is_empty() || other.is_empty() || resamples == 0 {
        return None;
    }
    let mut rng = SplitMix(seed);
    let mut pool = Vec::new();
    let mut draw = |runs: &[&Vec<f64>], rng: &mut SplitMix| {
        pool.clear();
        for _ in 0..runs.len() {
            let run = runs[rng.below(runs.len())];
            pool.extend((0..run.len()).map(|_| run[rng.below(run.len())]));
        }
        median(&mut pool)
    };
    let mut ratios: Vec<f64> =
        (0..resamples).map(|_| draw(&base, &mut rng) / draw(&other, &mut rng)).collect();
    ratios.sort_by(f64::total_cmp);
    Some((percentile(&ratios, 0.025), percentile(&ratios, 0.975)))
}

/// Analytic training FLOPs of one sample of `seq` tokens: 3 × the forward pass's matmul
/// FLOPs (the backward pass computes two matmuls per forward matmul: the gradients of the
/// input and of the weight). The forward count is the model family's
/// ([`ModelConfig::flop_count`]: attention projections, the T×T scores and weighted sum, the
/// MLP's GEMMs, the head over the positions it reads; embeddings, norms, softmax and
/// activations not counted — about 1 % for bert-base).
pub fn train_flops_per_sample(cfg: &ModelConfig, seq: usize) -> f64 {
    3.0 * cfg.flop_count().forward_per_sample(seq)
}

/// The device's peak TFLOP/s per precision, and where it came from.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DevicePeak {
    pub device: String,
    pub fp32: Option<f64>,
    pub fp16: Option<f64>,
    pub bf16: Option<f64>,
    /// "theoretical: …" (the formula with its inputs) on the CPU, "table: …" on a GPU, or
    /// why there is none.
    pub source: String,
    /// The best fp32 GEMM measured on the device (CPU), TFLOP/s: a separate figure, never the
    /// denominator of MFU.
    pub gemm_fp32: Option<f64>,
    /// Where `gemm_fp32` comes from.
    pub gemm_source: Option<String>,
    /// The CPU peak's inputs (cores, clocks, lanes, ISA).
    pub inputs: Option<crate::cpu_peak::CpuPeak>,
}

impl DevicePeak {
    pub fn for_precision(&self, precision: &str) -> Option<f64> {
        match precision {
            "fp32" => self.fp32,
            "fp16" => self.fp16,
            "bf16" => self.bf16,
            _ => None,
        }
    }
}

/// Dense (no sparsity) peak TFLOP/s of known accelerators: (name fragment, fp32, fp16, bf16),
/// from the vendors' data sheets. fp32 is the plain FP32 rate, not TF32: libtorch does not
/// use TF32 for matmuls unless told to. AMD's fp32 is the matrix-core rate. The first entry
/// whose fragment the device name contains wins, so specific names come first.
pub const GPU_PEAKS: &[(&str, f64, Option<f64>, Option<f64>)] = &[
    ("H200 NVL", 60.0, Some(835.5), Some(835.5)),
    ("H200", 66.9, Some(989.4), Some(989.4)),
    ("H100 NVL", 60.0, Some(835.5), Some(835.5)),
    ("H100 PCIe", 51.2, Some(756.5), Some(756.5)),
    ("GH200", 66.9, Some(989.4), Some(989.4)),
    ("H100", 66.9, Some(989.4), Some(989.4)),
    ("A100", 19.5, Some(312.0), Some(312.0)),
    ("V100", 15.7, Some(125.0), None),
    ("MI300X", 163.4, Some(1307.4), Some(1307.4)),
    ("MI250X", 95.7, Some(383.0), Some(383.0)),
];

/// Looks a GPU up in [`GPU_PEAKS`] by its name (as nvidia-smi or rocm-smi print it).
pub fn gpu_peak(name: &str) -> Option<DevicePeak> {
    let upper = name.to_ascii_uppercase();
    GPU_PEAKS.iter().find(|(frag, ..)| upper.contains(&frag.to_ascii_uppercase())).map(
        |&(frag, fp32, fp16, bf16)| DevicePeak {
            device: name.to_string(),
            fp32: Some(fp32),
            fp16,
            bf16,
            source: format!("table: {frag} data-sheet peak (dense; fp32 without TF32)"),
            gemm_fp32: None,
            gemm_source: None,
            inputs: None,
        },
    )
}

/// The parity probe's tolerance for a precision: the largest relative difference of the loss
/// or gradient norm from pytorch's that still counts as the same computation.
///
/// fp32: the engine and libtorch sum in different orders (≈ 1e-7 relative per reduction),
/// which a few AdamW steps amplify to ~1e-6 … 1e-5 (measured, README); 1e-3 leaves two
/// orders of margin and still catches any real error (a 2× gradient is a difference of 1).
/// fp16 / bf16: activations and their gradients are rounded to the half dtype at different
/// points (the engine at every op output, autocast at matmul outputs), so the curves differ
/// by a few units of the dtype's rounding error u = 2^-11 / 2^-8: the tolerance is 8·u.
pub fn parity_tol(precision: &str) -> f64 {
    match precision {
        "fp16" => 8.0 * 2f64.powi(-11),
        "bf16" => 8.0 * 2f64.powi(-8),
        _ => 1e-3,
    }
}

/// Fills `speedup` (with its interval), the parity columns and the `diverged` status of every
/// row from the `pytorch` row of the same model, precision and ranks, and for the engine's
/// configs (`ort`, `ort-zero1`) `speedup_vs_torch_compile` (with its interval, computed the
/// same way) from the `torch-compile` row.
///
/// Speedup: the ratio of median step times over the timed runs (each run's steps ≥
/// `row.warmup`), with [`speedup_interval`]. Parity: the probe's (`phase = parity`) loss
/// curve against pytorch's at every common (rank, step), and its gradient norm at the first
/// step; a row that finished becomes `diverged` when either differs by more than `tol` (or
/// [`parity_tol`] of its precision when None). Recomputed on every call, so the order of the
/// runs does not matter.
///
/// Why the gradient norm only at the first step: there both configs differentiate the same
/// weights on the same batch, so the norms differ by summation order alone (measured 2e-4 on
/// bert-base, 8e-5 on gpt2 in fp32). Every later step follows an AdamW update, which moves
/// each weight by about ±lr whatever the size of its gradient, so components whose gradient
/// is summation-order noise get lr-sized, config-dependent updates: correct engines' norms
/// then drift apart (measured up to 5e-3 on gpt2 over 6 steps at lr 1e-3) while their losses
/// stay within 3e-5. A wrongly scaled or unscaled gradient shows from the first step.
pub fn compare_with_baseline(results: &mut [ResultRow], steps: &[StepRow], tol: Option<f64>) {
    let key = |r: &ResultRow| (r.model.clone(), r.precision.clone(), r.ranks);
    let baselines: Vec<ResultRow> =
        results.iter().filter(|r| r.config == "pytorch").cloned().collect();
    let compiled: Vec<ResultRow> =
        results.iter().filter(|r| r.config == "torch-compile").cloned().collect();
    for row in results.iter_mut() {
        let base = baselines.iter().find(|b| key(b) == key(row));
        (row.speedup, row.speedup_lo, row.speedup_hi, row.speedup_significant) =
            base.map_or((None, None, None, None), |b| speedup_over(steps, b, row));
        // The engine's configs against torch.compile too.
        let tc =
            compiled.iter().find(|b| key(b) == key(row)).filter(|_| row.config.starts_with("ort"));
        (
            row.speedup_vs_torch_compile,
            row.speedup_vs_torch_compile_lo,
            row.speedup_vs_torch_compile_hi,
            row.speedup_vs_torch_compile_significant,
        ) = tc.map_or((None, None, None, None), |b| speedup_over(steps, b, row));
        let curve = |r: &ResultRow, f: fn(&StepRow) -> f64| parity_curve(steps, r, f);
        (row.max_loss_rel_diff, row.grad_norm_rel_diff_step0) = match base {
            Some(b) => {
                let first = |c: BTreeMap<(usize, usize), f64>| {
                    c.into_iter().filter(|((_, step), _)| *step == 0).collect::<BTreeMap<_, _>>()
                };
                (
                    max_rel_diff(&curve(b, |s| s.loss), &curve(row, |s| s.loss)),
                    max_rel_diff(
                        &first(curve(b, |s| s.grad_norm)),
                        &first(curve(row, |s| s.grad_norm)),
                    ),
                )
            }
            None => (None, None),
        };
        let tol = tol.unwrap_or_else(|| parity_tol(&row.precision));
        row.parity_tol = (row.max_loss_rel_diff.is_some()
            || row.grad_norm_rel_diff_step0.is_some())
        .then_some(tol);
        // The probe's skipped steps (overflowed gradients) must be pytorch's.
        let skips = |r: &ResultRow| parity_curve(steps, r, |s| s.skipped as u8 as f64);
        let skip_differs = base.and_then(|b| {
            let (a, o) = (skips(b), skips(row));
            a.iter().find(|(k, v)| o.get(k).is_some_and(|w| w != *v)).map(|(k, _)| k.1)
        });
        if row.status == "ok" || row.status == "diverged" && row.error.starts_with("parity probe") {
            let over = |d: Option<f64>| d.is_some_and(|d| d > tol || d.is_nan());
            let diverged = over(row.max_loss_rel_diff) || over(row.grad_norm_rel_diff_step0);
            row.status = if diverged || skip_differs.is_some() { "diverged" } else { "ok" }.into();
            if let Some(step) = skip_differs {
                row.error = format!("parity probe: step {step} was skipped (overflow) by one of this config and pytorch only");
            } else if diverged {
                row.error = format!(
                    "parity probe: loss differs from pytorch's by {} and the first step's gradient norm by {} (relative) > tolerance {tol:.1e}",
                    crate::report::table::rel(row.max_loss_rel_diff),
                    crate::report::table::rel(row.grad_norm_rel_diff_step0),
                );
            } else if row.error.starts_with("parity probe: ") {
                row.error.clear();
            }
        }
    }
}

/// `row`'s speedup over `base` (same model, precision, ranks): the ratio of their median step
/// times pooled over the timed runs, its 95 % interval ([`speedup_interval`], seeded by the
/// pair's names) and whether the interval excludes 1.0; all None unless both were measured.
fn speedup_over(
    steps: &[StepRow],
    base: &ResultRow,
    row: &ResultRow,
) -> (Option<f64>, Option<f64>, Option<f64>, Option<bool>) {
    let (b_runs, runs) = (timed_runs(steps, base), timed_runs(steps, row));
    let measured = |r: &ResultRow| r.step_ms_median.is_some();
    if !(measured(base)
        && measured(row)
        && b_runs.iter().any(|r| !r.is_empty())
        && runs.iter().any(|r| !r.is_empty()))
    {
        return (None, None, None, None);
    }
    let pooled = |runs: &[Vec<f64>]| median(&mut runs.concat());
    let x = pooled(&b_runs) / pooled(&runs);
    // The seed of the pytorch comparison is what it always was (model, config), so earlier
    // intervals reproduce; another baseline's name is mixed in after.
    let mut seed = row
        .model
        .bytes()
        .chain(row.config.bytes())
        .fold(42u64, |h, c| h.wrapping_mul(31).wrapping_add(c as u64));
    if base.config != "pytorch" {
        seed = base.config.bytes().fold(seed, |h, c| h.wrapping_mul(31).wrapping_add(c as u64));
    }
    let enough = |r: &[Vec<f64>]| r.iter().filter(|r| !r.is_empty()).count() >= MIN_INTERVAL_RUNS;
    if !(enough(&b_runs) && enough(&runs)) {
        return (Some(x), None, None, None);
    }
    match speedup_interval(&b_runs, &runs, BOOTSTRAP_RESAMPLES, seed) {
        Some((lo, hi)) => (Some(x), Some(lo), Some(hi), Some(!(lo <= 1.0 && 1.0 <= hi))),
        None => (Some(x), None, None, None),
    }
}

/// Timed runs each side needs for a speedup interval: the bootstrap resamples runs first, and
/// two runs have three distinct resamples — no 95 % interval. Fewer give the ratio alone (the
/// table says `n<3`).
pub const MIN_INTERVAL_RUNS: usize = 3;

/// Each timed run's measured step times (slowest rank per step, steps ≥ the row's warm-up).
pub fn timed_runs(steps: &[StepRow], run: &ResultRow) -> Vec<Vec<f64>> {
    let mut by_repeat: BTreeMap<usize, Vec<StepRow>> = BTreeMap::new();
    for s in steps.iter().filter(|s| {
        s.phase == "timed"
            && s.model == run.model
            && s.config == run.config
            && s.precision == run.precision
            && s.rank < run.ranks
    }) {
        by_repeat.entry(s.repeat).or_default().push(s.clone());
    }
    by_repeat.values().map(|v| step_times(v, run.warmup)).collect()
}

/// A value per (rank, step) of the run's parity probe.
fn parity_curve(
    steps: &[StepRow],
    run: &ResultRow,
    f: fn(&StepRow) -> f64,
) -> BTreeMap<(usize, usize), f64> {
    steps
        .iter()
        .filter(|s| {
            s.phase == "parity"
                && s.model == run.model
                && s.config == run.config
                && s.precision == run.precision
        })
        .filter(|s| s.rank < run.ranks)
        .map(|s| ((s.rank, s.step), f(s)))
        .collect()
}

/// Largest |b − a| / |a| over the keys both curves have; None when they share none. A
/// non-finite loss on one side only counts as NaN (diverged).
pub fn max_rel_diff(
    base: &BTreeMap<(usize, usize), f64>,
    other: &BTreeMap<(usize, usize), f64>,
) -> Option<f64> {
    let mut max: Option<f64> = None;
    for (k, a) in base {
        let Some(b) = other.get(k) else { continue };
        let d = if a == b || !a.is_finite() && !b.is_finite() {
            // Equal, or both not finite (both overflowed at this step: compared as skipped).
            0.0
        } else if !a.is_finite() || !b.is_finite() {
            f64::NAN
        } else {
            (b - a).abs() / a.abs().max(f64::MIN_POSITIVE)
        };
        max = Some(match max {
            None => d,
            Some(m) if m.is_nan() || d.is_nan() => f64::NAN,
            Some(m) => m.max(d),
        });
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(config: &str, rank: usize, step: usize, loss: f64, ms: f64) -> StepRow {
        StepRow {
            model: "m".into(),
            config: config.into(),
            precision: "fp32".into(),
            repeat: 0,
            phase: "timed".into(),
            rank,
            step,
            loss,
            step_ms: ms,
            device_ms: None,
            grad_norm: 1.0,
            loss_scale: 1.0,
            skipped: false,
        }
    }

    #[test]
    fn step_statistics_skip_warmup_and_take_the_slowest_rank() {
        let steps = vec![
            step("ort", 0, 0, 1.0, 100.0),
            step("ort", 0, 1, 1.0, 10.0),
            step("ort", 1, 1, 1.0, 12.0),
            step("ort", 0, 2, 1.0, 20.0),
            step("ort", 0, 3, 1.0, 30.0),
        ];
        let t = step_times(&steps, 1);
        assert_eq!(t, vec![12.0, 20.0, 30.0]);
        let s = step_stats(&t).unwrap();
        assert_eq!((s.median, s.min, s.max), (20.0, 12.0, 30.0));
        assert!((s.p90 - 28.0).abs() < 1e-12);
        let mean = 62.0 / 3.0;
        let std =
            (((12.0f64 - mean).powi(2) + (20.0f64 - mean).powi(2) + (30.0f64 - mean).powi(2))
                / 3.0)
                .sqrt();
        assert!((s.std - std).abs() < 1e-12);
        let mut row = ResultRow {
            batch_size: 4,
            ranks: 2,
            seq_len: 8,
            warmup: 1,
            train_flops_per_sample: Some(1e12),
            hw_flops_per_sample: Some(0.5e12),
            ..Default::default()
        };
        fill_throughput(&mut row, &t, Some(10.0));
        // At the median step time (20 ms): 8 samples per 0.02 s.
        let sps = 4.0 * 2.0 / 0.020;
        assert!((row.samples_per_s.unwrap() - sps).abs() < 1e-9);
        assert!((row.tokens_per_s.unwrap() - 8.0 * sps).abs() < 1e-9);
        assert!((row.tflops.unwrap() - sps).abs() < 1e-9);
        assert!((row.mfu.unwrap() - sps / 10.0).abs() < 1e-9);
        assert!((row.hfu.unwrap() - 0.5 * sps / 10.0).abs() < 1e-9);
    }

    #[test]
    fn flops_of_bert_base_are_about_six_n_per_token() {
        let cfg = ortbench_models::resolve("bert", &ortbench_models::HubOptions::from_env())
            .unwrap()
            .config;
        let per_token = train_flops_per_sample(&cfg, 128) / 128.0;
        // 6·N with N = 109.5 M parameters, of which 23.8 M are embeddings that a look-up does
        // not multiply, and the tied decoder adds them back: the count lands near 6·N.
        let six_n = 6.0 * 109_514_298.0;
        assert!((per_token / six_n - 1.0).abs() < 0.15, "{per_token:e} vs {six_n:e}");
    }

    fn timed(config: &str, repeat: usize, times: &[f64]) -> Vec<StepRow> {
        times
            .iter()
            .enumerate()
            .map(|(k, &ms)| StepRow { repeat, ..step(config, 0, k + 1, 1.0, ms) })
            .collect()
    }

    fn parity(config: &str, losses: &[f64], norms: &[f64]) -> Vec<StepRow> {
        losses
            .iter()
            .zip(norms)
            .enumerate()
            .map(|(k, (&l, &g))| StepRow {
                phase: "parity".into(),
                grad_norm: g,
                ..step(config, 0, k, l, 1.0)
            })
            .collect()
    }

    fn row(config: &str) -> ResultRow {
        ResultRow {
            model: "m".into(),
            config: config.into(),
            precision: "fp32".into(),
            ranks: 1,
            warmup: 1,
            status: "ok".into(),
            step_ms_median: Some(1.0),
            ..Default::default()
        }
    }

    #[test]
    fn speedup_is_the_ratio_of_medians_with_an_interval() {
        let mut steps = Vec::new();
        for r in 0..3 {
            steps.extend(timed("pytorch", r, &[30.0, 31.0, 29.0, 30.5, 29.5]));
            steps.extend(timed("ort", r, &[20.0, 20.5, 19.5, 20.2, 19.8]));
            // Indistinguishable from pytorch: its interval must contain 1.
            steps.extend(timed("ort-zero1", r, &[29.0, 31.5, 30.0, 28.5, 31.0]));
        }
        let mut results = vec![row("pytorch"), row("ort"), row("ort-zero1")];
        compare_with_baseline(&mut results, &steps, None);
        let ort = &results[1];
        assert!((ort.speedup.unwrap() - 30.0 / 20.0).abs() < 1e-12);
        let (lo, hi) = (ort.speedup_lo.unwrap(), ort.speedup_hi.unwrap());
        assert!(lo <= 1.5 && 1.5 <= hi && lo > 1.4 && hi < 1.6, "{lo} {hi}");
        assert_eq!(ort.speedup_significant, Some(true));
        let z = &results[2];
        assert!(
            z.speedup_lo.unwrap() < 1.0 && z.speedup_hi.unwrap() > 1.0,
            "{:?}",
            (z.speedup_lo, z.speedup_hi)
        );
        assert_eq!(z.speedup_significant, Some(false));
        assert_eq!(results[0].speedup, Some(1.0));
        // The same input gives the same interval (seeded bootstrap).
        let again = speedup_interval(
            &timed_runs(&steps, &results[0]),
            &timed_runs(&steps, &results[1]),
            BOOTSTRAP_RESAMPLES,
            7,
        );
        assert_eq!(
            again,
            speedup_interval(
                &timed_runs(&steps, &results[0]),
                &timed_runs(&steps, &results[1]),
                BOOTSTRAP_RESAMPLES,
                7
            )
        );
    }

    #[test]
    fn the_engine_gets_a_second_speedup_over_torch_compile() {
        let mut steps = Vec::new();
        for r in 0..3 {
            steps.extend(timed("pytorch", r, &[30.0, 31.0, 29.0, 30.5, 29.5]));
            steps.extend(timed("torch-compile", r, &[24.0, 24.5, 23.5, 24.2, 23.8]));
            steps.extend(timed("ort", r, &[20.0, 20.5, 19.5, 20.2, 19.8]));
        }
        let mut results = vec![row("pytorch"), row("torch-compile"), row("ort")];
        compare_with_baseline(&mut results, &steps, None);
        let (tc, ort) = (&results[1], &results[2]);
        assert!((tc.speedup.unwrap() - 30.0 / 24.0).abs() < 1e-12);
        assert!((ort.speedup_vs_torch_compile.unwrap() - 24.0 / 20.0).abs() < 1e-12);
        let (lo, hi) =
            (ort.speedup_vs_torch_compile_lo.unwrap(), ort.speedup_vs_torch_compile_hi.unwrap());
        assert!(lo <= 1.2 && 1.2 <= hi && lo > 1.1 && hi < 1.3, "{lo} {hi}");
        assert_eq!(ort.speedup_vs_torch_compile_significant, Some(true));
        // Only the engine's configs are compared with torch-compile.
        assert_eq!(
            (results[0].speedup_vs_torch_compile, tc.speedup_vs_torch_compile),
            (None, None)
        );
        // Without a torch-compile row there is no second speedup.
        let mut two = vec![row("pytorch"), row("ort")];
        compare_with_baseline(&mut two, &steps, None);
        assert_eq!(two[1].speedup_vs_torch_compile, None);
        assert!(two[1].speedup.is_some());
    }

    #[test]
    fn a_drifting_run_widens_the_interval() {
        // Run-to-run drift (the third run of ort 30 % slower) must show in the interval:
        // resampling only pooled steps would call 1.3× a tight result.
        let base = vec![vec![30.0; 5], vec![30.0; 5], vec![30.0; 5]];
        let drift = vec![vec![20.0; 5], vec![20.0; 5], vec![26.0; 5]];
        let (lo, hi) = speedup_interval(&base, &drift, BOOTSTRAP_RESAMPLES, 1).unwrap();
        assert!(lo < 1.2 && hi >= 1.5, "{lo} {hi}");
    }

    /// Two runs a side give the ratio without an interval (the bootstrap over two runs has
    /// three distinct top-level resamples); three give one.
    #[test]
    fn fewer_than_three_runs_give_no_interval() {
        for (runs, interval) in [(1, false), (2, false), (3, true)] {
            let mut steps = Vec::new();
            for r in 0..runs {
                steps.extend(timed("pytorch", r, &[30.0, 31.0, 29.0, 30.5, 29.5]));
                steps.extend(timed("ort", r, &[20.0, 20.5, 19.5, 20.2, 19.8]));
            }
            let mut results = vec![row("pytorch"), row("ort")];
            compare_with_baseline(&mut results, &steps, None);
            let ort = &results[1];
            assert!((ort.speedup.unwrap() - 1.5).abs() < 1e-12, "{runs} runs");
            assert_eq!(ort.speedup_lo.is_some(), interval, "{runs} runs: {:?}", ort.speedup_lo);
            assert_eq!(ort.speedup_hi.is_some(), interval, "{runs} runs");
            assert_eq!(ort.speedup_significant.is_some(), interval, "{runs} runs");
        }
    }

    /// Mostly skipped steps, or a non-finite final loss, make a finished run `diverged`; a
    /// skipped step's time is left out of the step times.
    #[test]
    fn a_run_of_skipped_steps_is_not_ok_and_its_skipped_steps_are_not_timed() {
        let run = |skips: &[bool], last_loss: f64| -> Vec<StepRow> {
            let n = skips.len();
            skips
                .iter()
                .enumerate()
                .map(|(k, &sk)| {
                    let loss = if sk {
                        f64::NAN
                    } else if k + 1 == n {
                        last_loss
                    } else {
                        2.0
                    };
                    StepRow {
                        skipped: sk,
                        loss_scale: 65536.0 / 2f64.powi(k as i32),
                        ..step("ort", 0, k, loss, if sk { 5.0 } else { 10.0 })
                    }
                })
                .collect()
        };
        let most = run(&[false, true, true, true, true, true, true, true], 2.0);
        let why = step_status(&most, 0).unwrap();
        assert!(why.starts_with("7 of 8 timed steps skipped"), "{why}");
        assert_eq!(step_times(&most, 0), vec![10.0]);
        // Half skipped, the last not: trained (the scaler found its scale).
        assert_eq!(step_status(&run(&[true, true, false, false], 2.0), 0), None);
        // The warm-up does not count.
        assert!(step_status(&run(&[true, true, true, false, false, false], 2.0), 3).is_none());
        let nan = step_status(&run(&[false, false, false, false], f64::NAN), 0).unwrap();
        assert!(nan.starts_with("final loss NaN at step 3"), "{nan}");
    }

    /// The parity probe compares which steps were skipped: the same overflow on both sides is
    /// no difference, one side's only is `diverged`.
    #[test]
    fn parity_compares_the_skipped_steps() {
        let skip = |c: &str, at: Option<usize>| -> Vec<StepRow> {
            parity(c, &[10.0, 9.0, 8.0], &[2.0, 1.5, 1.2])
                .into_iter()
                .map(|s| {
                    let sk = Some(s.step) == at;
                    StepRow { skipped: sk, loss: if sk { f64::NAN } else { s.loss }, ..s }
                })
                .collect()
        };
        let mut steps = skip("pytorch", Some(1));
        steps.extend(skip("ort", Some(1)));
        steps.extend(skip("ort-zero1", Some(2)));
        let mut results = vec![row("pytorch"), row("ort"), row("ort-zero1")];
        compare_with_baseline(&mut results, &steps, None);
        assert_eq!(results[1].status, "ok", "{}", results[1].error);
        assert_eq!(results[1].max_loss_rel_diff, Some(0.0));
        assert_eq!(results[2].status, "diverged");
        assert!(results[2].error.contains("step 1 was skipped"), "{}", results[2].error);
    }

    #[test]
    fn parity_flags_the_loss_and_the_gradient_norm() {
        let mut steps = parity("pytorch", &[10.0, 9.0, 8.0], &[2.0, 1.5, 1.2]);
        // After the first update, gradient norms of correct engines drift apart (AdamW): only
        // the first step's norm is held to the tolerance.
        steps.extend(parity("ort", &[10.0, 9.000001, 8.000002], &[2.0, 1.51, 1.2]));
        // AdamW hides a doubled gradient from the loss almost entirely; the norm shows it.
        steps.extend(parity("ort-zero1", &[10.0, 9.0, 8.0], &[4.0, 3.0, 2.4]));
        let mut results = vec![row("ort"), row("pytorch"), row("ort-zero1")];
        compare_with_baseline(&mut results, &steps, None);
        assert_eq!(results[1].max_loss_rel_diff, Some(0.0));
        assert!((results[0].max_loss_rel_diff.unwrap() - 2.5e-7).abs() < 1e-9);
        assert_eq!(results[0].status, "ok");
        assert_eq!(results[0].grad_norm_rel_diff_step0, Some(0.0));
        assert_eq!(results[0].parity_tol, Some(1e-3));
        assert_eq!(results[2].max_loss_rel_diff, Some(0.0));
        assert_eq!(results[2].grad_norm_rel_diff_step0, Some(1.0));
        assert_eq!(results[2].status, "diverged");
        assert!(results[2].error.contains("gradient norm"), "{}", results[2].error);
        // An explicit tolerance overrides the precision's; the verdict is recomputed.
        compare_with_baseline(&mut results, &steps, Some(2.0));
        assert_eq!(results[2].status, "ok");
        assert!(results[2].error.is_empty());
        // Tolerances follow the precision's rounding error.
        assert!(parity_tol("fp32") < parity_tol("fp16") && parity_tol("fp16") < parity_tol("bf16"));
    }

    #[test]
    fn gpu_names_find_their_peaks() {
        assert_eq!(gpu_peak("NVIDIA H100 PCIe").unwrap().bf16, Some(756.5));
        assert_eq!(gpu_peak("NVIDIA H100 80GB HBM3").unwrap().bf16, Some(989.4));
        assert_eq!(gpu_peak("NVIDIA H200").unwrap().fp32, Some(66.9));
        assert_eq!(gpu_peak("Tesla V100-SXM2-16GB").unwrap().bf16, None);
        assert_eq!(gpu_peak("AMD Instinct MI300X").unwrap().fp16, Some(1307.4));
        assert!(gpu_peak("NVIDIA GeForce GTX 1080").is_none());
    }
}
