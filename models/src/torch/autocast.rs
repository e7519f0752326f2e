//! `torch.autocast(device_type, dtype=…)` for the baseline, through a C++ shim
//! (autocast.cpp): tch itself can only enable CUDA autocast in fp16.

use std::ffi::{c_char, c_int, CStr};

use tch::Device;

use crate::ModelError;

extern "C" {
    fn ortbench_autocast_enter(cuda: c_int, bf16: c_int, err: *mut c_char, len: c_int) -> c_int;
    fn ortbench_autocast_exit(cuda: c_int, err: *mut c_char, len: c_int) -> c_int;
}

/// The lower-precision dtype autocast computes matmuls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutocastDtype {
    F16,
    Bf16,
}

fn check(rc: c_int, err: &[c_char; 512], what: &str) -> Result<(), ModelError> {
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: the shim NUL-terminates whatever it writes into `err`, which starts zeroed.
    let msg = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
    Err(ModelError::Training(format!("{what}: {msg}")))
}

/// Leaves autocast when `f` panics (a libtorch error inside the forward pass), so the thread's
/// autocast state is restored for whoever catches the panic.
struct ExitOnUnwind(c_int);

impl Drop for ExitOnUnwind {
    fn drop(&mut self) {
        let mut err = [0 as c_char; 512];
        // SAFETY: as in `autocast`; the error, if any, is lost with the panic in flight.
        unsafe { ortbench_autocast_exit(self.0, err.as_mut_ptr(), 512) };
    }
}

/// Runs `f` with autocast enabled on `device` in `dtype` (as `with torch.autocast(…):`).
pub fn autocast<T>(
    device: Device,
    dtype: AutocastDtype,
    f: impl FnOnce() -> T,
) -> Result<T, ModelError> {
    let cuda = c_int::from(device.is_cuda());
    let mut err = [0 as c_char; 512];
    // SAFETY: plain C calls into libtorch; `err` outlives them and its length is passed.
    let rc = unsafe {
        ortbench_autocast_enter(
            cuda,
            c_int::from(dtype == AutocastDtype::Bf16),
            err.as_mut_ptr(),
            512,
        )
    };
    check(rc, &err, "entering autocast")?;
    let guard = ExitOnUnwind(cuda);
    let out = f();
    std::mem::forget(guard);
    // SAFETY: as above.
    let rc = unsafe { ortbench_autocast_exit(cuda, err.as_mut_ptr(), 512) };
    check(rc, &err, "leaving autocast")?;
    Ok(out)
}
