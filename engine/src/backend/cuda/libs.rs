//! Finding the CUDA libraries before cudarc loads them.
//!
//! cudarc (with `dynamic-loading`) `dlopen`s each library by bare name on first use and
//! *panics* when none of its candidate names loads. Two consequences for ortbench:
//! - the driver (`libcuda.so.1`) must be probed first, so that a machine without an NVIDIA
//!   driver gets an error naming what was looked for, never a panic;
//! - NVRTC and cuBLASLt ship in the torch wheel (`site-packages/nvidia/cu13/lib`), which is
//!   not on the loader's path. Loading them here by absolute path (RTLD_GLOBAL, kept for the
//!   life of the process) makes cudarc's later `dlopen("libnvrtc.so.13")` find the already
//!   loaded object by its SONAME, so no `LD_LIBRARY_PATH` is needed.
//!
//! Search order per library: the directories in `ORTBENCH_CUDA_LIB_DIR` (colon-separated),
//! then the torch wheel's CUDA folders (`site-packages/nvidia/cu13/lib`, or CUDA 12's
//! per-package folders) wherever [`crate::torch_wheel`] finds torch (the libtorch mapped in
//! the process, a `torch-lib` link beside the executable, `$VIRTUAL_ENV`, `python3`), then the
//! loader's default path by file name.

use std::path::PathBuf;
use std::sync::OnceLock;

use super::CudaError;

/// A CUDA library the backend needs, by the file names its versions ship under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaLib {
    /// The driver API (`cuInit`, `cuLaunchKernel`, …): part of the NVIDIA driver.
    Driver,
    /// The run-time compiler (CUDA C → PTX).
    Nvrtc,
    /// cuBLASLt (GEMMs).
    CublasLt,
}

impl CudaLib {
    pub fn name(self) -> &'static str {
        match self {
            CudaLib::Driver => "libcuda",
            CudaLib::Nvrtc => "libnvrtc",
            CudaLib::CublasLt => "libcublasLt",
        }
    }

    /// File names tried in order: CUDA 13 first (the torch 2.11 wheel and the GPU machines'
    /// toolkit), then 12. The driver keeps one SONAME across versions.
    fn file_names(self) -> &'static [&'static str] {
        match self {
            CudaLib::Driver => &["libcuda.so.1", "libcuda.so"],
            CudaLib::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
            CudaLib::CublasLt => &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
        }
    }
}

/// Directories searched before the loader's default path.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var("ORTBENCH_CUDA_LIB_DIR")
        .map(|v| v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect())
        .unwrap_or_default();
    dirs.extend(crate::torch_wheel::cuda_lib_dirs());
    dirs
}

/// Every path or name tried for `lib`, in order.
pub fn candidates(lib: CudaLib) -> Vec<PathBuf> {
    let dirs = search_dirs();
    let mut out: Vec<PathBuf> =
        dirs.iter().flat_map(|d| lib.file_names().iter().map(move |f| d.join(f))).collect();
    out.extend(lib.file_names().iter().map(PathBuf::from));
    out
}

/// Loads `lib` (once per process) and returns the path or name that loaded, or an error that
/// names everything tried.
pub fn load(lib: CudaLib) -> Result<&'static str, CudaError> {
    static DRIVER: OnceLock<Result<String, CudaError>> = OnceLock::new();
    static NVRTC: OnceLock<Result<String, CudaError>> = OnceLock::new();
    static CUBLASLT: OnceLock<Result<String, CudaError>> = OnceLock::new();
    let cell = match lib {
        CudaLib::Driver => &DRIVER,
        CudaLib::Nvrtc => &NVRTC,
        CudaLib::CublasLt => &CUBLASLT,
    };
    match cell.get_or_init(|| open_first(lib)) {
        Ok(s) => Ok(s.as_str()),
        Err(e) => Err(e.clone()),
    }
}

fn open_first(lib: CudaLib) -> Result<String, CudaError> {
    let tried = candidates(lib);
    for path in &tried {
        // A bare file name goes through the loader's search; a path must exist (a missing
        // venv directory is not an error, just the next candidate).
        if path.components().count() > 1 && !path.exists() {
            continue;
        }
        // SAFETY: loading a CUDA library runs its initialisers, which have no preconditions
        // here. RTLD_GLOBAL so that cudarc's later dlopen by SONAME finds this object.
        let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL;
        if lib == CudaLib::Nvrtc {
            preload_nvrtc_builtins(path, flags);
        }
        if let Ok(l) = unsafe { libloading::os::unix::Library::open(Some(path), flags) } {
            // Kept loaded for the life of the process: cudarc holds its own handles into it.
            std::mem::forget(l);
            return Ok(path.display().to_string());
        }
    }
    Err(CudaError::LibraryNotFound {
        lib: lib.name(),
        tried: tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
    })
}

/// libnvrtc dlopens `libnvrtc-builtins.so.<major.minor>` by bare name at its first compile;
/// outside the loader's path (the wheel's folder) that fails, so load the one beside `nvrtc`
/// first (by SONAME it is then found already loaded). Best effort: NVRTC's own error names the
/// file if this finds nothing.
fn preload_nvrtc_builtins(nvrtc: &std::path::Path, flags: i32) {
    let Some(dir) = nvrtc.parent().filter(|d| !d.as_os_str().is_empty()) else { return };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // libnvrtc-builtins.so.13.0, not the `.alt` variant (a second copy for other hosts).
        if name.starts_with("libnvrtc-builtins.so.") {
            // SAFETY: as for the library itself: initialisers without preconditions.
            if let Ok(l) = unsafe { libloading::os::unix::Library::open(Some(e.path()), flags) } {
                std::mem::forget(l);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_put_the_configured_dirs_first() {
        // Only this test sets the variable in this process's unit tests.
        std::env::set_var("ORTBENCH_CUDA_LIB_DIR", "/opt/a:/opt/b");
        let c = candidates(CudaLib::Nvrtc);
        std::env::remove_var("ORTBENCH_CUDA_LIB_DIR");
        assert_eq!(c[0], PathBuf::from("/opt/a/libnvrtc.so.13"));
        assert_eq!(c[3], PathBuf::from("/opt/b/libnvrtc.so.13"));
        assert_eq!(c.last().unwrap(), &PathBuf::from("libnvrtc.so"));
    }
}
