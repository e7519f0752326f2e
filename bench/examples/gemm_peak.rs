//! fp32 GEMM throughput of each CPU GEMM provider, to see which library the CPU backend should
//! run (it is GEMM-bound) and what "peak" the MFU of CPU runs is measured against.
//!
//! ```text
//! cargo run --release --example gemm_peak -p ortbench -- [--provider mkl|gemm|reference]
//!     [--threads N] [--reps R]
//! ```
//!
//! Shapes: 8192x768x3072, then BERT-base's at batch 8 x seq 128 (M = 1024 tokens): QKV/output
//! projections 1024x768x768, FFN up 1024x3072x768, FFN down 1024x768x3072. Each shape runs every
//! provider in turn (interleaved, so machine noise hits all alike): 2 warm-ups, then the median
//! of R timed repetitions (min and max beside it). Without `--provider`, MKL (when it loads) and
//! the gemm crate are compared.

use ortbench_engine::backend::cpu::gemm::{self, Provider, ProviderKind};
use std::process::ExitCode;

const SHAPES: [(usize, usize, usize, &str); 4] = [
    (8192, 768, 3072, "large"),
    (1024, 768, 768, "bert qkv/out proj"),
    (1024, 3072, 768, "bert ffn up"),
    (1024, 768, 3072, "bert ffn down"),
];

struct Args {
    providers: Vec<ProviderKind>,
    threads: usize,
    reps: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { providers: Vec::new(), threads: 0, reps: 7 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--provider" => args.providers.push(value()?.parse().map_err(|e| format!("{e}"))?),
            "--threads" => {
                args.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?
            }
            "--reps" => args.reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "-h" | "--help" => {
                return Err("usage: gemm_peak [--provider mkl|gemm|reference]... [--threads N] \
                            [--reps R]"
                    .into())
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    args.reps = args.reps.max(1);
    Ok(args)
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let providers: Vec<Provider> = if args.providers.is_empty() {
        let mut ps = Vec::new();
        match Provider::load(ProviderKind::Mkl) {
            Ok(p) => ps.push(p),
            Err(e) => eprintln!("note: MKL not compared, it does not load:\n{e}\n"),
        }
        ps.push(Provider::Gemm);
        ps
    } else {
        args.providers
            .iter()
            .map(|&k| Provider::load(k))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?
    };
    gemm::set_num_threads(args.threads);
    println!("threads: {} (available: {})", gemm::num_threads(), available());
    for p in &providers {
        println!("provider {}: {p}", p.kind());
    }
    println!();
    println!("{:<34} {:<10} {:>8} {:>8} {:>8}", "shape MxNxK", "provider", "median", "min", "max");
    for (m, n, k, label) in SHAPES {
        for p in &providers {
            // The reference loop would take minutes on these shapes.
            if p.kind() == ProviderKind::Reference && m * n * k > 1 << 28 {
                continue;
            }
            let mut rates = ortbench::cpu_peak::time_sgemm(*p, m, n, k, 2, args.reps)
                .map_err(|e| e.to_string())?;
            rates.sort_by(f64::total_cmp);
            let shape = format!("{m}x{n}x{k} ({label})");
            println!(
                "{shape:<34} {:<10} {:>8.1} {:>8.1} {:>8.1}",
                p.kind().name(),
                rates[rates.len() / 2],
                rates[0],
                rates[rates.len() - 1]
            );
        }
    }
    println!("(GFLOP/s, fp32, 2·M·N·K flops per GEMM)");
    print_loaded_runtimes();
    print_thread_cpu();
    match gemm::provider() {
        Ok(active) => {
            let peak =
                ortbench::cpu_peak::measure_peak_gflops(args.threads).map_err(|e| e.to_string())?;
            println!("measure_peak_gflops (active provider {active}): {peak:.1} GFLOP/s");
        }
        Err(e) => println!("no active provider for measure_peak_gflops: {e}"),
    }
    Ok(())
}

fn available() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Which MKL and OpenMP libraries the process really mapped (Linux): the proof of which
/// threading layer MKL runs on.
fn print_loaded_runtimes() {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let mut libs: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.contains("libmkl_") || p.contains("omp"))
        .collect();
    libs.sort_unstable();
    libs.dedup();
    for lib in libs {
        println!("  loaded: {lib}");
    }
}

/// CPU seconds of each thread of the process (Linux): with N GEMM threads, N threads should
/// show similar busy times. Unlike GFLOP/s this survives a noisy shared machine, and it caught
/// MKL's Intel OpenMP layer running beside libgomp (two threads, each doing twice the CPU work).
fn print_thread_cpu() {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    let mut busy: Vec<f64> = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
        .filter_map(|stat| {
            // Fields after "(comm)": state is the first, utime the 12th, stime the 13th.
            let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let ticks: u64 =
                rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
            Some(ticks as f64 / 100.0) // USER_HZ is 100 on Linux
        })
        .filter(|&s| s >= 0.05)
        .collect();
    busy.sort_by(|a, b| b.total_cmp(a));
    let shown: Vec<String> = busy.iter().map(|s| format!("{s:.1}")).collect();
    println!("threads that did work: {} (CPU s each: {})", busy.len(), shown.join(", "));
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gemm_peak: {e}");
            ExitCode::FAILURE
        }
    }
}
