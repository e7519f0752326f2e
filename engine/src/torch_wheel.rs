//! Finding the torch wheel's folders at run time, wherever the machine keeps them.
//!
//! The CUDA libraries ortbench loads itself (cudart, NVRTC and its builtins, cuBLASLt, NCCL), the
//! CUDA headers NVRTC compiles against, and libtorch_cuda all ship in the PyPI torch wheel and
//! its `nvidia-*` dependencies, in one `site-packages`:
//!
//! ```text
//! site-packages/torch/lib/libtorch_cpu.so, libtorch_cuda.so, libc10.so, ...
//! site-packages/nvidia/cu13/lib/libcudart.so.13, libnvrtc.so.13, libcublasLt.so.13, ...   (cu13)
//! site-packages/nvidia/cu13/include/cuda_fp16.h, ...
//! site-packages/nvidia/nccl/lib/libnccl.so.2
//! site-packages/nvidia/{cuda_runtime,cuda_nvrtc,cublas}/lib                             (cu12)
//! ```
//!
//! Nothing here depends on where the binary was built or on the Python version: the wheel is
//! found, in order, from
//!
//! 1. the libtorch already mapped into this process (`/proc/self/maps`: the folder of
//!    `libtorch_cpu.so`, whose real path the kernel reports, so `torch/lib/../..` is
//!    site-packages) — every binary that links tch;
//! 2. a `torch-lib` link beside the executable (the packed binary's second rpath entry,
//!    `$ORIGIN/torch-lib`, points there), for binaries that do not link libtorch;
//! 3. `$VIRTUAL_ENV/lib/python3.*/site-packages/torch` (any Python version);
//! 4. the `python3` on `PATH`, asked where its `torch` package is (without importing it).
//!
//! Explicit overrides stay with their users: `ORTBENCH_CUDA_LIB_DIR` (`backend::cuda::libs`),
//! `ORTBENCH_CUDA_INCLUDE_DIR` (`backend::gpu_sources`), `ORTBENCH_NCCL_LIB` and
//! `ORTBENCH_GPU_RUNTIME_LIB` (`collective::device`) are tried before anything found here.
//!
//! [`load_libtorch_cuda`] loads libtorch_cuda beside the mapped libtorch_cpu: rustc links with
//! `--as-needed` and nothing references a libtorch_cuda symbol, so the linker drops the
//! `-ltorch_cuda` torch-sys asks for (tch-rs issues 907, 980) and libtorch sees no CUDA until
//! it is loaded. Only CUDA runs load it, so CPU runs' memory is unchanged.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The library whose folder is torch's `lib/` (every libtorch build has it).
pub const LIBTORCH_CPU: &str = "libtorch_cpu.so";
/// libtorch's CUDA half; absent from CPU-only builds (the `+cpu` wheels).
pub const LIBTORCH_CUDA: &str = "libtorch_cuda.so";
/// The link beside an executable that its `$ORIGIN/torch-lib` rpath entry follows.
pub const EXE_LINK: &str = "torch-lib";

/// How [`TorchWheel`] was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The libtorch mapped into this process.
    Mapped,
    /// The `torch-lib` link beside the executable.
    ExeLink,
    /// `$VIRTUAL_ENV`.
    VirtualEnv,
    /// The `python3` on `PATH`.
    Python,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Mapped => "the libtorch mapped in this process",
            Source::ExeLink => "the torch-lib link beside the executable",
            Source::VirtualEnv => "$VIRTUAL_ENV",
            Source::Python => "python3 on PATH",
        }
    }
}

/// An installed torch package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchWheel {
    /// The package's folder (`.../site-packages/torch`: `lib/`, `include/`, `version.py`),
    /// a real path (no symlink in it), so that `..` from it is what the loader sees.
    pub torch_dir: PathBuf,
    pub source: Source,
}

impl TorchWheel {
    fn at(torch_dir: &Path, source: Source) -> Option<TorchWheel> {
        let torch_dir = torch_dir.canonicalize().ok()?;
        torch_dir
            .join("lib")
            .join(LIBTORCH_CPU)
            .is_file()
            .then_some(TorchWheel { torch_dir, source })
    }

    /// `torch/lib`: libtorch itself.
    pub fn lib_dir(&self) -> PathBuf {
        self.torch_dir.join("lib")
    }

    /// The folder torch is installed in (site-packages, or dist-packages).
    pub fn site_packages(&self) -> PathBuf {
        self.torch_dir.parent().map_or_else(|| self.torch_dir.clone(), Path::to_path_buf)
    }

    /// The wheel's CUDA library folders that exist: `nvidia/cu13/lib` (CUDA 13 wheels: cudart,
    /// NVRTC, cuBLAS(Lt) in one folder), then CUDA 12's per-package folders.
    pub fn cuda_lib_dirs(&self) -> Vec<PathBuf> {
        let nvidia = self.site_packages().join("nvidia");
        ["cu13/lib", "cuda_runtime/lib", "cuda_nvrtc/lib", "cublas/lib"]
            .iter()
            .map(|d| nvidia.join(d))
            .filter(|d| d.is_dir())
            .collect()
    }

