//! The CPU's theoretical peak FLOP/s: cores × clock × fp32 FMA lanes per cycle × 2.
//!
//! MFU needs a peak that nothing can exceed, so it is computed, not measured: a measured GEMM
//! is a fine figure of what a GEMM reaches (kept as a separate column), but as a denominator it
//! lets a good step time read above 100 %. Inputs, each recorded in run.json:
//!
//! - **cores**: the threads the runs may use (`available_parallelism`, which honours affinity
//!   and cgroup quotas). SMT siblings count as cores, which can only raise the peak.
//! - **clock**: the largest of the nominal clock (`/proc/cpuinfo`'s "cpu MHz", or the "@ X GHz"
//!   of the model name), cpufreq's maximum (`cpuinfo_max_freq` / `scaling_max_freq`, where the
//!   machine exposes them) and the clock measured by timing a chain of dependent 64-bit `imul`s
//!   (3 cycles each on every x86 core since Nehalem and Zen, Agner Fog's tables). A chain of
//!   `add reg, 1` no longer serves: Golden Cove and later Intel cores (Sapphire Rapids) fold
//!   such adds at register rename, several per cycle, and it read 19.3 GHz on a 2.6 GHz Xeon;
//!   a multiply is no rename-time operation. The measurement sees turbo clocks that `cpu MHz`
//!   inside a VM does not. A measured clock outside 0.5–6.5 GHz, or more than 10 % above
//!   cpufreq's maximum, is discarded — never used — with the reason in run.json
//!   (`clock_rejected`).
//! - **fp32 FMA lanes per cycle** (per core), from the ISA and vendor: 2 FMA pipes × 16 lanes
//!   with AVX-512 on Intel and on AMD family 0x1A (Zen 5), 2 × 8 with AVX-512 on AMD family
//!   0x19 (Zen 4 executes 512-bit FMAs as two 256-bit halves), 2 × 8 with AVX2 + FMA, 2 × 4
//!   otherwise. Two pipes is the most any of these cores has (some Xeon Silver/Bronze parts
//!   have one 512-bit pipe: their peak is then overstated, never understated).
//! - **bf16 / fp16** ([`half_peaks`]): the fp32 peak, twice it with AVX512_BF16 (`vdpbf16ps`)
//!   or AVX512_FP16, and AMX's tile multiply where the CPU has AMX-BF16 / AMX-FP16 and the
//!   kernel grants the process its tile state: `tdpbf16ps` multiplies a 16 × 32 by a 32 × 16
//!   tile (8192 FMAs) and issues once every 16 cycles on Sapphire Rapids — 1024 FLOP per cycle
//!   per core (Intel's optimization reference manual, ch. "Intel AMX"; uops.info), 16× the
//!   AVX-512 fp32 rate. libtorch's oneDNN multiplies bf16 on AMX by default, as HF users run it.

use serde::Serialize;

/// The computed peak and its inputs.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CpuPeak {
    pub cores: usize,
    pub nominal_ghz: Option<f64>,
    /// cpufreq's maximum clock, where the machine exposes it.
    pub cpufreq_max_ghz: Option<f64>,
    pub measured_ghz: Option<f64>,
    /// Why the measured clock was discarded, if it was ([`choose_clock`]).
    pub clock_rejected: Option<String>,
    /// The clock used: the largest of the accepted ones.
    pub ghz: f64,
    pub fma_lanes_per_cycle: usize,
    pub isa: String,
    /// TFLOP/s.
    pub fp32: f64,
    pub bf16: f64,
    pub fp16: f64,
    /// AMX as the bf16 / fp16 peaks count it, or why they do not (None: no AMX on this CPU).
    pub amx: Option<String>,
    pub formula: String,
}

/// The fp32 FMA lanes one core retires per cycle, and the ISA it was derived from.
pub fn fma_lanes(vendor: &str, family: u32, flags: &[&str]) -> (usize, String) {
    let has = |f: &str| flags.contains(&f);
    if has("avx512f") {
        if vendor == "AuthenticAMD" && family < 0x1A {
            (16, format!("AVX-512 on AMD family {family:#x} (2 × 256-bit FMA pipes)"))
        } else {
            (32, "AVX-512 (2 × 512-bit FMA pipes)".into())
        }
    } else if has("avx2") && has("fma") {
        (16, "AVX2 + FMA (2 × 256-bit FMA pipes)".into())
    } else if cfg!(target_arch = "aarch64") {
        // Neoverse V1/V2: 4 × 128-bit (or 2 × 256-bit SVE) FMA pipes.
        (16, "aarch64 (4 × 128-bit FMA pipes assumed)".into())
    } else {
        (8, "SSE (2 × 128-bit pipes)".into())
    }
}

