//! The environment a run was measured in, in the spirit of optimum-benchmark's
//! `environment` block: CPU, memory, GPUs and driver, OS, versions (ortbench, libtorch,
//! CUDA/ROCm, rustc, the CPU GEMM provider) and the git commit. Everything is read from
//! /proc, /sys and the vendors' tools when present; what cannot be found is null, never an
//! error. `ortbench env` prints it; `run` stores it in run.json.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Map, Value};

/// Collects the environment block.
pub fn collect() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let gpus = nvidia_gpus().or_else(rocm_gpus).unwrap_or_default();
    let torch = torch_version_info();
    let git = git_info();
    json!({
        "cpu": cpu_model(&cpuinfo),
        "cpu_count": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "cpu_physical_cores": physical_cores(&cpuinfo),
        "cpu_ram_mb": meminfo_kb("MemTotal").map(|kb| kb / 1024),
        "cgroup_memory_limit_mb": cgroup_memory_limit().map(|b| b / (1 << 20)),
        "system": std::env::consts::OS,
        "machine": std::env::consts::ARCH,
        "os": os_name(),
        "kernel": read_trim("/proc/sys/kernel/osrelease"),
        "gpu": gpus.iter().map(|g| g.name.clone()).collect::<Vec<_>>(),
        "gpu_count": gpus.len(),
        "gpu_vram_mb": gpus.iter().map(|g| g.memory_mb).collect::<Vec<_>>(),
        "gpu_driver": gpus.first().and_then(|g| g.driver.clone()),
        "cuda_version": nvidia_smi_cuda_version(),
        "rocm_version": read_trim("/opt/rocm/.info/version"),
        "ortbench_version": env!("CARGO_PKG_VERSION"),
        "ortbench_commit": git.0,
        "ortbench_dirty": git.1,
        "torch_version": tstr(&torch, "__version__"),
        "torch_cuda": tstr(&torch, "cuda"),
        "torch_hip": tstr(&torch, "hip"),
        "libtorch_path": libtorch_dir().map(|p| p.display().to_string()),
        // Loaded by CUDA runs only (plan / worker), read from this process's maps.
        "libtorch_cuda_loaded": ortbench_engine::torch_wheel::is_mapped(ortbench_engine::torch_wheel::LIBTORCH_CUDA).map(|p| p.display().to_string()),
        "tch_version": "0.24",
        "rustc_version": env!("ORTBENCH_RUSTC_VERSION"),
        "cpu_gemm_provider": ortbench_engine::backend::cpu::gemm::provider().ok().map(|p| p.kind().name()),
        // What multiplies bf16 matmuls on the CPU: the AVX-512 BF16 kernel, or the f32 GEMM.
        "cpu_bf16_gemm": ortbench_engine::backend::cpu::blas::bf16_gemm_description(),
        // libtorch's oneDNN ISA cap, if the user set one (unset: AMX where the CPU has it).
        "onednn_max_cpu_isa": std::env::var("ONEDNN_MAX_CPU_ISA").ok(),
    })
}

/// The environment as aligned `key: value` lines.
pub fn format(env: &Value) -> String {
    let Some(map) = env.as_object() else { return env.to_string() };
    let width = map.keys().map(|k| k.len()).max().unwrap_or(0);
    map.iter().map(|(k, v)| format!("{k:<width$}  {}\n", display_value(v))).collect()
}