    /// The wheel's NCCL folder (`nvidia/nccl/lib`), when it exists.
    pub fn nccl_lib_dir(&self) -> Option<PathBuf> {
        Some(self.site_packages().join("nvidia/nccl/lib")).filter(|d| d.is_dir())
    }
}

/// The files mapped into this process, in the order `/proc/self/maps` first lists them.
pub fn mapped_files() -> Vec<PathBuf> {
    parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap_or_default())
}

/// The file paths of a `/proc/PID/maps` text, each once.
pub fn parse_maps(maps: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        // `address perms offset dev inode      path`: the path is all after the first " /"
        // (the fields before it have none); a deleted file is marked " (deleted)".
        let Some(at) = line.find(" /") else { continue };
        let path = line[at + 1..].trim_end();
        if path.ends_with(" (deleted)") {
            continue;
        }
        let p = PathBuf::from(path);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// Whether a library whose file name is `name` is mapped into this process.
pub fn is_mapped(name: &str) -> Option<PathBuf> {
    mapped_files().into_iter().find(|p| p.file_name().is_some_and(|f| f == name))
}

/// torch's `lib/` of the libtorch mapped into a process, from its maps.
pub fn torch_lib_in(maps: &[PathBuf]) -> Option<PathBuf> {
    maps.iter()
        .find(|p| p.file_name().is_some_and(|f| f == LIBTORCH_CPU))
        .and_then(|p| p.parent())
        .map(Path::to_path_buf)
}

/// The wheel of the libtorch mapped into this process.
pub fn from_mapped() -> Option<TorchWheel> {
    let lib = torch_lib_in(&mapped_files())?;
    TorchWheel::at(lib.parent()?, Source::Mapped)
}

/// The wheel the `torch-lib` link beside the executable points at.
pub fn from_exe_link() -> Option<TorchWheel> {
    let exe = std::env::current_exe().ok()?;
    let link = exe.parent()?.join(EXE_LINK);
    // canonicalize follows the link, so `..` is the real torch/ folder.
    let lib = link.canonicalize().ok()?;
    TorchWheel::at(lib.parent()?, Source::ExeLink)
}

/// `venv/lib/python3.*/site-packages/torch` for any Python 3 (the newest version first).
pub fn from_virtual_env(venv: &Path) -> Option<TorchWheel> {
    let mut pythons: Vec<(u32, PathBuf)> = std::fs::read_dir(venv.join("lib"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let minor = name.strip_prefix("python3.")?.parse::<u32>().ok()?;
            Some((minor, e.path()))
        })
        .collect();
    pythons.sort_by_key(|p| std::cmp::Reverse(p.0));
    pythons
        .iter()
        .find_map(|(_, p)| TorchWheel::at(&p.join("site-packages/torch"), Source::VirtualEnv))
}

/// Asks `python` where its `torch` package is (`importlib.util.find_spec`, which does not
/// import torch: a few tens of milliseconds).
pub fn from_python(python: &str) -> Option<TorchWheel> {
    let code = "import importlib.util,os\ns=importlib.util.find_spec('torch')\nprint(os.path.dirname(s.origin) if s and s.origin else '')";
    let out = Command::new(python)
        .args(["-c", code])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || dir.is_empty() {
        return None;
    }
    TorchWheel::at(Path::new(&dir), Source::Python)
}

/// Every way of finding the wheel, in order, uncached.
pub fn find() -> Option<TorchWheel> {
    from_mapped()
        .or_else(from_exe_link)
        .or_else(|| from_virtual_env(Path::new(&std::env::var_os("VIRTUAL_ENV")?)))
        .or_else(|| from_python("python3"))
}

/// [`find`], once per process (its last resort starts a Python).
pub fn torch_wheel() -> Option<&'static TorchWheel> {
    static WHEEL: OnceLock<Option<TorchWheel>> = OnceLock::new();
    WHEEL.get_or_init(find).as_ref()
}

/// The wheel's CUDA library folders (none when no wheel is found).
pub fn cuda_lib_dirs() -> Vec<PathBuf> {
    torch_wheel().map(TorchWheel::cuda_lib_dirs).unwrap_or_default()
}

/// The wheel's NCCL folder.
pub fn nccl_lib_dir() -> Option<PathBuf> {
    torch_wheel().and_then(TorchWheel::nccl_lib_dir)
}

