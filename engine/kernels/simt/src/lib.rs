//! Host SIMT harness: the engine's GPU kernels (`engine/kernels/*.cu`) compiled as C++ for the
//! CPU (through `port.cuh`'s host branch, `simt/host.h`) and run as fibers on the calling
//! thread, so the kernel tests run — and fail — on machines with no GPU, CI included.
//!
//! A launch runs the blocks one at a time; a block's threads are fibers (user-space contexts,
//! one stack each) that take turns in a schedule [`Order`] with real barriers (`__syncthreads`)
//! and emulated warp collectives at a chosen warp size (32 as on NVIDIA, 64 as on AMD CDNA).
//! Taking turns makes every race deterministic (run a test under [`Order::Forward`] and
//! [`Order::Reverse`] and a missing barrier shows in one of them) and turns a barrier that not
//! every thread reaches into an error rather than a hang. Arguments go as in `cuLaunchKernel`:
//! each a pointer to its value ([`Arg`]). Launches from several threads take turns, each running
//! on its caller's thread.
//!
//! [`Buf`] is a host buffer in a kernel's storage dtype with guard bands on both sides, so an
//! out-of-bounds write is caught too.

use std::ffi::{c_char, c_void, CStr, CString};

extern "C" {
    fn simt_kernel_count() -> u64;
    fn simt_kernel_name(i: u64) -> *const c_char;
    fn simt_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        smem: u32,
        warp: u32,
        order: u32,
        args: *mut *mut c_void,
        err: *mut c_char,
        err_len: u64,
    ) -> i32;
}

/// The order in which a block's threads take turns between barriers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Forward,
    Reverse,
    /// A permutation seeded by the value (≥ 2).
    Shuffled(u32),
    /// Forward order, but the earliest runnable thread always runs next: early warps race
    /// ahead into the next phase while later ones have not finished the last (round-robin
    /// orders let every warp finish a phase first). Exposes a missing barrier that guards
    /// shared memory against being overwritten while slower warps still read it.
    Greedy,
}

impl Order {
    fn code(self) -> u32 {
        match self {
            Order::Forward => 0,
            Order::Reverse => 1,
            Order::Shuffled(s) => s.clamp(2, 0x7fff_ffff),
            Order::Greedy => 0x8000_0000,
        }
    }
}

/// One kernel argument, as the kernel's C signature declares it.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(*mut c_void),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
}

impl Arg {
    fn word(&self) -> u64 {
        match *self {
            Arg::Ptr(p) => p as u64,
            Arg::U64(v) => v,
            Arg::I64(v) => v as u64,
            Arg::I32(v) => v as u32 as u64,
            Arg::U32(v) => v as u64,
            Arg::F32(v) => v.to_bits() as u64,
        }
    }
}

/// Names of every kernel the harness was built with (each `ORT_REGISTER`ed kernel).
pub fn kernel_names() -> Vec<String> {
    // SAFETY: the registry is filled by static initialisers before main and never changes.
    (0..unsafe { simt_kernel_count() })
        .map(|i| unsafe { CStr::from_ptr(simt_kernel_name(i)) }.to_string_lossy().into_owned())
        .collect()
}

/// Runs kernel `name` on `grid` × `block` threads with `smem` bytes of dynamic shared memory.
///
/// # Safety
/// Pointer arguments must point to buffers as large as the kernel will touch for these sizes
/// ([`Buf`] guard bands catch a small overrun after the fact, not a large one).
pub unsafe fn launch(
    name: &str,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem: u32,
    warp: u32,
    order: Order,
    args: &[Arg],
) -> Result<(), String> {
    let mut words: Vec<u64> = args.iter().map(Arg::word).collect();
    let mut ptrs: Vec<*mut c_void> =
        words.iter_mut().map(|w| w as *mut u64 as *mut c_void).collect();
    let cname = CString::new(name).map_err(|e| e.to_string())?;
    let g = [grid.0, grid.1, grid.2];
    let b = [block.0, block.1, block.2];
    let mut err = vec![0u8; 1024];
    let rc = simt_launch(
        cname.as_ptr(),
        g.as_ptr(),
        b.as_ptr(),
        smem,
        warp,
        order.code(),
        ptrs.as_mut_ptr(),
        err.as_mut_ptr() as *mut c_char,
        err.len() as u64,
    );
    if rc == 0 {
        Ok(())
    } else {
        Err(CStr::from_bytes_until_nul(&err)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default())
    }
}

/// A kernel buffer's element type in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    BF16,
    I64,
    I32,
    U8,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I64 => 8,
            Dtype::I32 => 4,
            Dtype::U8 => 1,
        }
    }
    /// The suffix of the kernel instantiated for this storage type.
    pub fn suffix(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::BF16 => "bf16",
            Dtype::I64 => "i64",
            Dtype::I32 => "i32",
            Dtype::U8 => "u8",
        }
    }
    /// `x` rounded to this dtype (round to nearest even) and back.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F16 => half::f16::from_f32(x).to_f32(),
            Dtype::BF16 => half::bf16::from_f32(x).to_f32(),
            _ => x,
        }
    }
}

/// Bytes of guard band on each side of a [`Buf`]'s elements.
pub const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xA5;

/// A host buffer of `len` elements of `dtype`, 16-byte aligned (or, [`Buf::misaligned`], one
/// element off), between two guard bands.
pub struct Buf {
    words: Vec<u128>,
    pub dtype: Dtype,
    pub len: usize,
    /// Bytes before the first element: the guard band, plus one element when misaligned.
    front: usize,
}

