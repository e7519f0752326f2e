//! The device's theoretical peak that MFU and HFU are measured against: a GPU's data-sheet
//! figure, or the CPU's from its measured clock and vector width (re-measured when a run's
//! utilisation passes it).

use super::CPU_PEAK_VAR;
use crate::metrics::{gpu_peak, DevicePeak};
use crate::output::ResultRow;

/// Rows past the theoretical peak: a warning when what ran (HFU) passes it — one of the peak's
/// inputs is wrong —, a note when only MFU does (the model's FLOPs as HF computes them, more
/// than a config that skips work ran).
pub(super) fn say_utilisation_past_peak(results: &[ResultRow], peak: &DevicePeak) {
    for r in results {
        let (mfu, hfu) = (r.mfu.unwrap_or(0.0), r.hfu.unwrap_or(0.0));
        if hfu > 1.0 || (r.hfu.is_none() && mfu > 1.0) {
            // The peak is an upper bound by construction; past it with the FLOPs that ran, one
            // of its inputs is wrong.
            eprintln!("ortbench: warning: {} {} executes {:.0} % of the theoretical peak: the peak's inputs ({}) are too low", r.model, r.config, 100.0 * hfu.max(mfu), peak.source);
        } else if mfu > 1.0 {
            // MFU counts the model's FLOPs as HF computes them; a config that skips work (the
            // MLM head's unlabelled rows, masked causal blocks) can pass 100 % with them while
            // what ran (HFU) does not.
            eprintln!("ortbench: note: {} {}: MFU {:.0} % counts the model's FLOPs as HF computes them (the LM head over every position); this config ran fewer (HFU {:.0} %: the work it skips, such as the MLM head's unlabelled rows, README \"row skip\")", r.model, r.config, 100.0 * mfu, 100.0 * hfu);
        }
    }
}

/// The device's peak: on the CPU the theoretical peak of the cores the runs use
/// ([`crate::cpu_peak`]), with the best fp32 GEMM of the engine's provider measured beside it
/// (a separate column); the data-sheet table of known GPUs otherwise.
pub(super) fn device_peak(device: &str) -> DevicePeak {
    if device == "cpu" {
        let threads = ortbench_engine::backend::cpu::gemm::num_threads();
        let theory = crate::cpu_peak::cpu_peak(threads);
        let (gemm, gemm_source) = match std::env::var(CPU_PEAK_VAR)
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
        {
            Some(g) => (Some(g / 1e3), format!("given: {CPU_PEAK_VAR}={g}")),
            None => {
                eprintln!("ortbench: measuring the CPU's best fp32 GEMM ({threads} threads, ~2 s)");
                match crate::cpu_peak::measure_peak_gflops(0) {
                    Ok(g) => {
                        let provider = ortbench_engine::backend::cpu::gemm::provider()
                            .map(|p| p.kind().name())
                            .unwrap_or("?");
                        (Some(g / 1e3), format!("measured: best fp32 sgemm 8192×768×3072 on {threads} threads ({provider})"))
                    }
                    Err(e) => (None, format!("not measured: {e}")),
                }
            }
        };
        DevicePeak {
            device: "cpu".into(),
            fp32: Some(theory.fp32),
            fp16: Some(theory.fp16),
            bf16: Some(theory.bf16),
            source: format!("theoretical: {}", theory.formula),
            gemm_fp32: gemm,
            gemm_source: Some(gemm_source),
            inputs: Some(theory),
        }
    } else {
        let index = device.strip_prefix("cuda:").and_then(|i| i.parse::<usize>().ok()).unwrap_or(0);
        let names = crate::env::gpu_names();
        let none = |device: String, source: String| DevicePeak {
            device,
            fp32: None,
            fp16: None,
            bf16: None,
            source,
            gemm_fp32: None,
            gemm_source: None,
            inputs: None,
        };
        match names.get(index) {
            Some(name) => gpu_peak(name).unwrap_or_else(|| {
                none(name.clone(), format!("'{name}' is not in the table of known GPUs: no MFU"))
            }),
            None => {
                none(device.into(), "no GPU name (nvidia-smi / rocm-smi not found): no MFU".into())
            }
        }
    }
}

/// On the CPU (unless the GEMM figure was given), measures the best GEMM again after the
/// runs; Some when it came out higher than before.
pub(super) fn remeasure_cpu_peak(first: &DevicePeak) -> Option<DevicePeak> {
    if first.device != "cpu"
        || !first.gemm_source.as_deref().is_some_and(|s| s.starts_with("measured"))
    {
        return None;
    }
    let g = crate::cpu_peak::measure_peak_gflops(0).ok()? / 1e3;
    if g <= first.gemm_fp32.unwrap_or(0.0) {
        return None;
    }
    eprintln!("ortbench: the best GEMM measured after the runs is higher ({g:.3} TFLOP/s)");
    Some(DevicePeak {
        gemm_fp32: Some(g),
        gemm_source: first
            .gemm_source
            .as_ref()
            .map(|s| format!("{s} (best of a measurement before and one after the runs)")),
        ..first.clone()
    })
}

pub(super) fn describe_peak(p: &DevicePeak) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |t| format!("{t:.2}"));
    let gemm =
        p.gemm_fp32.map_or(String::new(), |g| format!("; best measured fp32 GEMM {g:.3} TFLOP/s"));
    format!(
        "{} peak fp32 {} / fp16 {} / bf16 {} TFLOP/s ({}){gemm}",
        p.device,
        f(p.fp32),
        f(p.fp16),
        f(p.bf16),
        p.source
    )
}
