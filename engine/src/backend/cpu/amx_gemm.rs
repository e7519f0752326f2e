//! bf16 GEMM on Intel AMX: `C = alpha·op(A)·op(B) + beta·C` with A and B holding bf16 values in
//! f32 slots and C f32 — what [`super::bf16_gemm`] computes, on the tile unit instead of zmm.
//!
//! Why: `tdpbf16ps` multiplies a 16 × 32 bf16 tile by a 32 × 16 one into 16 × 16 f32 (8192
//! products) in one instruction issued every 16 cycles on Sapphire Rapids: 1024 FLOP per cycle
//! per core against `vdpbf16ps`'s 128. libtorch's bf16 autocast on such a CPU runs oneDNN's AMX
//! GEMMs; without these the engine's bf16 step lost to eager by 2× there (docs/measurements.md
//! "AMX and the bf16 baseline").
//!
//! Layout (Intel SDM, "TDPBF16PS"): the A tile is 16 rows of M, each 16 pair words along k (a
//! u32 = bf16(x[2p]) low, bf16(x[2p + 1]) high — row-major bf16 read as u32s); the B tile is 16
//! pair rows of k, each 16 words of N pairing (B[2p, j], B[2p + 1, j]) — exactly the NR-column
//! panel [`super::bf16_gemm`] packs, read 64 bytes of a 128-byte row at a time. C[m, n] +=
//! Σ_p A[m, 2p]·B[2p, n] + A[m, 2p + 1]·B[2p + 1, n] in f32.
//!
//! Shape of the algorithm: the same five loops as the AVX-512 kernel, with k padded to whole
//! tiles (zero pairs) and a 32 × 32 block of C in four tile registers (tmm0–3) fed by two A tiles
//! (tmm4–5) and two B tiles (tmm6–7) per 32 k: 4 tile multiplies per 4 tile loads. The block is
//! stored to a 4 KiB scratch and added into C with alpha, beta and the edge masks.
//!
//! The kernel asks Linux for the tile state once (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`, Linux 5.16 and later), as oneDNN does; a refusal makes it unavailable.
//!
//! Reference: Intel SDM vol. 2, TDPBF16PS / TILELOADD / LDTILECFG; Intel optimization reference
//! manual, "Intel AMX"; tested against `gemm::sgemm_reference` on bf16-rounded inputs.

#[cfg(target_arch = "x86_64")]
use super::bf16_gemm::{pack_b, pair_rows, transpose16, words_of_32, Operand, NR};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

/// Rows of C per register block: two tiles of 16.
const MR: usize = 32;
/// Pair words per k tile.
const KT: usize = 16;
/// k per packed block: 32 tiles, so a 32 × 32 block's scratch round trip is amortised over 32
/// steps and k up to 1024 (every hidden size but the MLP's) is one block: C is written once.
/// Against 512 (with NC 2048): +5–19 % on one thread at mlp up / mlp down / gpt2's LM head
/// (docs/measurements.md, "AMX and the bf16 baseline").
const KC: usize = 1024;
/// Rows per packed A block (a multiple of MR): 128 × 512 words = 256 KiB, in L2.
const MC: usize = 128;
/// Columns per packed B block (a multiple of NR): 1024 × 512 words = 2 MiB, the L2 of one
/// Sapphire Rapids core.
const NC: usize = 1024;

/// Whether this CPU and kernel run the kernel: AVX-512 BF16 (packing, epilogue), AMX-TILE and
/// AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22) and Linux's grant of the tile data. Checked once.
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            // CPUID leaf 7 exists on every AVX-512 CPU (checked first).
            let amx = super::bf16_gemm::available() && {
                let edx = __cpuid_count(7, 0).edx;
                edx & (1 << 24) != 0 && edx & (1 << 22) != 0
            };
            amx && request_tile_data()
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            false
        }
    })
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: true when granted (asm/prctl.h).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a request by value; no memory is passed.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

/// One thread's packed blocks: A (MC rows of KC/2 words), B (grown to the widest block seen).
struct Packs {
    a: Vec<u32>,
    b: Vec<u32>,
}

thread_local! {
    static PACKS: RefCell<Packs> = RefCell::new(Packs { a: vec![0; MC * KC / 2], b: Vec::new() });
}