/// Loads libtorch_cuda (once per process; RTLD_NOW | RTLD_GLOBAL, kept for the life of the
/// process) from beside the libtorch_cpu mapped into this process, and returns its path. Its
/// initialisers register libtorch's CUDA hooks, so `torch::cuda::device_count()` and CUDA
/// tensors work from then on. Its own rpath (`$ORIGIN/../../nvidia/...`) finds the CUDA
/// wheels. The error is one line: libtorch not loaded, a CPU-only torch (no libtorch_cuda
/// beside libtorch_cpu), or the loader's reason (e.g. a CUDA library of the wheel missing).
pub fn load_libtorch_cuda() -> Result<PathBuf, String> {
    static LOADED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    LOADED.get_or_init(|| load_cuda_beside(&mapped_files())).clone()
}

fn load_cuda_beside(maps: &[PathBuf]) -> Result<PathBuf, String> {
    let lib = torch_lib_in(maps).ok_or_else(|| {
        format!(
            "{LIBTORCH_CPU} is not loaded in this process, so there is no libtorch to add CUDA to"
        )
    })?;
    let path = lib.join(LIBTORCH_CUDA);
    if !path.is_file() {
        return Err(format!(
            "{} has no {LIBTORCH_CUDA} beside {LIBTORCH_CPU}: this torch is a CPU-only build; install a CUDA build of torch (e.g. torch==2.11.0 from PyPI, cu130) for --device cuda",
            lib.display()
        ));
    }
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL;
    // SAFETY: libtorch_cuda's initialisers register CUDA hooks with the libtorch already in
    // the process (the same folder, so the same build); they have no other preconditions.
    match unsafe { libloading::os::unix::Library::open(Some(&path), flags) } {
        Ok(l) => {
            // Kept for the life of the process: libtorch holds pointers into it.
            std::mem::forget(l);
            Ok(path)
        }
        Err(e) => Err(format!("loading {}: {}", path.display(), e.to_string().replace('\n', " "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder under the system's temporary one (the engine has no tempfile crate).
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir()
            .join(format!("ortbench-torch-wheel-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn maps_are_parsed_into_paths() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 08:01 123   /opt/t/site-packages/torch/lib/libtorch_cpu.so
7f0000001000-7f0000002000 r-xp 00001000 08:01 123   /opt/t/site-packages/torch/lib/libtorch_cpu.so
7f0000003000-7f0000004000 rw-p 00000000 00:00 0 
7f0000004000-7f0000005000 r--p 00000000 08:01 9     /tmp/with space/lib x.so
7f0000005000-7f0000006000 r--p 00000000 08:01 10    /tmp/gone.so (deleted)
7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0     [stack]
";
        let files = parse_maps(maps);
        assert_eq!(
            files,
            vec![
                PathBuf::from("/opt/t/site-packages/torch/lib/libtorch_cpu.so"),
                PathBuf::from("/tmp/with space/lib x.so")
            ]
        );
        assert_eq!(torch_lib_in(&files), Some(PathBuf::from("/opt/t/site-packages/torch/lib")));
        assert_eq!(torch_lib_in(&files[1..]), None);
    }

    #[test]
    fn a_cpu_only_torch_is_named_in_one_line() {
        let dir = scratch("cpu-only");
        let lib = dir.join("torch/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join(LIBTORCH_CPU), b"").unwrap();
        let e = load_cuda_beside(&[lib.join(LIBTORCH_CPU)]).unwrap_err();
        assert!(
            e.contains("CPU-only") && e.contains(&lib.display().to_string()) && !e.contains('\n'),
            "{e}"
        );
        let e = load_cuda_beside(&[]).unwrap_err();
        assert!(e.contains("not loaded"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_virtual_env_of_any_python_version_is_searched() {
        let dir = scratch("venv");
        let venv = dir.as_path();
        assert_eq!(from_virtual_env(venv), None);
        let site = venv.join("lib/python3.12/site-packages");
        std::fs::create_dir_all(site.join("torch/lib")).unwrap();
        std::fs::create_dir_all(site.join("nvidia/cu13/lib")).unwrap();
        std::fs::create_dir_all(site.join("nvidia/nccl/lib")).unwrap();
        std::fs::create_dir_all(venv.join("lib/python3.9/site-packages")).unwrap();
        assert_eq!(from_virtual_env(venv), None, "torch/lib without libtorch_cpu.so is no torch");
        std::fs::write(site.join("torch/lib").join(LIBTORCH_CPU), b"").unwrap();
        let w = from_virtual_env(venv).expect("found");
        let site = site.canonicalize().unwrap();
        assert_eq!(
            (w.source, w.torch_dir.clone(), w.site_packages()),
            (Source::VirtualEnv, site.join("torch"), site.clone())
        );
        assert_eq!(w.cuda_lib_dirs(), vec![site.join("nvidia/cu13/lib")]);
        assert_eq!(w.nccl_lib_dir(), Some(site.join("nvidia/nccl/lib")));
        let _ = std::fs::remove_dir_all(dir);
    }
}
