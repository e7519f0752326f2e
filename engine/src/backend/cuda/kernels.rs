//! The GPU kernel sources (`engine/kernels/*.cu`), embedded in the binary, and how NVRTC is
//! asked to compile them. No cudarc here: the NVRTC compile gate, the device backend and the
//! HIP backend (hiprtc, same sources) all start from these.

use std::path::{Path, PathBuf};

/// The portability header every kernel file includes.
pub const PORT_HEADER: &str = include_str!("../../../kernels/port.cuh");

/// Every kernel file, by file name.
pub const SOURCES: &[(&str, &str)] = &[
    ("adamw.cu", include_str!("../../../kernels/adamw.cu")),
    ("copy.cu", include_str!("../../../kernels/copy.cu")),
    ("elementwise.cu", include_str!("../../../kernels/elementwise.cu")),
    ("layernorm.cu", include_str!("../../../kernels/layernorm.cu")),
    ("reduce.cu", include_str!("../../../kernels/reduce.cu")),
];

/// The source NVRTC compiles for `file`: port.cuh pasted in place of its `#include` (NVRTC
/// sees one string; the header's own CUDA includes come from the include path).
pub fn nvrtc_source(file: &str) -> Option<String> {
    let (_, src) = SOURCES.iter().find(|(f, _)| *f == file)?;
    Some(src.replace("#include \"port.cuh\"", PORT_HEADER))
}

/// NVRTC options for `arch` (`sm_80`, `sm_90`, ...): C++17, the CUDA headers' folder (for
/// cuda_fp16.h / cuda_bf16.h), line info for compute-sanitizer reports.
pub fn nvrtc_options(include_dir: &Path) -> Vec<String> {
    vec!["--std=c++17".into(), format!("--include-path={}", include_dir.display()), "--generate-line-info".into()]
}

/// Where the CUDA headers NVRTC needs are: `ORTBENCH_CUDA_INCLUDE_DIR`, else an `include/`
/// beside one of the library folders searched for libnvrtc (the torch wheel's
/// `nvidia/cu13/include`), else /usr/local/cuda/include. None if no folder has cuda_fp16.h.
pub fn include_dir(lib_dirs: &[PathBuf]) -> Option<PathBuf> {
    let mut cands: Vec<PathBuf> = std::env::var_os("ORTBENCH_CUDA_INCLUDE_DIR").map(PathBuf::from).into_iter().collect();
    cands.extend(lib_dirs.iter().filter_map(|d| d.parent().map(|p| p.join("include"))));
    cands.push(PathBuf::from("/usr/local/cuda/include"));
    cands.into_iter().find(|d| d.join("cuda_fp16.h").is_file())
}

/// The kernel entry points a PTX module defines (`.entry name(` lines).
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    let mut v: Vec<String> = ptx
        .lines()
        .filter_map(|l| {
            let rest = l.trim_start().trim_start_matches(".visible").trim_start().strip_prefix(".entry")?;
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
            let s = nvrtc_source(file).unwrap();
            assert!(!s.contains("#include \"port.cuh\"") && s.contains("drop_mix"), "{file}");
        }
        assert!(nvrtc_source("nope.cu").is_none());
    }

    #[test]
    fn ptx_entries_are_found() {
        let ptx = ".visible .entry add_f32(\n\t.param .u64 a\n)\n.entry other (\n.func helper(";
        assert_eq!(ptx_entries(ptx), vec!["add_f32".to_string(), "other".to_string()]);
    }
}
