//! The engine's kernel files (`engine/kernels/*.cu`) as the driver loads them, from the first
//! place that has them for this architecture:
//!
//! 1. a **cubin** assembled ahead of time — `ORTBENCH_CUBIN_DIR`, else `kernels/` beside the
//!    executable (where `scripts/gpu-validate --pack` puts the ptxas gate's sm_90 cubins), so a
//!    fresh GPU machine neither compiles nor JIT-assembles anything;
//! 2. **PTX from the disk cache** ([`cache_dir`]), written by an earlier run;
//! 3. **PTX compiled now** by NVRTC, then written to the cache (best effort).
//!
//! All three are keyed alike ([`key`]): the NVRTC version, the full source, the options that
//! change the code and the architecture — not the include folder, which names a place on this
//! machine (the pack's cubins are made on another), not what is compiled. A cubin sits beside
//! an `.entries` file listing its kernels (one name a line): a cubin is no text to read them
//! from, as PTX is.
//!
//! `ORTBENCH_NVRTC_FMAD=false` compiles without multiply-add contraction (`--fmad=false`): a
//! numerics rerun, to tell an FMA's rounding from a bug. It is part of the key, so the pack's
//! cubins (made with contraction) are then passed over for freshly compiled PTX.

use std::path::{Path, PathBuf};

use cudarc::nvrtc::{CompileOptions, Ptx};

use super::libs;
use super::CudaError;
use crate::backend::gpu_sources;

/// Where a kernel file's code came from ([`image`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A cubin assembled ahead of time, at this path.
    Cubin(PathBuf),
    /// PTX from the disk cache (the driver assembles it).
    CachedPtx,
    /// PTX compiled by NVRTC in this process (the driver assembles it).
    Compiled,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Cubin(p) => write!(f, "cubin {}", p.display()),
            Origin::CachedPtx => write!(f, "cached PTX"),
            Origin::Compiled => write!(f, "compiled by NVRTC"),
        }
    }
}

/// One kernel file ready to load: its image (cubin or PTX), its kernels and where it came from.
pub struct KernelImage {
    pub image: Ptx,
    pub entries: Vec<String>,
    pub origin: Origin,
}

/// `major.minor` of the NVRTC library loaded.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    libs::load(libs::CudaLib::Nvrtc)?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters of the documented C types; the library was loaded above.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Driver(format!("nvrtcVersion: {r:?}")));
    }
    Ok((major, minor))
}

/// NVRTC's options for this machine: [`gpu_sources::nvrtc_options`] with the CUDA headers'
/// folder found here, and `--fmad=false` under `ORTBENCH_NVRTC_FMAD=false`.
fn options() -> Result<Vec<String>, CudaError> {
    let include = gpu_sources::include_dir(&libs::search_dirs()).ok_or_else(|| {
        CudaError::LibraryNotFound {
            lib: "CUDA headers (cuda_fp16.h)",
            tried: "ORTBENCH_CUDA_INCLUDE_DIR, include/ beside the library folders, /usr/local/cuda/include".into(),
        }
    })?;
    let mut o = gpu_sources::nvrtc_options(&include);
    match std::env::var("ORTBENCH_NVRTC_FMAD").as_deref() {
        Err(_) | Ok("true") => {}
        Ok("false") => o.push("--fmad=false".into()),
        Ok(other) => {
            return Err(CudaError::Driver(format!(
                "ORTBENCH_NVRTC_FMAD={other}: expected true or false"
            )))
        }
    }
    Ok(o)
}

/// FNV-1a, 64 bit: a cache key stable across Rust versions (std's hasher is not).
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0u8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The key of `file`'s code for `arch` (module comment): NVRTC version, source, the options
/// but the include folder, architecture.
pub fn key(file: &str, arch: &str) -> Result<u64, CudaError> {
    let src = source(file)?;
    let (major, minor) = nvrtc_version()?;
    let opts: Vec<String> =
        options()?.into_iter().filter(|o| !o.starts_with("--include-path=")).collect();
    Ok(fnv1a(&[&format!("nvrtc {major}.{minor}"), &src, &opts.join(" "), arch]))
}

fn source(file: &str) -> Result<String, CudaError> {
    gpu_sources::full_source(file).ok_or_else(|| CudaError::UnknownKernel(file.to_string()))
}

/// `{stem}-{arch}-{key:016x}.{ext}`: the name of a cached PTX or cubin.
pub fn file_name(file: &str, arch: &str, key: u64, ext: &str) -> String {
    format!("{}-{arch}-{key:016x}.{ext}", file.trim_end_matches(".cu"))
}

