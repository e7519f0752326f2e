use super::{footprint, num_threads, Call, GemmError, Transpose};
use libloading::Library;
use std::ffi::{c_char, c_int, c_void};
use std::fmt;
use std::path::{Path, PathBuf};

const ROW_MAJOR: c_int = 101; // CblasRowMajor
const NO_TRANS: c_int = 111; // CblasNoTrans
const TRANS: c_int = 112; // CblasTrans
const INTERFACE_LP64: c_int = 0; // MKL_INTERFACE_LP64
const THREADING_INTEL: c_int = 0; // MKL_THREADING_INTEL
const THREADING_SEQUENTIAL: c_int = 1; // MKL_THREADING_SEQUENTIAL
const THREADING_GNU: c_int = 3; // MKL_THREADING_GNU

/// `libmkl_rt` file names, newest first (MKL 2026.x wheels ship `.so.3`, 2021–2025 `.so.2`).
const NAMES: [&str; 3] = ["libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"];

// Prototypes from mkl_cblas.h (LP64: MKL_INT = int; enums are C ints).
pub type SgemmFn = unsafe extern "C" fn(
    layout: c_int,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: f32,
    c: *mut f32,
    ldc: c_int,
);
type SgemmBatchStridedFn = unsafe extern "C" fn(
    layout: c_int,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: f32,
    a: *const f32,
    lda: c_int,
    stridea: c_int,
    b: *const f32,
    ldb: c_int,
    strideb: c_int,
    beta: f32,
    c: *mut f32,
    ldc: c_int,
    stridec: c_int,
    batch_size: c_int,
);
// Prototypes from mkl_service.h.
type SetLayerFn = unsafe extern "C" fn(c_int) -> c_int;
type SetThreadsFn = unsafe extern "C" fn(c_int);
/// `MKL_Set_Num_Threads_Local`: a thread-local thread count, returning the previous one.
pub type SetLocalFn = unsafe extern "C" fn(c_int) -> c_int;
type VersionFn = unsafe extern "C" fn(*mut c_char, c_int);

/// A loaded `libmkl_rt` with the entry points we use. Lives in a `static` for the whole
/// process, so the function pointers never outlive their library.
pub struct MklLib {
    path: PathBuf,
    version: String,
    threading: String,
    sgemm: SgemmFn,
    sgemm_batch_strided: Option<SgemmBatchStridedFn>,
    set_num_threads: SetThreadsFn,
    set_num_threads_local: Option<SetLocalFn>,
    _lib: Library,
    _openmp: Option<Library>,
}

impl fmt::Debug for MklLib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MklLib")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("threading", &self.threading)
            .finish_non_exhaustive()
    }
}

/// Where to look for `libmkl_rt`, in order (see the module docs of `gemm`).
pub fn candidates() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("ORTBENCH_MKL_LIB").filter(|p| !p.is_empty()) {
        // Named explicitly: that library or none.
        let p = PathBuf::from(p);
        return if p.is_dir() { NAMES.iter().map(|n| p.join(n)).collect() } else { vec![p] };
    }
    let mut dirs = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV").filter(|v| !v.is_empty()) {
        dirs.push(PathBuf::from(venv).join("lib"));
    }
    // The project venv, found from this crate's source folder at compile time.
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/lib"));
    let mut dirs: Vec<PathBuf> = dirs.into_iter().map(|d| d.canonicalize().unwrap_or(d)).collect();
    dirs.dedup();
    let mut out: Vec<PathBuf> =
        dirs.iter().flat_map(|d| NAMES.iter().map(move |n| d.join(n))).collect();
    out.extend(NAMES.iter().map(PathBuf::from)); // bare names: the system loader's search
    out
}

impl MklLib {
    /// Load the first candidate that is a usable `libmkl_rt`, or say what each one lacked.
    pub fn load(candidates: &[PathBuf]) -> Result<MklLib, GemmError> {
        let mut searched = Vec::new();
        for path in candidates {
            if path.components().count() > 1 && !path.exists() {
                searched.push(format!("  {}: not found", path.display()));
                continue;
            }
            match Self::open(path) {
                Ok(lib) => return Ok(lib),
                Err(why) => searched.push(format!("  {}: {why}", path.display())),
            }
        }
        Err(GemmError::MklUnavailable { searched: searched.join("\n") })
    }

