//! The AMD backend, so far: a loader of ours for the HIP runtime (`libamdhip64`, which carries
//! hiprtc in ROCm 5.x/6.x), the device count, and hiprtc compiling the engine's kernel sources
//! (`engine/kernels/*.cu`, the same files the CUDA backend compiles) into a code object for a
//! `gfx` target. The executor, hipBLASLt and RCCL use come with the GPU executor (README,
//! "Devices"): today `--device rocm` stops with an error saying what is missing.
//!
//! Why our own loader: no Rust crate covers HIP + hiprtc + hipBLASLt + RCCL together (notes in
//! `shared/notes/gpu-facts.md`), and loading at run time (libloading) keeps the binary building
//! and running on machines without ROCm; a missing library is an error naming what was looked
//! for. Search order: `ORTBENCH_ROCM_LIB_DIR` (colon-separated), `$ROCM_PATH/lib`,
//! `/opt/rocm/lib`, then the loader's path by SONAME (Debian's `libamdhip64-5`).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::backend::gpu_sources;

/// What can go wrong with the AMD backend.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum HipError {
    #[error("{lib} not found (tried {tried}): is ROCm installed? Set ORTBENCH_ROCM_LIB_DIR to the folder that holds it")]
    LibraryNotFound { lib: &'static str, tried: String },
    #[error("{lib} has no symbol {symbol}: ROCm too old?")]
    Symbol { lib: &'static str, symbol: &'static str },
    #[error("HIP runtime: {0}")]
    Runtime(String),
    #[error("hiprtc could not compile {file} for {arch}:\n{log}")]
    Rtc { file: String, arch: String, log: String },
    #[error("no kernel file named '{0}' in engine/kernels")]
    UnknownKernel(String),
}

type HiprtcProgram = *mut c_void;

/// The entry points used, resolved once.
struct Api {
    get_device_count: unsafe extern "C" fn(*mut c_int) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    create_program: unsafe extern "C" fn(
        *mut HiprtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile_program: unsafe extern "C" fn(HiprtcProgram, c_int, *const *const c_char) -> c_int,
    get_log_size: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> c_int,
    get_log: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> c_int,
    get_code_size: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> c_int,
    get_code: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> c_int,
    destroy_program: unsafe extern "C" fn(*mut HiprtcProgram) -> c_int,
    rtc_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    _lib: libloading::Library,
}

const LIB: &str = "libamdhip64";
const NAMES: [&str; 3] = ["libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"];

/// Every path or name tried for libamdhip64, in order.
pub fn candidates() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var("ORTBENCH_ROCM_LIB_DIR")
        .map(|v| v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect())
        .unwrap_or_default();
    if let Some(r) = std::env::var_os("ROCM_PATH") {
        dirs.push(PathBuf::from(r).join("lib"));
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    let mut out: Vec<PathBuf> =
        dirs.iter().flat_map(|d| NAMES.iter().map(move |n| d.join(n))).collect();
    out.extend(NAMES.iter().map(PathBuf::from));
    out
}

fn api() -> Result<&'static Api, HipError> {
    static API: OnceLock<Result<Api, HipError>> = OnceLock::new();
    API.get_or_init(|| load_from(&candidates())).as_ref().map_err(|e| e.clone())
}

/// Loads the first of `tried` that opens (a bare name goes through the loader's search; a path
/// must exist) and resolves the entry points.
fn load_from(tried: &[PathBuf]) -> Result<Api, HipError> {
    let lib = tried
        .iter()
        .filter(|p| p.components().count() == 1 || p.exists())
        // SAFETY: loading the HIP runtime runs its initialisers, which need nothing from us.
        .find_map(|p| unsafe { libloading::Library::new(p) }.ok())
        .ok_or_else(|| HipError::LibraryNotFound {
            lib: LIB,
            tried: tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        })?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol's C signature is the one declared in `Api` (hip_runtime_api.h,
            // hiprtc.h of ROCm 5.2–6.x).
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|_| HipError::Symbol { lib: LIB, symbol: $name })?
        };
    }
    Ok(Api {
        get_device_count: sym!("hipGetDeviceCount"),
        get_error_string: sym!("hipGetErrorString"),
        create_program: sym!("hiprtcCreateProgram"),
        compile_program: sym!("hiprtcCompileProgram"),
        get_log_size: sym!("hiprtcGetProgramLogSize"),
        get_log: sym!("hiprtcGetProgramLog"),
        get_code_size: sym!("hiprtcGetCodeSize"),
        get_code: sym!("hiprtcGetCode"),
        destroy_program: sym!("hiprtcDestroyProgram"),
        rtc_error_string: sym!("hiprtcGetErrorString"),
        _lib: lib,
    })
}