/// A JSON value as a person reads it (lives beside the report, which shows run.json too).
pub use ortbench_report::display_value;

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|l| {
            l.starts_with("model name") || l.starts_with("Model") || l.starts_with("cpu model")
        })
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// Distinct (physical id, core id) pairs; None where /proc/cpuinfo does not say.
fn physical_cores(cpuinfo: &str) -> Option<usize> {
    let mut cores = std::collections::BTreeSet::new();
    let (mut phys, mut core) = (None, None);
    for line in cpuinfo.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if let (Some(p), Some(c)) = (phys.take(), core.take()) {
                cores.insert((p, c));
            }
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            match k.trim() {
                "physical id" => phys = Some(v.trim().to_string()),
                "core id" => core = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// A field of /proc/meminfo in kB.
pub fn meminfo_kb(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.split(':').next() == Some(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The cgroup (v2, else v1) memory limit in bytes, when there is one.
pub fn cgroup_memory_limit() -> Option<u64> {
    for path in ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"] {
        if let Some(v) = read_trim(path).and_then(|s| s.parse::<u64>().ok()) {
            // v1 reports "no limit" as a huge number.
            if v < (1 << 60) {
                return Some(v);
            }
        }
    }
    None
}

/// The memory a worker may use: the cgroup limit when there is one, else physical RAM.
pub fn memory_limit_bytes() -> Option<u64> {
    let ram = meminfo_kb("MemTotal").map(|kb| kb * 1024);
    match (cgroup_memory_limit(), ram) {
        (Some(c), Some(r)) => Some(c.min(r)),
        (c, r) => c.or(r),
    }
}

fn os_name() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    let line = text.lines().find(|l| l.starts_with("PRETTY_NAME="))?;
    Some(line["PRETTY_NAME=".len()..].trim_matches('"').to_string())
}

fn run_tool(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub struct Gpu {
    pub name: String,
    pub memory_mb: Option<u64>,
    pub driver: Option<String>,
}

fn nvidia_gpus() -> Option<Vec<Gpu>> {
    let text = run_tool(
        "nvidia-smi",
        &["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
    )?;
    let gpus = parse_nvidia_query(&text);
    (!gpus.is_empty()).then_some(gpus)
}

/// Lines of `nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits`.
fn parse_nvidia_query(text: &str) -> Vec<Gpu> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            Gpu {
                name: f.first().unwrap_or(&"").to_string(),
                memory_mb: f.get(1).and_then(|m| m.parse().ok()),
                driver: f.get(2).map(|d| d.to_string()),
            }
        })
        .collect()
}

fn nvidia_smi_cuda_version() -> Option<String> {
    parse_cuda_version(&run_tool("nvidia-smi", &[])?)
}

/// "CUDA Version: 12.8" from nvidia-smi's banner.
fn parse_cuda_version(text: &str) -> Option<String> {
    let at = text.find("CUDA Version:")?;
    text[at + "CUDA Version:".len()..].split_whitespace().next().map(String::from)
}

fn rocm_gpus() -> Option<Vec<Gpu>> {
    let text = run_tool(
        "rocm-smi",
        &["--showproductname", "--showmeminfo", "vram", "--showdriverversion", "--json"],
    )?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let map = v.as_object()?;
    let driver = map
        .get("system")
        .and_then(|s| s.get("Driver version"))
        .and_then(Value::as_str)
        .map(String::from);
    let gpus: Vec<Gpu> = map
        .iter()
        .filter(|(k, _)| k.starts_with("card"))
        .map(|(_, c)| Gpu {
            name: ["Card Series", "Card series", "Card SKU", "Card model"]
                .iter()
                .find_map(|k| c.get(*k).and_then(Value::as_str))
                .unwrap_or("AMD GPU")
                .to_string(),
            memory_mb: c
                .get("VRAM Total Memory (B)")
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<u64>().ok())
                .map(|b| b / (1 << 20)),
            driver: driver.clone(),
        })
        .collect();
    (!gpus.is_empty()).then_some(gpus)
}

/// Memory of GPU `index` in MiB (nvidia-smi or rocm-smi), for `--batch-size auto`'s default
/// budget.
pub fn gpu_memory_mb(index: usize) -> Option<u64> {
    nvidia_gpus().or_else(rocm_gpus)?.get(index)?.memory_mb
}

/// The GPU names, in device order (for the MFU table).
pub fn gpu_names() -> Vec<String> {
    nvidia_gpus().or_else(rocm_gpus).unwrap_or_default().into_iter().map(|g| g.name).collect()
}