/// Where compiled PTX is cached: `ORTBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/ortbench`, else
/// `~/.cache/ortbench`, with a `ptx/` folder under it.
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("ORTBENCH_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("ortbench")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ortbench")))
        .unwrap_or_else(|| std::env::temp_dir().join("ortbench-cache"));
    base.join("ptx")
}

/// Where ahead-of-time cubins are looked for: `ORTBENCH_CUBIN_DIR` if set (only there), else
/// `kernels/` beside the executable.
pub fn cubin_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("ORTBENCH_CUBIN_DIR") {
        return Some(PathBuf::from(d));
    }
    Some(std::env::current_exe().ok()?.parent()?.join("kernels"))
}

/// `file` compiled to PTX by NVRTC for `arch`, now (no cache read): the compile gates' path.
pub fn compile_ptx(file: &str, arch: &'static str) -> Result<String, CudaError> {
    let src = source(file)?;
    let opts = CompileOptions { arch: Some(arch), options: options()?, ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(&src, opts).map_err(|e| CudaError::Nvrtc {
        file: file.to_string(),
        arch,
        log: compile_log(&e),
    })?;
    Ok(ptx.to_src())
}

/// Writes `ptx` to the disk cache under `key` (best effort: a read-only cache only costs the
/// next run a compile). Written whole, then renamed, so a reader never sees half a file.
pub fn store_ptx(file: &str, arch: &str, key: u64, ptx: &str) {
    let dir = cache_dir();
    if std::fs::create_dir_all(&dir).is_ok() {
        let path = dir.join(file_name(file, arch, key, "ptx"));
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, ptx).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
}

/// Writes an ahead-of-time cubin and its `.entries` into `dir` (the ptxas gate, for the pack).
pub fn store_cubin(
    dir: &Path,
    file: &str,
    arch: &str,
    key: u64,
    cubin: &[u8],
    entries: &[String],
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(file_name(file, arch, key, "cubin"));
    std::fs::write(&path, cubin)?;
    std::fs::write(path.with_extension("entries"), entries.join("\n") + "\n")?;
    Ok(path)
}

/// `file`'s code for `arch` from the first place that has it (module comment).
pub fn image(file: &str, arch: &'static str) -> Result<KernelImage, CudaError> {
    let key = key(file, arch)?;
    if let Some(dir) = cubin_dir() {
        let path = dir.join(file_name(file, arch, key, "cubin"));
        let entries = std::fs::read_to_string(path.with_extension("entries"));
        if let (Ok(bin), Ok(entries)) = (std::fs::read(&path), entries) {
            let entries: Vec<String> = entries.lines().map(str::to_string).collect();
            if !entries.is_empty() {
                let origin = Origin::Cubin(path);
                return Ok(KernelImage { image: Ptx::from_binary(bin), entries, origin });
            }
        }
    }
    let (ptx, origin) = ptx(file, arch, key)?;
    let entries = gpu_sources::ptx_entries(&ptx);
    Ok(KernelImage { image: Ptx::from_src(ptx), entries, origin })
}

/// `file`'s PTX for `arch` under `key`: from the disk cache, else compiled by NVRTC now and
/// written there (steps 2 and 3 of the module comment).
pub fn ptx(file: &str, arch: &'static str, key: u64) -> Result<(String, Origin), CudaError> {
    let cached = cache_dir().join(file_name(file, arch, key, "ptx"));
    match std::fs::read_to_string(&cached) {
        Ok(text) => Ok((text, Origin::CachedPtx)),
        Err(_) => {
            let ptx = compile_ptx(file, arch)?;
            store_ptx(file, arch, key, &ptx);
            Ok((ptx, Origin::Compiled))
        }
    }
}

/// NVRTC's log from a failed compile, or the error itself.
pub fn compile_log(e: &cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_key_changes_with_source_options_and_arch() {
        let k = fnv1a(&["src", "-O3", "sm_90"]);
        assert_ne!(k, fnv1a(&["src ", "-O3", "sm_90"]));
        assert_ne!(k, fnv1a(&["src", "-O2", "sm_90"]));
        assert_ne!(k, fnv1a(&["src", "-O3", "sm_80"]));
        // Part boundaries count: ("ab", "c") is not ("a", "bc").
        assert_ne!(fnv1a(&["ab", "c"]), fnv1a(&["a", "bc"]));
        assert_eq!(
            file_name("attention.cu", "sm_90", 0xab, "cubin"),
            "attention-sm_90-00000000000000ab.cubin"
        );
    }
}