/// Single-threaded `C = alpha·op(A)·op(B) + beta·C`, row-major, as `blas::sgemm_st` (`ta`: A
/// stored (K, M); `tb`: B stored (N, K); `beta = 0` does not read C). A and B are read as bf16
/// (rounded to nearest even).
///
/// # Safety
/// As `blas::sgemm_st`; [`available`] is true; `m, n, k > 0`.
#[allow(clippy::too_many_arguments, reason = "BLAS-shaped on purpose: it mirrors cblas_sgemm")]
pub unsafe fn gemm_st(
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    debug_assert!(available() && m > 0 && n > 0 && k > 0);
    #[cfg(target_arch = "x86_64")]
    PACKS.with_borrow_mut(|p| {
        let a_op = Operand { ptr: a, ld: lda, trans: ta };
        let b_op = Operand { ptr: b, ld: ldb, trans: tb };
        let b_len = NC.min(n).next_multiple_of(NR) * KC.min(k).div_ceil(2).next_multiple_of(KT);
        if p.b.len() < b_len {
            p.b.resize(b_len, 0);
        }
        configure_tiles();
        let mut scratch = [0f32; MR * NR];
        for j0 in (0..n).step_by(NC) {
            let nc = NC.min(n - j0);
            for p0 in (0..k).step_by(KC) {
                let kc = KC.min(k - p0);
                let kc2p = kc.div_ceil(2).next_multiple_of(KT);
                pack_b_padded(&b_op, p0, kc, j0, nc, kc2p, &mut p.b);
                // The first k block scales C by beta; the later ones add to it.
                let beta = if p0 == 0 { beta } else { 1.0 };
                for i0 in (0..m).step_by(MC) {
                    let mc = MC.min(m - i0);
                    pack_a_rows(&a_op, i0, mc, p0, kc, kc2p, &mut p.a);
                    for q in 0..nc.div_ceil(NR) {
                        let bp = p.b.as_ptr().add(q * kc2p * NR);
                        let cols = NR.min(nc - q * NR);
                        for r in 0..mc.div_ceil(MR) {
                            let ap = p.a.as_ptr().add(r * MR * kc2p);
                            block(ap, kc2p, bp, kc2p / KT, &mut scratch);
                            let rows = MR.min(mc - r * MR);
                            let cp = c.add((i0 + r * MR) * ldc + j0 + q * NR);
                            add_into_c(&scratch, cp, ldc, rows, cols, alpha, beta);
                        }
                    }
                }
            }
        }
        // Back to the init state: the kernel need not save 8 KiB of tiles at a switch.
        std::arch::asm!("tilerelease", options(nostack));
    });
}

/// Palette 1 with tmm0–7 all 16 rows × 64 bytes (the 64-byte LDTILECFG operand: palette,
/// start row, 14 reserved bytes, 16 × u16 bytes per row, 16 × u8 rows).
#[cfg(target_arch = "x86_64")]
unsafe fn configure_tiles() {
    #[repr(C, align(64))]
    struct TileConfig([u8; 64]);
    let mut cfg = TileConfig([0; 64]);
    cfg.0[0] = 1;
    for t in 0..8 {
        cfg.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
        cfg.0[48 + t] = 16;
    }
    std::arch::asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
}

/// B's panels as [`pack_b`] packs them, each `kc2p` pair rows long: rows past kc's pairs zero.
#[cfg(target_arch = "x86_64")]
unsafe fn pack_b_padded(
    b: &Operand,
    p0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    kc2p: usize,
    out: &mut [u32],
) {
    pack_b(b, p0, kc, j0, nc, kc2p, out);
    let kc2 = kc.div_ceil(2);
    for q in 0..nc.div_ceil(NR) {
        out[(q * kc2p + kc2) * NR..(q + 1) * kc2p * NR].fill(0);
    }
}

/// Packs A's rows i0..i0 + mc and k p0..p0 + kc row-major as pair words, `kc2p` words a row
/// (word `i·kc2p + kp` pairs op(A)[i0 + i, p0 + 2kp] and its k + 1 neighbour); words past kc's
/// pairs and rows up to the next multiple of MR are zero.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_a_rows(
    a: &Operand,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    kc2p: usize,
    out: &mut [u32],
) {
    let rows = mc.next_multiple_of(MR);
    assert!(out.len() >= rows * kc2p, "A's pack holds {} words", out.len());
    out[mc * kc2p..rows * kc2p].fill(0);
    if !a.trans {
        // A (M, K): a row's bf16 values in order are its pair words; 32 floats at a time.
        for i in 0..mc {
            let src = a.ptr.add((i0 + i) * a.ld + p0);
            let dst = out.as_mut_ptr().add(i * kc2p);
            for kp0 in (0..kc2p).step_by(16) {
                let v = words_of_32(src.add(2 * kp0), kc.saturating_sub(2 * kp0));
                _mm512_storeu_si512(dst.add(kp0).cast(), v);
            }
        }
    } else {
        // A stored (K, M): rows 2kp and 2kp + 1 give the pair words of 16 rows of op(A) at one
        // kp; 16 such kp are transposed in registers into 16 words of each of the 16 rows.
        let kc2 = kc.div_ceil(2);
        let mut words = [[0u32; 16]; 16];
        for kp0 in (0..kc2p).step_by(16) {
            for i in (0..mc).step_by(16) {
                let w = 16.min(mc - i);
                for (t, row) in words.iter_mut().enumerate() {
                    let kp = kp0 + t;
                    if kp < kc2 {
                        let r0 = a.ptr.add((p0 + 2 * kp) * a.ld + i0 + i);
                        let r1 = (2 * kp + 1 < kc).then(|| r0.add(a.ld));
                        pair_rows(r0, r1, w, row.as_mut_ptr());
                    } else {
                        *row = [0; 16];
                    }
                }
                let mut r: [__m512i; 16] =
                    std::array::from_fn(|t| _mm512_loadu_si512(words[t].as_ptr().cast()));
                transpose16(&mut r);
                for (j, v) in r.iter().enumerate().take(w) {
                    _mm512_storeu_si512(out.as_mut_ptr().add((i + j) * kc2p + kp0).cast(), *v);
                }
            }
        }
    }
}

