//! The GPU kernel sources (`engine/kernels/*.cu`), embedded in the binary, and how NVRTC and
//! hiprtc are asked to compile them. No cudarc here: the CUDA backend, the HIP backend and both
//! compile gates start from these — one copy of every kernel for both vendors.

use std::path::{Path, PathBuf};

/// The portability header every kernel file includes.
pub const PORT_HEADER: &str = include_str!("../../kernels/port.cuh");

/// Every kernel file, by file name, in name order (found by `engine/build.rs`).
pub const SOURCES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/gpu_sources.rs"));

/// The source NVRTC / hiprtc compile for `file`: port.cuh pasted in place of its `#include`
/// (the compilers see one string; the header's own CUDA/HIP includes come from their paths).
pub fn full_source(file: &str) -> Option<String> {
    let (_, src) = SOURCES.iter().find(|(f, _)| *f == file)?;
    // `#pragma once` in what becomes the main file only draws a warning: drop it.
    Some(src.replace("#include \"port.cuh\"", &PORT_HEADER.replacen("#pragma once", "", 1)))
}

/// NVRTC options for `arch` (`sm_80`, `sm_90`, ...): C++17, the CUDA headers' folder (for
/// cuda_fp16.h / cuda_bf16.h), line info for compute-sanitizer reports.
pub fn nvrtc_options(include_dir: &Path) -> Vec<String> {
    vec![
        "--std=c++17".into(),
        format!("--include-path={}", include_dir.display()),
        "--generate-line-info".into(),
    ]
}

/// Where the CUDA headers NVRTC needs are: `ORTBENCH_CUDA_INCLUDE_DIR`, else an `include/`
/// beside one of the library folders searched for libnvrtc (the torch wheel's
/// `nvidia/cu13/include`), else /usr/local/cuda/include. None if no folder has cuda_fp16.h.
pub fn include_dir(lib_dirs: &[PathBuf]) -> Option<PathBuf> {
    let mut cands: Vec<PathBuf> =
        std::env::var_os("ORTBENCH_CUDA_INCLUDE_DIR").map(PathBuf::from).into_iter().collect();
    cands.extend(lib_dirs.iter().filter_map(|d| d.parent().map(|p| p.join("include"))));
    cands.push(PathBuf::from("/usr/local/cuda/include"));
    cands.into_iter().find(|d| d.join("cuda_fp16.h").is_file())
}

/// `f` on every kernel file, its results in [`SOURCES`]' order, on as many threads as the
/// machine has: the compile gates run NVRTC (thread-safe across programs, NVRTC guide
/// "Thread Safety") and ptxas on ~15 files per architecture, each compile single-threaded.
pub fn map_files<R: Send>(f: impl Fn(&'static str) -> R + Sync) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(SOURCES.len());
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((file, _)) = SOURCES.get(i) else { break mine };
                        mine.push((i, f(file)));
                    }
                })
            })
            .collect();
        // A panic in `f` (a gate's assertion) is re-raised here with its message.
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// hiprtc options for `arch` (`gfx90a`, `gfx908`, `gfx1030`, ...): C++17, optimised. The
/// wavefront size follows the target (64 on CDNA, 32 by default on RDNA); kernels read it from
/// `warpSize`.
pub fn hiprtc_options(arch: &str) -> Vec<String> {
    vec![format!("--offload-arch={arch}"), "-std=c++17".into(), "-O3".into()]
}

/// Whether an AMD code object (ELF) defines kernel `name` (its `name.kd` kernel descriptor).
pub fn code_object_has_kernel(code: &[u8], name: &str) -> bool {
    let needle = format!("{name}.kd\0");
    code.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// The kernel entry points a PTX module defines (`.entry name(` lines).
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    let mut v: Vec<String> = ptx
        .lines()
        .filter_map(|l| {
            let rest = l
                .trim_start()
                .trim_start_matches(".visible")
                .trim_start()
                .strip_prefix(".entry")?;
            Some(rest.trim().split(['(', ' ']).next()?.to_string())
        })
        .filter(|s| !s.is_empty())
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_includes_the_port_header_and_is_pasted() {
        for (file, src) in SOURCES {
            assert!(src.contains("#include \"port.cuh\""), "{file}");
            let s = full_source(file).unwrap();
            assert!(!s.contains("#include \"port.cuh\"") && s.contains("drop_mix"), "{file}");
        }
        assert!(full_source("nope.cu").is_none());
    }

    #[test]
    fn map_files_returns_one_result_per_file_in_source_order() {
        let names = map_files(|file| file.to_string());
        let want: Vec<String> = SOURCES.iter().map(|(f, _)| f.to_string()).collect();
        assert_eq!(names, want);
    }

    #[test]
    fn ptx_entries_are_found() {
        let ptx = ".visible .entry add_f32(\n\t.param .u64 a\n)\n.entry other (\n.func helper(";
        assert_eq!(ptx_entries(ptx), vec!["add_f32".to_string(), "other".to_string()]);
    }
}