/// libtorch's directory (torch/): the one mapped into this process, else $LIBTORCH, else the
/// one this binary was built against.
fn libtorch_dir() -> Option<PathBuf> {
    if let Some(w) = ortbench_engine::torch_wheel::from_mapped() {
        return Some(w.torch_dir);
    }
    if let Ok(p) = std::env::var("LIBTORCH") {
        if Path::new(&p).join("lib").is_dir() {
            return Some(PathBuf::from(p));
        }
    }
    let lib = env!("ORTBENCH_LIBTORCH_LIB");
    (!lib.is_empty()).then(|| Path::new(lib).parent().map(Path::to_path_buf)).flatten()
}

/// `torch/version.py` of the wheel that ships libtorch: `__version__`, `cuda`, `hip`.
fn torch_version_info() -> Map<String, Value> {
    let mut m = Map::new();
    let Some(text) =
        libtorch_dir().and_then(|d| std::fs::read_to_string(d.join("version.py")).ok())
    else {
        return m;
    };
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else { continue };
        let k = k.split(':').next().unwrap_or("").trim();
        let v = v.trim();
        let value = if v == "None" {
            Value::Null
        } else {
            Value::String(v.trim_matches(|c| c == '\'' || c == '"').to_string())
        };
        if ["__version__", "cuda", "hip"].contains(&k) {
            m.insert(k.to_string(), value);
        }
    }
    m
}

fn tstr(m: &Map<String, Value>, k: &str) -> Option<String> {
    m.get(k).and_then(Value::as_str).map(String::from)
}

/// (commit, dirty) of the checkout this binary was built in (read when it runs, so a binary
/// older than the checkout reports the checkout), else of the current directory.
fn git_info() -> (Option<String>, Option<bool>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf);
    for dir in root.into_iter().chain(std::env::current_dir().ok()) {
        let dir_s = dir.display().to_string();
        if let Some(commit) = run_tool("git", &["-C", &dir_s, "rev-parse", "HEAD"]) {
            let dirty =
                run_tool("git", &["-C", &dir_s, "status", "--porcelain", "--untracked-files=no"])
                    .map(|s| !s.trim().is_empty());
            return (Some(commit.trim().to_string()), dirty);
        }
    }
    (None, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuinfo_is_parsed() {
        let info = "processor\t: 0\nmodel name\t: Test CPU @ 2GHz\nphysical id\t: 0\ncore id\t: 0\n\n\
                    processor\t: 1\nmodel name\t: Test CPU @ 2GHz\nphysical id\t: 0\ncore id\t: 0\n\n\
                    processor\t: 2\nmodel name\t: Test CPU @ 2GHz\nphysical id\t: 0\ncore id\t: 1\n";
        assert_eq!(cpu_model(info).as_deref(), Some("Test CPU @ 2GHz"));
        assert_eq!(physical_cores(info), Some(2));
    }

    #[test]
    fn nvidia_smi_output_is_parsed() {
        let gpus = parse_nvidia_query(
            "NVIDIA H200, 143771, 570.124.06\nNVIDIA H200, 143771, 570.124.06\n",
        );
        assert_eq!(gpus.len(), 2);
        assert_eq!(
            (gpus[0].name.as_str(), gpus[0].memory_mb, gpus[0].driver.as_deref()),
            ("NVIDIA H200", Some(143771), Some("570.124.06"))
        );
        assert!(crate::metrics::gpu_peak(&gpus[0].name).is_some());
        let banner =
            "| NVIDIA-SMI 570.124.06   Driver Version: 570.124.06   CUDA Version: 12.8     |";
        assert_eq!(parse_cuda_version(banner).as_deref(), Some("12.8"));
    }

    #[test]
    fn the_environment_has_the_essentials() {
        let env = collect();
        for key in [
            "cpu",
            "cpu_count",
            "cpu_ram_mb",
            "os",
            "ortbench_version",
            "torch_version",
            "rustc_version",
        ] {
            assert!(!env[key].is_null(), "{key} is null in {env:#}");
        }
        assert!(format(&env).contains("ortbench_version"));
    }
}