/// Peak TFLOP/s from its inputs.
pub fn peak_tflops(cores: usize, ghz: f64, lanes: usize) -> f64 {
    cores as f64 * ghz * lanes as f64 * 2.0 / 1e3
}

/// FLOP per cycle per core of AMX's tile multiply in bf16 or fp16 (module comment).
pub const AMX_FLOP_PER_CYCLE: f64 = 1024.0;

/// The bf16 and fp16 peaks (TFLOP/s) from the fp32 peak, the CPU's flags and whether the
/// kernel grants AMX's tile state; with the formula's words for them and the AMX note.
pub fn half_peaks(
    fp32: f64,
    cores: usize,
    ghz: f64,
    flags: &[&str],
    amx_granted: bool,
) -> (f64, f64, String, Option<String>) {
    let has = |f: &str| flags.contains(&f);
    let amx = cores as f64 * ghz * AMX_FLOP_PER_CYCLE / 1e3;
    let amx_words =
        format!("AMX: {cores} cores × {ghz:.2} GHz × {AMX_FLOP_PER_CYCLE} FLOP/cycle = {amx:.2}");
    let peak = |amx_flag: &str, avx_flag: &str, avx_words: &str| {
        if has(amx_flag) && amx_granted {
            (amx, amx_words.clone())
        } else if has(avx_flag) {
            (2.0 * fp32, format!("2 × fp32 ({avx_words})"))
        } else {
            (fp32, "as fp32".into())
        }
    };
    let (bf16, bf16_words) = peak("amx_bf16", "avx512_bf16", "AVX512_BF16");
    let (fp16, fp16_words) = peak("amx_fp16", "avx512_fp16", "AVX512_FP16");
    let note = (has("amx_bf16") || has("amx_fp16")).then(|| {
        if amx_granted {
            format!("counted: {amx_words} TFLOP/s (amx_bf16: {}, amx_fp16: {})", has("amx_bf16"), has("amx_fp16"))
        } else {
            "not counted: the kernel does not grant AMX's tile data (arch_prctl ARCH_GET_XCOMP_SUPP), so nothing can run it".into()
        }
    });
    (bf16, fp16, format!("bf16 {bf16:.2} ({bf16_words}), fp16 {fp16:.2} ({fp16_words})"), note)
}

/// Whether the kernel supports AMX's tile data for this process's requests
/// (`ARCH_GET_XCOMP_SUPP` includes `XFEATURE_XTILEDATA`, Linux 5.16 and later): oneDNN asks
/// for it (`ARCH_REQ_XCOMP_PERM`) before its first AMX instruction.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub fn amx_granted() -> bool {
    const ARCH_GET_XCOMP_SUPP: libc::c_long = 0x1021; // asm/prctl.h (0x1022 is the permission held)
    const XFEATURE_XTILEDATA: u32 = 18;
    let mut mask: u64 = 0;
    // SAFETY: the syscall writes one u64 through the pointer it is given.
    let rc =
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_GET_XCOMP_SUPP, &mut mask as *mut u64) };
    rc == 0 && mask & (1 << XFEATURE_XTILEDATA) != 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
pub fn amx_granted() -> bool {
    false
}