/// The 32 × 32 block: scratch (row-major, NR floats a row) = Σ over `tiles` k tiles of A's two
/// 16-row tiles (`ap`, rows `a_row` words apart) times B's two 16-column tiles (`bp`, NR words a
/// pair row).
#[cfg(target_arch = "x86_64")]
unsafe fn block(ap: *const u32, a_row: usize, bp: *const u32, tiles: usize, scratch: &mut [f32]) {
    debug_assert!(tiles > 0 && scratch.len() >= MR * NR);
    let a_stride = a_row * 4;
    let b_stride = NR * 4;
    let c_stride = NR * 4;
    let c = scratch.as_mut_ptr();
    std::arch::asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        "2:",
        "tileloadd tmm4, [{a0} + {sa}*1]",
        "tileloadd tmm5, [{a1} + {sa}*1]",
        "tileloadd tmm6, [{b} + {sb}*1]",
        "tileloadd tmm7, [{b} + {sb}*1 + 64]",
        "tdpbf16ps tmm0, tmm4, tmm6",
        "tdpbf16ps tmm1, tmm4, tmm7",
        "tdpbf16ps tmm2, tmm5, tmm6",
        "tdpbf16ps tmm3, tmm5, tmm7",
        "add {a0}, 64",
        "add {a1}, 64",
        "add {b}, {b_step}",
        "dec {n}",
        "jnz 2b",
        "tilestored [{c0} + {sc}*1], tmm0",
        "tilestored [{c0} + {sc}*1 + 64], tmm1",
        "tilestored [{c1} + {sc}*1], tmm2",
        "tilestored [{c1} + {sc}*1 + 64], tmm3",
        a0 = inout(reg) ap => _,
        a1 = inout(reg) ap.add(16 * a_row) => _,
        b = inout(reg) bp => _,
        n = inout(reg) tiles => _,
        sa = in(reg) a_stride,
        sb = in(reg) b_stride,
        sc = in(reg) c_stride,
        b_step = in(reg) KT * b_stride,
        c0 = in(reg) c,
        c1 = in(reg) c.add(16 * NR),
        out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
        out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
        options(nostack),
    );
}

/// C[0..rows, 0..cols] = alpha·scratch + beta·C (`beta = 0` does not read C).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_into_c(
    scratch: &[f32],
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    alpha: f32,
    beta: f32,
) {
    let mask = |n: usize| -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            (1u16 << n) - 1
        }
    };
    let (va, vb) = (_mm512_set1_ps(alpha), _mm512_set1_ps(beta));
    for i in 0..rows {
        let row = c.add(i * ldc);
        for h in 0..NR / 16 {
            let m = mask(cols.saturating_sub(16 * h));
            let mut v = _mm512_mul_ps(va, _mm512_loadu_ps(scratch.as_ptr().add(i * NR + 16 * h)));
            if beta != 0.0 {
                v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, row.add(16 * h)), v);
            }
            _mm512_mask_storeu_ps(row.add(16 * h), m, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::bf16_gemm::check_against_the_reference;

    /// Every flag pair, shapes off the tile and block sizes (m not a multiple of 16, MR or MC, n
    /// of NR or NC, odd k across KC blocks and not a whole k tile), beta 0 and not, against the
    /// f64 reference on the bf16-rounded inputs: |Δ| ≤ 4·(k + 2)·ε (f32 additions, terms ≤ 1).
    #[test]
    fn amx_gemm_matches_the_reference_on_rounded_inputs() {
        if !available() {
            eprintln!("skipped: this CPU or kernel has no AMX-BF16");
            return;
        }
        let shapes = [(1, 1, 1), (13, 33, 3), (150, 40, 517), (7, 2085, 64), (300, 70, 1055)];
        check_against_the_reference(gemm_st, &shapes);
    }
}