impl Buf {
    fn raw(len: usize, dtype: Dtype) -> Buf {
        let bytes = 2 * GUARD + (len + 1) * dtype.size();
        let mut b = Buf { words: vec![0u128; bytes.div_ceil(16)], dtype, len, front: GUARD };
        b.bytes_all().fill(GUARD_BYTE);
        b
    }
    /// This buffer's elements moved one element up, so the first is not 16-byte aligned (a
    /// kernel's packed 16-byte path must then not run): an operand at an odd offset.
    pub fn misaligned(mut self) -> Buf {
        let (n, es) = (self.len * self.dtype.size(), self.dtype.size());
        let old = self.front;
        self.bytes_all().copy_within(old..old + n, old + es);
        self.bytes_all()[old..old + es].fill(GUARD_BYTE);
        self.front = old + es;
        self
    }
    /// Bytes from the allocation's start to the first element ([`Buf::raw_bytes`]).
    pub fn front(&self) -> usize {
        self.front
    }
    fn bytes_all(&mut self) -> &mut [u8] {
        let n = self.words.len() * 16;
        // SAFETY: u128 storage viewed as bytes.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, n) }
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: as above, the element region after the front guard.
        unsafe {
            std::slice::from_raw_parts(
                (self.words.as_ptr() as *const u8).add(self.front),
                self.len * self.dtype.size(),
            )
        }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        let (n, f) = (self.len * self.dtype.size(), self.front);
        &mut self.bytes_all()[f..f + n]
    }
    /// The whole allocation, guard bands included (to mirror it on a device).
    pub fn raw_bytes(&self) -> &[u8] {
        // SAFETY: u128 storage viewed as bytes.
        unsafe {
            std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.words.len() * 16)
        }
    }
    pub fn raw_bytes_mut(&mut self) -> &mut [u8] {
        self.bytes_all()
    }
    /// Float values stored in `dtype` (rounded to it).
    pub fn from_f32(values: &[f32], dtype: Dtype) -> Buf {
        let mut b = Buf::raw(values.len(), dtype);
        let out = b.bytes_mut();
        for (i, &v) in values.iter().enumerate() {
            match dtype {
                Dtype::F32 => out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
                Dtype::F16 => {
                    out[2 * i..2 * i + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes())
                }
                Dtype::BF16 => {
                    out[2 * i..2 * i + 2].copy_from_slice(&half::bf16::from_f32(v).to_le_bytes())
                }
                Dtype::I64 | Dtype::I32 | Dtype::U8 => panic!("from_f32 into {dtype:?}"),
            }
        }
        b
    }
    pub fn from_i64(values: &[i64]) -> Buf {
        let mut b = Buf::raw(values.len(), Dtype::I64);
        for (c, v) in b.bytes_mut().chunks_exact_mut(8).zip(values) {
            c.copy_from_slice(&v.to_le_bytes());
        }
        b
    }
    pub fn from_i32(values: &[i32]) -> Buf {
        let mut b = Buf::raw(values.len(), Dtype::I32);
        for (c, v) in b.bytes_mut().chunks_exact_mut(4).zip(values) {
            c.copy_from_slice(&v.to_le_bytes());
        }
        b
    }
    /// The elements as integers (I64/I32 buffers).
    pub fn to_i64(&self) -> Vec<i64> {
        let b = self.bytes();
        match self.dtype {
            Dtype::I64 => {
                b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
            }
            Dtype::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
            d => panic!("to_i64 of {d:?}"),
        }
    }
    /// A null pointer argument (an optional buffer left out).
    pub fn null() -> Arg {
        Arg::Ptr(std::ptr::null_mut())
    }
    /// `len` elements filled with a NaN pattern (0xFF bytes): output buffers, so an element the
    /// kernel forgets to write shows.
    pub fn poisoned(len: usize, dtype: Dtype) -> Buf {
        let mut b = Buf::raw(len, dtype);
        b.bytes_mut().fill(0xFF);
        b
    }
    pub fn ptr(&mut self) -> Arg {
        Arg::Ptr(self.bytes_mut().as_mut_ptr() as *mut c_void)
    }
    /// The elements widened to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        let b = self.bytes();
        match self.dtype {
            Dtype::F32 => {
                b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
            }
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes(c.try_into().unwrap()).to_f32())
                .collect(),
            Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes(c.try_into().unwrap()).to_f32())
                .collect(),
            Dtype::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
                .collect(),
            Dtype::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32)
                .collect(),
            Dtype::U8 => b.iter().map(|&x| x as f32).collect(),
        }
    }
    /// Err if a kernel wrote into either guard band.
    pub fn check_guards(&self) -> Result<(), String> {
        let n = self.len * self.dtype.size();
        // SAFETY: the whole allocation as bytes.
        let all = unsafe {
            std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.words.len() * 16)
        };
        let f = self.front;
        let front = all[..f].iter().position(|&x| x != GUARD_BYTE);
        let back = all[f + n..].iter().position(|&x| x != GUARD_BYTE);
        match (front, back) {
            (None, None) => Ok(()),
            (Some(i), _) => Err(format!("write {} bytes before the buffer", f - i)),
            (_, Some(i)) => {
                Err(format!("write {} bytes past the end of the buffer ({} elements)", i, self.len))
            }
        }
    }
}