/// The nominal clock in GHz from /proc/cpuinfo: "cpu MHz", else the model name's "@ 2.10GHz".
pub fn nominal_ghz(cpuinfo: &str) -> Option<f64> {
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let mhz = field("cpu MHz").and_then(|v| v.parse::<f64>().ok()).map(|m| m / 1e3);
    let named = field("model name").and_then(|n| {
        let at = n.rsplit_once('@')?.1.trim().to_ascii_lowercase();
        at.strip_suffix("ghz")?.trim().parse::<f64>().ok()
    });
    match (mhz, named) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// cpufreq's maximum clock of cpu0 in GHz (`cpuinfo_max_freq`, else `scaling_max_freq`, in
/// kHz), where the machine exposes it (VMs often do not).
pub fn cpufreq_max_ghz() -> Option<f64> {
    ["cpuinfo_max_freq", "scaling_max_freq"].iter().find_map(|f| {
        let p = format!("/sys/devices/system/cpu/cpu0/cpufreq/{f}");
        let khz: f64 = std::fs::read_to_string(p).ok()?.trim().parse().ok()?;
        (khz > 0.0).then_some(khz / 1e6)
    })
}

/// The clocks a measurement must fall within to be believed, GHz.
pub const PLAUSIBLE_GHZ: (f64, f64) = (0.5, 6.5);

/// The clock of the peak formula: the largest of the nominal clock, cpufreq's maximum and the
/// measured clock — the latter only when plausible (within [`PLAUSIBLE_GHZ`] and at most 10 %
/// above cpufreq's maximum, where known). Returns the clock and, when the measurement was
/// discarded, why.
pub fn choose_clock(
    nominal: Option<f64>,
    cpufreq_max: Option<f64>,
    measured: Option<f64>,
) -> (f64, Option<String>) {
    let (lo, hi) = PLAUSIBLE_GHZ;
    let rejected = measured.and_then(|m| {
        if !(lo..=hi).contains(&m) {
            Some(format!("measured {m:.2} GHz is outside {lo}–{hi} GHz: a clock no core runs at (a chain the core shortcut?)"))
        } else {
            cpufreq_max.filter(|&max| m > 1.1 * max).map(|max| {
                format!("measured {m:.2} GHz is more than 10 % above cpufreq's maximum {max:.2} GHz")
            })
        }
    });
    let accepted = measured.filter(|_| rejected.is_none());
    let ghz = [nominal, cpufreq_max, accepted].into_iter().flatten().fold(0.0, f64::max);
    (ghz, rejected)
}

/// The core clock in GHz, measured by timing a chain of dependent 64-bit multiplies, 3 cycles
/// each (module comment); best of several ~20-ms trials: interruptions only ever make a trial
/// slower.
#[cfg(target_arch = "x86_64")]
pub fn measure_ghz() -> Option<f64> {
    const ITERS: u64 = 1_000_000; // × 8 imuls × 3 cycles ≈ 24 M cycles ≈ 10–20 ms
    const CYCLES_PER_IMUL: f64 = 3.0;
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t0 = std::time::Instant::now();
        let mut x: u64 = 3;
        let mut n = ITERS;
        // SAFETY: register-only arithmetic; no memory is touched.
        unsafe {
            std::arch::asm!(
                "2:",
                "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}",
                "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}",
                "dec {n}",
                "jnz 2b",
                x = inout(reg) x,
                n = inout(reg) n,
                options(nomem, nostack),
            );
        }
        std::hint::black_box((x, n));
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (best > 0.0).then(|| 8.0 * CYCLES_PER_IMUL * ITERS as f64 / best / 1e9)
}

#[cfg(not(target_arch = "x86_64"))]
pub fn measure_ghz() -> Option<f64> {
    None
}

/// This machine's peak for `cores` threads.
pub fn cpu_peak(cores: usize) -> CpuPeak {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let vendor = field("vendor_id");
    let family = field("cpu family").parse::<u32>().unwrap_or(0);
    let flags_line = field("flags");
    let flags: Vec<&str> = flags_line.split_whitespace().collect();
    let (lanes, isa) = fma_lanes(&vendor, family, &flags);
    let nominal = nominal_ghz(&cpuinfo);
    let cpufreq_max = cpufreq_max_ghz();
    let measured = measure_ghz();
    let (ghz, clock_rejected) = choose_clock(nominal, cpufreq_max, measured);
    let fp32 = peak_tflops(cores, ghz, lanes);
    let (bf16, fp16, half_words, amx) = half_peaks(fp32, cores, ghz, &flags, amx_granted());
    let g = |v: Option<f64>| v.map_or("?".into(), |g| format!("{g:.2}"));
    let formula = format!(
        "{cores} cores × {ghz:.2} GHz (max of nominal {}, cpufreq max {} and measured {}{}) × {lanes} fp32 FMA lanes/cycle ({isa}) × 2 FLOP = {:.3} TFLOP/s fp32; {half_words}",
        g(nominal),
        g(cpufreq_max),
        g(measured),
        if clock_rejected.is_some() { ", discarded" } else { "" },
        fp32
    );
    CpuPeak {
        cores,
        nominal_ghz: nominal,
        cpufreq_max_ghz: cpufreq_max,
        measured_ghz: measured,
        clock_rejected,
        ghz,
        fma_lanes_per_cycle: lanes,
        isa,
        fp32,
        bf16,
        fp16,
        amx,
        formula,
    }
}

// ---------------------------------------------------------------- measured GEMM peak
// The best fp32 GEMM the engine's provider reaches here: a column of its own in results (never
// the MFU denominator, which is the theoretical peak above). Measuring belongs to the harness;
// the engine only provides the GEMM.

use ortbench_engine::backend::cpu::gemm::{
    self, provider, set_num_threads, GemmError, Provider, Transpose,
};
use std::time::Instant;

/// Time `reps` fp32 `m x n x k` GEMMs (`C = A·B`, no transposes) on `provider` after `warmup`
/// untimed ones; returns GFLOP/s of each timed repetition. Inputs are non-zero and finite.
pub fn time_sgemm(
    provider: Provider,
    m: usize,
    n: usize,
    k: usize,
    warmup: usize,
    reps: usize,
) -> Result<Vec<f64>, GemmError> {
    let fill = |len: usize, seed: usize| -> Vec<f32> {
        (0..len).map(|i| (((i * 7 + seed) % 13) as f32 - 6.5) / 8.0).collect()
    };
    let (a, b) = (fill(m * k, 1), fill(k * n, 5)); // A: (M, K), B: (K, N)
    let mut c = vec![0.0f32; m * n]; // C: (M, N)
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let mut gflops = Vec::with_capacity(reps);
    for i in 0..warmup + reps {
        let t = Instant::now();
        provider.sgemm(Transpose::No, Transpose::No, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)?;
        let s = t.elapsed().as_secs_f64();
        if i >= warmup {
            gflops.push(flops / s.max(1e-9) / 1e9);
        }
    }
    Ok(gflops)
}

/// Best fp32 GEMM throughput (GFLOP/s) of the active provider on `threads` threads (0 = all),
/// measured for about a second on the BERT-sized 8192x768x3072 shape: the denominator of the
/// MFU of CPU runs. The thread setting is restored afterwards. The best repetition rather than
/// the median is taken because noise on a shared machine only ever makes a repetition slower.
pub fn measure_peak_gflops(threads: usize) -> Result<f64, GemmError> {
    let p = provider()?;
    let previous = gemm::requested_threads();
    set_num_threads(threads);
    let result = measure_peak_with(p);
    set_num_threads(previous);
    result
}

fn measure_peak_with(p: Provider) -> Result<f64, GemmError> {
    // The reference loop is ~1000x slower: a small shape keeps it near the same second.
    let (m, n, k) = match p {
        Provider::Reference => (128, 128, 128),
        _ => (8192, 768, 3072),
    };
    let start = Instant::now();
    let mut best = time_sgemm(p, m, n, k, 1, 1)?[0];
    let mut reps = 1;
    while reps < 3 || (start.elapsed().as_secs_f64() < 1.0 && reps < 100) {
        best = best.max(time_sgemm(p, m, n, k, 0, 1)?[0]);
        reps += 1;
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_follow_the_isa_and_vendor() {
        assert_eq!(fma_lanes("GenuineIntel", 6, &["avx2", "fma", "avx512f"]).0, 32);
        assert_eq!(fma_lanes("AuthenticAMD", 0x19, &["avx2", "fma", "avx512f"]).0, 16);
        assert_eq!(fma_lanes("AuthenticAMD", 0x1A, &["avx2", "fma", "avx512f"]).0, 32);
        assert_eq!(fma_lanes("AuthenticAMD", 0x17, &["avx2", "fma"]).0, 16);
        // 2 Sapphire Rapids cores at 3.0 GHz: 2 × 3 × 32 × 2 = 384 GFLOP/s.
        assert!((peak_tflops(2, 3.0, 32) - 0.384).abs() < 1e-12);
    }

    /// A fooled measurement (the 19.33 GHz a chain of adds read on a Sapphire Rapids Xeon) is
    /// discarded with its reason, and the peak uses the nominal clock; so is one above cpufreq's
    /// maximum; a plausible one above the nominal clock (turbo in a VM) is used.
    #[test]
    fn a_fooled_clock_measurement_is_rejected_and_never_used() {
        let (ghz, why) = choose_clock(Some(2.6), None, Some(19.33));
        assert_eq!(ghz, 2.6);
        assert!(why.unwrap().contains("outside 0.5–6.5 GHz"));
        let (ghz, why) = choose_clock(Some(2.0), Some(3.8), Some(4.5));
        assert_eq!(ghz, 3.8);
        assert!(why.unwrap().contains("above cpufreq's maximum 3.80"));
        assert_eq!(choose_clock(Some(2.0), None, Some(3.4)), (3.4, None));
        assert_eq!(choose_clock(Some(2.6), Some(3.5), Some(0.2)).0, 3.5);
        assert_eq!(choose_clock(None, None, None).0, 0.0);
    }

    /// On this machine, whatever its CPU: the clock used is one the checks accept.
    #[test]
    fn this_machines_clock_is_plausible() {
        let p = cpu_peak(1);
        println!(
            "{}{}",
            p.formula,
            p.clock_rejected.as_deref().map_or(String::new(), |w| format!(" ({w})"))
        );
        assert!(p.ghz <= PLAUSIBLE_GHZ.1, "{}", p.formula);
        if let Some(m) = p.measured_ghz.filter(|_| p.clock_rejected.is_none()) {
            assert!(m >= PLAUSIBLE_GHZ.0 && m <= PLAUSIBLE_GHZ.1, "{}", p.formula);
        }
    }

    #[test]
    fn nominal_clock_from_cpuinfo() {
        assert_eq!(
            nominal_ghz(
                "model name\t: Intel(R) Xeon(R) Platinum 8480C @ 2.00GHz\ncpu MHz\t\t: 1999.998\n"
            ),
            Some(2.0)
        );
        assert_eq!(nominal_ghz("model name\t: AMD EPYC\ncpu MHz\t\t: 2596.132\n"), Some(2.596132));
        assert_eq!(nominal_ghz("nothing"), None);
    }

    #[test]
    fn the_peak_bounds_a_measured_gemm() {
        // The point of the theoretical peak: no measured GEMM may exceed it. One thread, a
        // GEMM big enough to reach the provider's best (~0.5 s).
        let peak = cpu_peak(1);
        let gemm = measure_peak_gflops(1).expect("a GEMM runs") / 1e3;
        assert!(
            gemm <= peak.fp32 * 1.02,
            "measured GEMM {gemm:.3} TFLOP/s above the theoretical peak {}",
            peak.formula
        );
        assert!(
            gemm >= 0.05 * peak.fp32,
            "GEMM {gemm:.3} vs peak {}: the peak is implausibly high",
            peak.formula
        );
    }

    /// bf16 and fp16 peaks follow the flags: AMX's tile rate only where the kernel grants it.
    #[test]
    fn half_peaks_count_amx_only_where_the_kernel_grants_it() {
        let fp32 = peak_tflops(2, 3.0, 32); // 0.384
        let spr = ["avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"];
        let (bf16, fp16, words, note) = half_peaks(fp32, 2, 3.0, &spr, true);
        assert!((bf16 - 2.0 * 3.0 * 1024.0 / 1e3).abs() < 1e-12, "{words}");
        assert!((fp16 - 2.0 * fp32).abs() < 1e-12, "no amx_fp16 before Granite Rapids: {words}");
        assert!(note.unwrap().starts_with("counted"));
        let (bf16, _, _, note) = half_peaks(fp32, 2, 3.0, &spr, false);
        assert!((bf16 - 2.0 * fp32).abs() < 1e-12);
        assert!(note.unwrap().starts_with("not counted"));
        let (bf16, fp16, _, note) = half_peaks(fp32, 2, 3.0, &["avx512f"], true);
        assert_eq!((bf16, fp16, note), (fp32, fp32, None));
    }

    /// The bf16 peak bounds libtorch's bf16 GEMM as `pytorch` runs it (oneDNN: AMX where the
    /// CPU and the kernel allow, else AVX512_BF16 or f32): the denominator of its bf16 MFU.
    #[test]
    fn the_bf16_peak_bounds_libtorchs_bf16_gemm() {
        use tch::{Device, Kind, Tensor};
        tch::set_num_threads(1);
        let peak = cpu_peak(1);
        let (m, k, n) = (1024, 768, 3072);
        let a = Tensor::randn([m, k], (Kind::BFloat16, Device::Cpu));
        let b = Tensor::randn([k, n], (Kind::BFloat16, Device::Cpu));
        let mut best = f64::MAX;
        for _ in 0..12 {
            let t0 = Instant::now();
            let c = a.matmul(&b);
            best = best.min(t0.elapsed().as_secs_f64());
            drop(std::hint::black_box(c));
        }
        let tflops = 2.0 * (m * k * n) as f64 / best / 1e12;
        println!("libtorch bf16 GEMM {tflops:.3} TFLOP/s on 1 thread; {}", peak.formula);
        assert!(
            tflops <= peak.bf16 * 1.02,
            "libtorch's bf16 GEMM {tflops:.3} TFLOP/s above the bf16 peak {:.3} ({})",
            peak.bf16,
            peak.formula
        );
    }

    #[test]
    fn time_sgemm_reports_positive_rates() {
        let rates = time_sgemm(Provider::Gemm, 32, 16, 8, 1, 2).unwrap();
        assert_eq!(rates.len(), 2);
        assert!(rates.iter().all(|r| r.is_finite() && *r > 0.0));
    }
}