/// Whether the HIP runtime loads here (no GPU needed).
pub fn available() -> Result<(), HipError> {
    api().map(|_| ())
}

/// How many AMD GPUs the runtime sees: an error if the runtime is missing; Ok(0) when it loads
/// but finds none (`hipErrorNoDevice`).
pub fn device_count() -> Result<usize, HipError> {
    let a = api()?;
    let mut n: c_int = 0;
    // SAFETY: n is a valid out pointer.
    let rc = unsafe { (a.get_device_count)(&mut n) };
    const HIP_ERROR_NO_DEVICE: c_int = 100;
    match rc {
        0 => Ok(n.max(0) as usize),
        HIP_ERROR_NO_DEVICE => Ok(0),
        // SAFETY: hipGetErrorString returns a static C string for any code.
        e => Err(HipError::Runtime(format!(
            "hipGetDeviceCount: {}",
            unsafe { CStr::from_ptr((a.get_error_string)(e)) }.to_string_lossy()
        ))),
    }
}

/// Compiles kernel file `file` (port.cuh pasted in) for `arch` with hiprtc: the code object
/// (an ELF, loadable with hipModuleLoadData).
pub fn compile(file: &str, arch: &str) -> Result<Vec<u8>, HipError> {
    let a = api()?;
    let src =
        gpu_sources::full_source(file).ok_or_else(|| HipError::UnknownKernel(file.to_string()))?;
    let csrc = CString::new(src).map_err(|e| HipError::Rtc {
        file: file.into(),
        arch: arch.into(),
        log: e.to_string(),
    })?;
    let cname = CString::new(file).unwrap_or_default();
    let opts: Vec<CString> = gpu_sources::hiprtc_options(arch)
        .into_iter()
        .map(|o| CString::new(o).unwrap_or_default())
        .collect();
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let rtc = |rc: c_int, what: &str| -> Result<(), HipError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: hiprtcGetErrorString returns a static C string.
        let msg =
            unsafe { CStr::from_ptr((a.rtc_error_string)(rc)) }.to_string_lossy().into_owned();
        Err(HipError::Rtc { file: file.into(), arch: arch.into(), log: format!("{what}: {msg}") })
    };
    let mut prog: HiprtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is a live NUL-terminated string or an out pointer; the program is
    // destroyed below on every path.
    unsafe {
        rtc(
            (a.create_program)(
                &mut prog,
                csrc.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            ),
            "hiprtcCreateProgram",
        )?;
        let rc = (a.compile_program)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
        let out = if rc != 0 {
            let mut n = 0usize;
            (a.get_log_size)(prog, &mut n);
            let mut log = vec![0u8; n + 1];
            (a.get_log)(prog, log.as_mut_ptr() as *mut c_char);
            let log = CStr::from_bytes_until_nul(&log)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            Err(HipError::Rtc { file: file.into(), arch: arch.into(), log })
        } else {
            let mut n = 0usize;
            rtc((a.get_code_size)(prog, &mut n), "hiprtcGetCodeSize").and_then(|_| {
                let mut code = vec![0u8; n];
                rtc((a.get_code)(prog, code.as_mut_ptr() as *mut c_char), "hiprtcGetCode")
                    .map(|_| code)
            })
        };
        (a.destroy_program)(&mut prog);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_put_the_configured_dirs_first_and_end_with_sonames() {
        // Only this test sets the variable in this process's unit tests.
        std::env::set_var("ORTBENCH_ROCM_LIB_DIR", "/opt/x");
        let c = candidates();
        std::env::remove_var("ORTBENCH_ROCM_LIB_DIR");
        assert_eq!(c[0], PathBuf::from("/opt/x/libamdhip64.so.6"));
        assert_eq!(c.last().unwrap(), &PathBuf::from("libamdhip64.so"));
    }

    #[test]
    fn the_loader_names_what_it_tried_when_the_library_is_absent() {
        // The real loader on a search list with nothing there (the machine may have ROCm).
        let tried = [
            PathBuf::from("/nonexistent/rocm/lib/libamdhip64.so.6"),
            PathBuf::from("libamdhip64-not-a-real-soname.so.9"),
        ];
        let msg = load_from(&tried).err().expect("nothing to load").to_string();
        assert_eq!(msg, "libamdhip64 not found (tried /nonexistent/rocm/lib/libamdhip64.so.6, libamdhip64-not-a-real-soname.so.9): is ROCm installed? Set ORTBENCH_ROCM_LIB_DIR to the folder that holds it");
    }
}
