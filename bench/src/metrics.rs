//! What a run's records become: step-time statistics, throughput, achieved FLOP/s and MFU,
//! and the comparison of each config with the `pytorch` baseline (speedup, loss parity).

use std::collections::BTreeMap;

use ortbench_models::config::{Architecture, ModelConfig};
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

/// Step times of one run per step (the slowest rank), for steps ≥ `warmup`.
pub fn step_times(steps: &[StepRow], warmup: usize) -> Vec<f64> {
    let mut per_step: BTreeMap<usize, f64> = BTreeMap::new();
    for s in steps.iter().filter(|s| s.step >= warmup) {
        let e = per_step.entry(s.step).or_insert(0.0);
        *e = e.max(s.step_ms);
    }
    per_step.into_values().collect()
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

/// Fills a finished run's throughput columns from its step records: samples/s over the
/// measured steps (global batch = batch_size × ranks), tokens/s, step-time statistics, and
/// TFLOP/s and MFU when the FLOP count and the peak are known.
pub fn fill_throughput(row: &mut ResultRow, steps: &[StepRow], peak_tflops: Option<f64>) {
    let Some(st) = step_stats(&step_times(steps, row.warmup)) else { return };
    let samples = (row.batch_size * row.ranks * st.count) as f64;
    let sps = samples / (st.total_ms / 1e3);
    row.samples_per_s = Some(sps);
    row.tokens_per_s = Some(sps * row.seq_len as f64);
    row.step_ms_median = Some(st.median);
    row.step_ms_p90 = Some(st.p90);
    row.step_ms_min = Some(st.min);
    row.step_ms_max = Some(st.max);
    row.step_ms_std = Some(st.std);
    row.tflops = row.train_flops_per_sample.map(|f| f * sps / 1e12);
    row.peak_tflops = peak_tflops;
    row.mfu = match (row.tflops, peak_tflops) {
        (Some(t), Some(p)) if p > 0.0 => Some(t / p),
        _ => None,
    };
}

/// Analytic training FLOPs of one sample of `seq` tokens: 3 × the forward pass's matmul
/// FLOPs (the backward pass computes two matmuls per forward matmul: the gradients of the
/// input and of the weight). Counted per layer, 2·m·n·k per matmul:
///
/// - attention: Q, K, V and output projections (4 · 2·T·H²), scores Q·Kᵀ and the weighted
///   sum with V (2 · 2·T²·H) — full T×T even for causal GPT-2, as eager attention computes it;
/// - MLP: 2 · 2·T·H·I;
/// - head: BERT MLM's transform (2·T·H²) and decoder (2·T·H·V), GPT-2's LM head (2·T·H·V),
///   both over every position as HF computes them; BERT classification: pooler and
///   classifier on the first token only.
///
/// Embedding look-ups, LayerNorm, softmax, GELU, dropout and the optimizer are not counted
/// (they are O(T·H), not O(T·H²)); with them the count is about 1 % higher for bert-base.
pub fn train_flops_per_sample(cfg: &ModelConfig, seq: usize) -> f64 {
    let (t, h, i, l, v) = (
        seq as f64,
        cfg.hidden_size() as f64,
        cfg.intermediate_size() as f64,
        cfg.num_layers() as f64,
        cfg.vocab_size() as f64,
    );
    let attention = 4.0 * 2.0 * t * h * h + 2.0 * 2.0 * t * t * h;
    let mlp = 2.0 * 2.0 * t * h * i;
    let head = match cfg.arch {
        Architecture::BertForMaskedLM => 2.0 * t * h * h + 2.0 * t * h * v,
        Architecture::Gpt2LMHeadModel => 2.0 * t * h * v,
        Architecture::BertForSequenceClassification => {
            let labels = match &cfg.family {
                ortbench_models::config::Family::Bert(b) => b.num_labels as f64,
                _ => 2.0,
            };
            2.0 * h * h + 2.0 * h * labels
        }
    };
    3.0 * (l * (attention + mlp) + head)
}

/// The device's peak TFLOP/s per precision, and where it came from.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DevicePeak {
    pub device: String,
    pub fp32: Option<f64>,
    pub fp16: Option<f64>,
    pub bf16: Option<f64>,
    /// "measured: …" on the CPU, "table: …" on a GPU, or why there is none.
    pub source: String,
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
    GPU_PEAKS.iter().find(|(frag, ..)| upper.contains(&frag.to_ascii_uppercase())).map(|&(frag, fp32, fp16, bf16)| DevicePeak {
        device: name.to_string(),
        fp32: Some(fp32),
        fp16,
        bf16,
        source: format!("table: {frag} data-sheet peak (dense; fp32 without TF32)"),
    })
}