    #[cfg(not(unix))]
    fn open(_path: &Path) -> Result<MklLib, String> {
        Err("loading MKL is implemented for Linux/Unix only".into())
    }

    #[cfg(unix)]
    fn open(path: &Path) -> Result<MklLib, String> {
        use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: loading runs the library's initialisers; libmkl_rt's only set up its
        // dispatcher state. RTLD_LOCAL keeps its symbols out of the global namespace.
        let lib: Library = unsafe { UnixLibrary::open(Some(path), RTLD_NOW | RTLD_LOCAL) }
            .map_err(|e| dl_error(&e))?
            .into();
        // SAFETY: each symbol is looked up with the C prototype from MKL's headers
        // (mkl_cblas.h, mkl_service.h, LP64: MKL_INT = int); the pointers are copied out and
        // stored next to `lib`, which is never dropped before them.
        let (sgemm, batch, set_local, set_interface, set_layer, set_threads, version) = unsafe {
            let get = |name: &[u8]| -> Result<*mut c_void, String> {
                lib.get::<*mut c_void>(name).map(|s| *s).map_err(|_| {
                    let name = String::from_utf8_lossy(&name[..name.len() - 1]);
                    format!("not an MKL runtime library (no symbol {name})")
                })
            };
            (
                std::mem::transmute::<*mut c_void, SgemmFn>(get(b"cblas_sgemm\0")?),
                get(b"cblas_sgemm_batch_strided\0")
                    .ok()
                    .map(|p| std::mem::transmute::<*mut c_void, SgemmBatchStridedFn>(p)),
                get(b"MKL_Set_Num_Threads_Local\0")
                    .ok()
                    .map(|p| std::mem::transmute::<*mut c_void, SetLocalFn>(p)),
                std::mem::transmute::<*mut c_void, SetLayerFn>(get(b"MKL_Set_Interface_Layer\0")?),
                std::mem::transmute::<*mut c_void, SetLayerFn>(get(b"MKL_Set_Threading_Layer\0")?),
                std::mem::transmute::<*mut c_void, SetThreadsFn>(get(b"MKL_Set_Num_Threads\0")?),
                std::mem::transmute::<*mut c_void, VersionFn>(get(b"MKL_Get_Version_String\0")?),
            )
        };
        // Both layers must be chosen before any other MKL call, which would fix them.
        // LP64 explicitly: an inherited MKL_INTERFACE_LAYER=ILP64 would make MKL read our
        // 32-bit integers as 64-bit ones.
        // SAFETY: plain C calls with integer arguments, before any other MKL call.
        unsafe { set_interface(INTERFACE_LP64) };
        let (layer, threading, openmp) = choose_threading(path.parent());
        if let Some(layer) = layer {
            // SAFETY: as above.
            unsafe { set_layer(layer) };
        }
        let mut buf = [0 as c_char; 256];
        // SAFETY: MKL writes at most `len` bytes (NUL-terminated) into `buf`.
        unsafe { version(buf.as_mut_ptr(), buf.len() as c_int) };
        let full: Vec<u8> = buf.iter().take_while(|&&ch| ch != 0).map(|&ch| ch as u8).collect();
        let full = String::from_utf8_lossy(&full).into_owned();
        let mkl = MklLib {
            path: path.canonicalize().unwrap_or_else(|_| path.to_path_buf()),
            version: short_version(&full),
            threading,
            sgemm,
            sgemm_batch_strided: batch,
            set_num_threads_local: set_local,
            set_num_threads: set_threads,
            _lib: lib,
            _openmp: openmp,
        };
        mkl.set_threads(num_threads());
        Ok(mkl)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cblas_sgemm` itself, for callers that run single-threaded calls on their own threads
    /// (`backend::cpu::blas`), with [`set_num_threads_local_fn`](Self::set_num_threads_local_fn).
    pub fn sgemm_fn(&self) -> SgemmFn {
        self.sgemm
    }

    /// `MKL_Set_Num_Threads_Local` (every MKL since 11.x has it; None for an odd build).
    pub fn set_num_threads_local_fn(&self) -> Option<SetLocalFn> {
        self.set_num_threads_local
    }

    /// e.g. "2026.2".
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The OpenMP threading layer chosen, and why.
    pub fn threading(&self) -> &str {
        &self.threading
    }

    pub(super) fn set_threads(&self, n: usize) {
        let n = n.clamp(1, c_int::MAX as usize) as c_int;
        // SAFETY: plain C call; MKL's thread setting is process-wide and thread-safe.
        unsafe { (self.set_num_threads)(n) };
    }

    pub(super) fn sgemm(&self, call: &Call, a: &[f32], b: &[f32], c: &mut [f32]) {
        let Some(d) = Dims32::new(call) else {
            // Beyond MKL's 32-bit indices: the gemm crate takes usize dimensions.
            return super::rust_gemm::sgemm(call, a, b, c);
        };
        // SAFETY: `Call::validate` checked that op(A), op(B) and C at these leading
        // dimensions lie inside the slices, and `Dims32` that every integer fits MKL's
        // 32-bit `MKL_INT`; `c` is a unique borrow, so it aliases neither input.
        unsafe {
            (self.sgemm)(
                ROW_MAJOR,
                d.ta,
                d.tb,
                d.m,
                d.n,
                d.k,
                call.alpha,
                a.as_ptr(),
                d.lda,
                b.as_ptr(),
                d.ldb,
                call.beta,
                c.as_mut_ptr(),
                d.ldc,
            )
        }
    }

    /// One `cblas_sgemm_batch_strided` call when possible (returns false otherwise, and the
    /// caller loops): symbol present, strides fit 32 bits, C matrices do not overlap.
    pub(super) fn sgemm_batch_strided(
        &self,
        call: &Call,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
        batch: usize,
        strides: [usize; 3],
    ) -> bool {
        let Some(f) = self.sgemm_batch_strided else {
            return false;
        };
        let Some(d) = Dims32::new(call) else {
            return false;
        };
        let c_footprint = footprint(call.m, call.n, call.ldc).unwrap_or(usize::MAX);
        if batch > 1 && strides[2] < c_footprint {
            return false; // interleaved or overlapping C: MKL would write it concurrently
        }
        let fits = |x: usize| c_int::try_from(x).ok();
        let (Some(sa), Some(sb), Some(sc), Some(nb)) =
            (fits(strides[0]), fits(strides[1]), fits(strides[2]), fits(batch))
        else {
            return false;
        };
        // SAFETY: `Call::validate` checked (batch-1)*stride + footprint <= len for A, B and
        // C; the C matrices are disjoint (checked above), every integer fits `MKL_INT`, and
        // `c` is a unique borrow, so it aliases neither input.
        unsafe {
            f(
                ROW_MAJOR,
                d.ta,
                d.tb,
                d.m,
                d.n,
                d.k,
                call.alpha,
                a.as_ptr(),
                d.lda,
                sa,
                b.as_ptr(),
                d.ldb,
                sb,
                call.beta,
                c.as_mut_ptr(),
                d.ldc,
                sc,
                nb,
            )
        };
        true
    }
}

/// libloading's `Display` says only "dlopen failed"; the loader's reason is its source.
fn dl_error(e: &libloading::Error) -> String {
    use std::error::Error;
    match e.source() {
        Some(why) => why.to_string(),
        None => e.to_string(),
    }
}

/// A call's integers as MKL's LP64 `MKL_INT` (32-bit); `None` when one does not fit.
struct Dims32 {
    ta: c_int,
    tb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    lda: c_int,
    ldb: c_int,
    ldc: c_int,
}

impl Dims32 {
    fn new(call: &Call) -> Option<Dims32> {
        let t = |t: Transpose| if t == Transpose::Yes { TRANS } else { NO_TRANS };
        let i = |x: usize| c_int::try_from(x).ok();
        Some(Dims32 {
            ta: t(call.ta),
            tb: t(call.tb),
            m: i(call.m)?,
            n: i(call.n)?,
            k: i(call.k)?,
            lda: i(call.lda)?,
            ldb: i(call.ldb)?,
            ldc: i(call.ldc)?,
        })
    }
}

/// "Intel(R) oneAPI Math Kernel Library Version 2026.2-Product Build …" → "2026.2".
fn short_version(full: &str) -> String {
    full.split_once("Version ")
        .and_then(|(_, rest)| rest.split(['-', ' ']).next())
        .filter(|v| !v.is_empty())
        .unwrap_or(full)
        .to_string()
}

/// Pick MKL's OpenMP layer: `(layer to set, description, OpenMP library to keep loaded)`.
///
/// With libtorch's `libgomp` loaded, the Intel layer forced runs on one thread (`libgomp`'s
/// `omp_*` shadow `libiomp5`'s), while the GNU layer comes close to the Intel layer alone
/// (figures: docs/measurements.md).
#[cfg(unix)]
fn choose_threading(dir: Option<&Path>) -> (Option<c_int>, String, Option<Library>) {
    use libloading::os::unix::{Library as UnixLibrary, RTLD_GLOBAL, RTLD_NOW};
    if let Ok(layer) = std::env::var("MKL_THREADING_LAYER") {
        if !layer.is_empty() {
            return (None, format!("MKL_THREADING_LAYER={layer} from the environment"), None);
        }
    }
    let this = UnixLibrary::this();
    // SAFETY: only checks whether the symbols resolve in the process' global scope; the
    // pointers are never called or dereferenced.
    let has = |name: &[u8]| unsafe { this.get::<*mut c_void>(name).is_ok() };
    if has(b"__kmpc_fork_call\0") {
        return (Some(THREADING_INTEL), "intel openmp (libiomp5 already loaded)".into(), None);
    }
    if has(b"GOMP_parallel\0") {
        let why = "gnu openmp (libgomp already loaded in the process, e.g. by libtorch)";
        return (Some(THREADING_GNU), why.into(), None);
    }
    let mut tried: Vec<PathBuf> = Vec::new();
    if let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) {
        tried.push(dir.join("libiomp5.so"));
    }
    tried.push(PathBuf::from("libiomp5.so"));
    for path in tried {
        if path.components().count() > 1 && !path.exists() {
            continue;
        }
        // SAFETY: loading runs libiomp5's initialisers (OpenMP runtime setup, no threads
        // yet). RTLD_GLOBAL is what makes its symbols visible to libmkl_intel_thread.
        if let Ok(lib) = unsafe { UnixLibrary::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) } {
            let why = format!("intel openmp ({})", path.display());
            return (Some(THREADING_INTEL), why, Some(lib.into()));
        }
    }
    let why = "sequential: no libiomp5.so next to libmkl_rt nor on the loader path (install \
               the intel-openmp wheel)";
    (Some(THREADING_SEQUENTIAL), why.into(), None)
}

#[cfg(not(unix))]
fn choose_threading(_dir: Option<&Path>) -> (Option<c_int>, String, Option<Library>) {
    (None, "MKL default".into(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_shortened() {
        let full = "Intel(R) oneAPI Math Kernel Library Version 2026.2-Product Build 20260915 \
                    for Intel(R) 64 architecture applications";
        assert_eq!(short_version(full), "2026.2");
        assert_eq!(short_version("odd"), "odd");
    }

    #[test]
    fn missing_library_is_an_error_naming_what_was_searched() {
        let bogus = PathBuf::from("/nonexistent/ortbench/libmkl_rt.so.2");
        let err = MklLib::load(std::slice::from_ref(&bogus)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/ortbench/libmkl_rt.so.2: not found"), "{msg}");
        assert!(msg.contains("ORTBENCH_GEMM=gemm"), "{msg}");
    }
}