/// Fills `speedup`, `max_loss_rel_diff` and the `diverged` status of every row from the
/// `pytorch` row of the same model, precision and ranks. A row that finished (`ok`) becomes
/// `diverged` when its loss curve differs from the baseline's by more than `tol` (relative)
/// at any common (rank, step); the check is recomputed on every call, so the order of the
/// runs does not matter.
pub fn compare_with_baseline(results: &mut [ResultRow], steps: &[StepRow], tol: f64) {
    let key = |r: &ResultRow| (r.model.clone(), r.precision.clone(), r.ranks);
    let baselines: Vec<ResultRow> = results.iter().filter(|r| r.config == "pytorch").cloned().collect();
    for row in results.iter_mut() {
        let base = baselines.iter().find(|b| key(b) == key(row));
        row.speedup = match (base.and_then(|b| b.samples_per_s), row.samples_per_s) {
            (Some(b), Some(s)) if b > 0.0 => Some(s / b),
            _ => None,
        };
        row.max_loss_rel_diff = match base {
            Some(b) => max_rel_diff(&losses(steps, b), &losses(steps, row)),
            None => None,
        };
        if row.status == "ok" || row.status == "diverged" {
            let diverged = row.max_loss_rel_diff.is_some_and(|d| d > tol || d.is_nan());
            row.status = if diverged { "diverged" } else { "ok" }.into();
            if diverged {
                row.error = format!(
                    "loss curve differs from pytorch's by {:.3e} (relative) > --diverge-tol {tol}",
                    row.max_loss_rel_diff.unwrap_or(f64::NAN)
                );
            } else if row.error.starts_with("loss curve differs") {
                row.error.clear();
            }
        }
    }
}

fn losses(steps: &[StepRow], run: &ResultRow) -> BTreeMap<(usize, usize), f64> {
    steps
        .iter()
        .filter(|s| s.model == run.model && s.config == run.config && s.precision == run.precision)
        .filter(|s| s.rank < run.ranks)
        .map(|s| ((s.rank, s.step), s.loss))
        .collect()
}

/// Largest |b − a| / |a| over the keys both curves have; None when they share none. A
/// non-finite loss on one side only counts as NaN (diverged).
pub fn max_rel_diff(base: &BTreeMap<(usize, usize), f64>, other: &BTreeMap<(usize, usize), f64>) -> Option<f64> {
    let mut max: Option<f64> = None;
    for (k, a) in base {
        let Some(b) = other.get(k) else { continue };
        let d = if a == b {
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
            rank,
            step,
            loss,
            step_ms: ms,
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
        let std = (((12.0f64 - mean).powi(2) + (20.0f64 - mean).powi(2) + (30.0f64 - mean).powi(2)) / 3.0).sqrt();
        assert!((s.std - std).abs() < 1e-12);
        let mut row = ResultRow { batch_size: 4, ranks: 2, seq_len: 8, warmup: 1, train_flops_per_sample: Some(1e12), ..Default::default() };
        fill_throughput(&mut row, &steps, Some(10.0));
        let sps = 4.0 * 2.0 * 3.0 / 0.062;
        assert!((row.samples_per_s.unwrap() - sps).abs() < 1e-9);
        assert!((row.tokens_per_s.unwrap() - 8.0 * sps).abs() < 1e-9);
        assert!((row.tflops.unwrap() - sps).abs() < 1e-9);
        assert!((row.mfu.unwrap() - sps / 10.0).abs() < 1e-9);
    }

    #[test]
    fn flops_of_bert_base_are_about_six_n_per_token() {
        let cfg = ortbench_models::resolve("bert", &ortbench_models::HubOptions::from_env()).unwrap().config;
        let per_token = train_flops_per_sample(&cfg, 128) / 128.0;
        // 6·N with N = 109.5 M parameters, of which 23.8 M are embeddings that a look-up does
        // not multiply, and the tied decoder adds them back: the count lands near 6·N.
        let six_n = 6.0 * 109_514_298.0;
        assert!((per_token / six_n - 1.0).abs() < 0.15, "{per_token:e} vs {six_n:e}");
    }

    #[test]
    fn speedup_and_loss_parity_against_pytorch() {
        let row = |config: &str, sps: f64| ResultRow {
            model: "m".into(),
            config: config.into(),
            precision: "fp32".into(),
            ranks: 1,
            status: "ok".into(),
            samples_per_s: Some(sps),
            ..Default::default()
        };
        let mut results = vec![row("ort", 30.0), row("pytorch", 20.0), row("ort-zero1", 10.0)];
        let steps = vec![
            step("pytorch", 0, 0, 10.0, 1.0),
            step("pytorch", 0, 1, 8.0, 1.0),
            step("ort", 0, 0, 10.0, 1.0),
            step("ort", 0, 1, 8.04, 1.0),
            step("ort-zero1", 0, 0, 10.0, 1.0),
            step("ort-zero1", 0, 1, 9.0, 1.0),
        ];
        compare_with_baseline(&mut results, &steps, 0.05);
        assert_eq!(results[1].speedup, Some(1.0));
        assert_eq!(results[0].speedup, Some(1.5));
        assert_eq!(results[1].max_loss_rel_diff, Some(0.0));
        assert!((results[0].max_loss_rel_diff.unwrap() - 0.005).abs() < 1e-12);
        assert_eq!(results[0].status, "ok");
        assert_eq!(results[2].status, "diverged");
        assert!(results[2].error.contains("--diverge-tol"));
        // A looser tolerance turns it back.
        compare_with_baseline(&mut results, &steps, 0.2);
        assert_eq!(results[2].status, "ok");
        assert!(results[2].error.is_empty());
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
