//! bf16 GEMM on AVX-512 BF16: `C = alpha·op(A)·op(B) + beta·C` where A and B hold bf16 values
//! in f32 slots (the CPU engine's storage of bf16 tensors) and C is f32.
//!
//! Why: a bf16 graph's matmuls multiply bf16 values, and the f32 GEMM spends a full f32 FMA on
//! each product. `vdpbf16ps` (Cooper Lake, Sapphire Rapids and later, AMD Zen 4 and later) does
//! two bf16 products per f32 lane and adds them to an f32 accumulator: twice the f32 FMA's work
//! per instruction. The products of two bf16 values are exact in f32, so the result is the f32
//! GEMM's on the same values up to the order of the f32 additions (pairs of k summed first) —
//! what autocast's bf16 GEMMs (oneDNN, cuBLAS) compute too. One difference from the
//! instruction's f32 sibling: `vdpbf16ps` flushes subnormal inputs and outputs to zero (below
//! 1.2e-38, where bf16 and f32 share their exponent range).
//!
//! Shape of the algorithm: BLIS/GotoBLAS's five loops, as llm.c and the `gemm` crate lay them
//! out. Blocks of B (KC × NC) and A (MC × KC) are packed as bf16 *pair words* — a u32 holding
//! bf16(x[2p]) in its low and bf16(x[2p + 1]) in its high half, the operand `vdpbf16ps` takes —
//! rounded to nearest even (values already bf16 pass unchanged). B's panel is NR = 32 columns (two
//! zmm), A's MR = 12 rows (one broadcast pair word each), so a 12 × 32 tile of C lives in 24 zmm
//! accumulators across the block's k. An odd k pads its last pair with a zero.
//!
//! Packing buffers are per thread, sized once at first use (no allocation after the first call
//! on a thread: the planned executor's no-allocation claim).
//!
//! Reference: Intel SDM, VDPBF16PS; Goto & van de Geijn, "Anatomy of high-performance matrix
//! multiplication" (2008); tested against `gemm::sgemm_reference` on bf16-rounded inputs.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

/// Rows of the register tile (one broadcast pair word each).
const MR: usize = 12;
/// Columns of the register tile: two zmm of 16 f32.
pub(super) const NR: usize = 32;
/// k per packed block (even, so only a matrix's last block has an odd k).
const KC: usize = 256;
/// Rows per packed A block (a multiple of MR).
const MC: usize = 144;
/// Columns per packed B block (a multiple of NR): B's block lives in L3 (4 MiB), each A block
/// is packed once per B block, so a wide block packs A fewer times.
const NC: usize = 8192;

/// Whether this CPU runs the kernel (AVX-512 F/BW and BF16), checked once.
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// One thread's packed blocks: A (MC × KC/2 words), B (up to NC × KC/2: grown to the widest
/// block this thread has packed, so a thread that only sees narrow matrices keeps less than
/// NC's 4 MiB).
struct Packs {
    a: Vec<u32>,
    b: Vec<u32>,
}

thread_local! {
    static PACKS: RefCell<Packs> = RefCell::new(Packs {
        a: vec![0; MC * KC / 2],
        b: Vec::new(),
    });
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
        let b_len = NC.min(n).next_multiple_of(NR) * KC.min(k).div_ceil(2);
        if p.b.len() < b_len {
            p.b.resize(b_len, 0);
        }
        for j0 in (0..n).step_by(NC) {
            let nc = NC.min(n - j0);
            for p0 in (0..k).step_by(KC) {
                let kc = KC.min(k - p0);
                let kc2 = kc.div_ceil(2);
                pack_b(&b_op, p0, kc, j0, nc, kc2, &mut p.b);
                // The first k block scales C by beta; the later ones add to it.
                let beta = if p0 == 0 { beta } else { 1.0 };
                for i0 in (0..m).step_by(MC) {
                    let mc = MC.min(m - i0);
                    pack_a(&a_op, i0, mc, p0, kc, &mut p.a);
                    for q in 0..nc.div_ceil(NR) {
                        let bp = p.b.as_ptr().add(q * kc2 * NR);
                        let cols = NR.min(nc - q * NR);
                        for r in 0..mc.div_ceil(MR) {
                            let rows = MR.min(mc - r * MR);
                            let cp = c.add((i0 + r * MR) * ldc + j0 + q * NR);
                            let ap = p.a.as_ptr().add(r * kc2 * MR);
                            tile(kc2, ap, bp, cp, ldc, rows, cols, alpha, beta);
                        }
                    }
                }
            }
        }
    });
}

/// A matrix operand as stored: `op(X)[i, p]` is `ptr[i·ld + p]`, or `ptr[p·ld + i]` when
/// `trans`.
#[derive(Clone, Copy)]
pub(super) struct Operand {
    pub(super) ptr: *const f32,
    pub(super) ld: usize,
    pub(super) trans: bool,
}

/// Packs B's rows p0..p0 + kc and columns j0..j0 + nc as NR-column panels of `rows` ≥ kc2 pair
/// rows (the AMX kernel pads k to whole tiles; rows past kc2 are left as they are): word
/// `(q·rows + kp)·NR + c` pairs op(B)[p0 + 2kp, j] and op(B)[p0 + 2kp + 1, j], j = j0 + q·NR + c;
/// columns past nc are zero.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn pack_b(
    b: &Operand,
    p0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    rows: usize,
    out: &mut [u32],
) {
    let kc2 = kc.div_ceil(2);
    debug_assert!(rows >= kc2);
    let panels = nc.div_ceil(NR);
    assert!(out.len() >= panels * rows * NR, "B's pack holds {} words", out.len());
    let out = out.as_mut_ptr();
    if !b.trans {
        // B (K, N): rows 2kp and 2kp + 1 give a panel's 32 words side by side.
        for kp in 0..kc2 {
            let r0 = b.ptr.add((p0 + 2 * kp) * b.ld + j0);
            let r1 = (2 * kp + 1 < kc).then(|| r0.add(b.ld));
            for q in 0..panels {
                let w = NR.min(nc - q * NR);
                let dst = out.add((q * rows + kp) * NR);
                pair_rows(r0.add(q * NR), r1.map(|r| r.add(q * NR)), w, dst);
                pair_rows(
                    r0.add(q * NR + 16),
                    r1.map(|r| r.add(q * NR + 16)),
                    w.saturating_sub(16),
                    dst.add(16),
                );
            }
        }
    } else {
        // B stored (N, K): column j of op(B) is a contiguous row of k; 16 columns at a time
        // are transposed into the panel's rows (one half of each).
        for q in 0..panels {
            for h in 0..NR / 16 {
                let first = q * NR + h * 16;
                let cols = 16.min(nc.saturating_sub(first));
                let src = b.ptr.add((j0 + first) * b.ld + p0);
                transpose_in(src, b.ld, cols, kc, out.add(q * rows * NR + h * 16), NR, 0xffff);
            }
        }
    }
}

/// Packs A's rows i0..i0 + mc and k p0..p0 + kc as MR-row panels: word `(r·kc2 + kp)·MR + i`
/// pairs op(A)[i0 + r·MR + i, p0 + 2kp] and its k + 1 neighbour; rows past mc are zero.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_a(a: &Operand, i0: usize, mc: usize, p0: usize, kc: usize, out: &mut [u32]) {
    let kc2 = kc.div_ceil(2);
    let panels = mc.div_ceil(MR);
    assert!(out.len() >= panels * kc2 * MR, "A's pack holds {} words", out.len());
    let out = out.as_mut_ptr();
    if !mc.is_multiple_of(MR) {
        let r = panels - 1;
        std::slice::from_raw_parts_mut(out.add(r * kc2 * MR), kc2 * MR).fill(0);
    }
    if !a.trans {
        // A (M, K): row i is contiguous in k; a panel's MR rows are transposed into its words.
        for r in 0..panels {
            let rows = MR.min(mc - r * MR);
            let src = a.ptr.add((i0 + r * MR) * a.ld + p0);
            transpose_in(src, a.ld, rows, kc, out.add(r * kc2 * MR), MR, (1 << MR) - 1);
        }
    } else {
        // A stored (K, M): rows 2kp and 2kp + 1 give all mc words of a k pair side by side.
        let mut words = [0u32; 16];
        let tmp = words.as_mut_ptr();
        for kp in 0..kc2 {
            let r0 = a.ptr.add((p0 + 2 * kp) * a.ld + i0);
            let r1 = (2 * kp + 1 < kc).then(|| r0.add(a.ld));
            for r in 0..panels {
                let w = MR.min(mc - r * MR);
                pair_rows(r0.add(r * MR), r1.map(|x| x.add(r * MR)), w, tmp);
                std::ptr::copy_nonoverlapping(tmp, out.add((r * kc2 + kp) * MR), w);
            }
        }
    }
}

/// dst[0..16] = pair words of (r0[j], r1[j]) for j < w (w ≤ 16; r1 None reads zeros), zero for
/// j ≥ w.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
pub(super) unsafe fn pair_rows(r0: *const f32, r1: Option<*const f32>, w: usize, dst: *mut u32) {
    let mask: __mmask16 = if w >= 16 { 0xffff } else { (1u16 << w) - 1 };
    let lo = _mm512_maskz_loadu_ps(mask, r0);
    let hi = match r1 {
        Some(r) => _mm512_maskz_loadu_ps(mask, r),
        None => _mm512_setzero_ps(),
    };
    let lo =
        _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(lo)));
    let hi =
        _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(hi)));
    _mm512_storeu_si512(dst.cast(), _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi)));
}

/// The pair words of x[0..left.min(32)] (16 words; floats past `left` read as zero): the bf16
/// values in order, which little-endian u32s read as pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
pub(super) unsafe fn words_of_32(x: *const f32, left: usize) -> __m512i {
    let mask = |n: usize| -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            (1u16 << n) - 1
        }
    };
    let lo = _mm512_maskz_loadu_ps(mask(left), x);
    let hi = _mm512_maskz_loadu_ps(mask(left.saturating_sub(16)), x.add(16));
    // Lanes 0..16 of the result from `lo`, 16..32 from `hi`.
    std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo))
}

/// Packs `rows` (≤ 16) rows of k (`kc` floats each, rows `ld` apart from `src`) transposed:
/// word `kp·stride + i` of `dst` is row i's pair kp, for the lanes in `keep` (rows past `rows`
/// are zero). 16 × 16 words at a time, transposed in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn transpose_in(
    src: *const f32,
    ld: usize,
    rows: usize,
    kc: usize,
    dst: *mut u32,
    stride: usize,
    keep: __mmask16,
) {
    let kc2 = kc.div_ceil(2);
    let mut r = [_mm512_setzero_si512(); 16];
    for kp0 in (0..kc2).step_by(16) {
        for (i, v) in r.iter_mut().enumerate() {
            *v = if i < rows {
                words_of_32(src.add(i * ld + 2 * kp0), kc - 2 * kp0)
            } else {
                _mm512_setzero_si512()
            };
        }
        transpose16(&mut r);
        for (kp, v) in r.iter().enumerate().take(kc2 - kp0) {
            _mm512_mask_storeu_epi32(dst.add((kp0 + kp) * stride).cast(), keep, *v);
        }
    }
}

/// Transposes 16 × 16 u32s held as 16 rows: afterwards r[j] holds what was column j.
/// Four rounds of unpack/shuffle (32-bit, 64-bit, 128-bit lanes, 256-bit halves).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn transpose16(r: &mut [__m512i; 16]) {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for i in 0..4 {
        let (a, b) = (4 * i, 4 * i + 2);
        r[4 * i] = _mm512_unpacklo_epi64(t[a], t[b]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[a], t[b]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[a + 1], t[b + 1]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[a + 1], t[b + 1]);
    }
    for h in 0..2 {
        for i in 0..4 {
            let (a, b) = (8 * h + i, 8 * h + i + 4);
            t[8 * h + i] = _mm512_shuffle_i32x4::<0x88>(r[a], r[b]);
            t[8 * h + i + 4] = _mm512_shuffle_i32x4::<0xdd>(r[a], r[b]);
        }
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_i32x4::<0x88>(t[i], t[i + 8]);
        r[i + 8] = _mm512_shuffle_i32x4::<0xdd>(t[i], t[i + 8]);
    }
}

/// The register tile: C[0..rows, 0..cols] = alpha·Σ_kp a·b + beta·C over kc2 pair words (`beta =
/// 0` does not read C). `ap`: MR words per kp; `bp`: NR words per kp.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments, reason = "a tile's operands, extent and scaling")]
unsafe fn tile(
    kc2: usize,
    ap: *const u32,
    bp: *const u32,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    alpha: f32,
    beta: f32,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for kp in 0..kc2 {
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(kp * NR).cast()));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(kp * NR + 16).cast()));
        let a = ap.add(kp * MR);
        for (i, acc) in acc.iter_mut().enumerate() {
            let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i) as i32));
            acc[0] = _mm512_dpbf16_ps(acc[0], ai, b0);
            acc[1] = _mm512_dpbf16_ps(acc[1], ai, b1);
        }
    }
    let m0: __mmask16 = if cols >= 16 { 0xffff } else { (1u16 << cols) - 1 };
    let m1: __mmask16 = if cols >= 32 {
        0xffff
    } else if cols > 16 {
        (1u16 << (cols - 16)) - 1
    } else {
        0
    };
    let (va, vb) = (_mm512_set1_ps(alpha), _mm512_set1_ps(beta));
    for (i, acc) in acc.iter().enumerate().take(rows) {
        let row = c.add(i * ldc);
        for (h, mask) in [(0usize, m0), (1, m1)] {
            let mut v = _mm512_mul_ps(va, acc[h]);
            if beta != 0.0 {
                v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask, row.add(16 * h)), v);
            }
            _mm512_mask_storeu_ps(row.add(16 * h), mask, v);
        }
    }
}

/// A bf16 kernel's single-threaded entry point, as [`gemm_st`] (and `amx_gemm::gemm_st`).
pub type GemmSt = unsafe fn(
    bool,
    bool,
    usize,
    usize,
    usize,
    f32,
    *const f32,
    usize,
    *const f32,
    usize,
    f32,
    *mut f32,
    usize,
);

/// Runs `gemm` at each (m, n, k) for every transpose pair, padded leading dimensions and beta 0
/// (C's rows NaN: not read) and 0.5, with alpha 0.7, on random values in ±[0.1, 1) that are not
/// bf16-exact, against the f64 reference on the bf16-rounded inputs: |Δ| ≤ 4·(k + 2)·ε over
/// all of C, its padding columns included (kept).
#[cfg(test)]
pub(super) fn check_against_the_reference(gemm: GemmSt, shapes: &[(usize, usize, usize)]) {
    use crate::backend::cpu::gemm::{sgemm_reference, Transpose};
    use crate::ops::testutil::Rng;
    let round =
        |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect() };
    let t = |x: bool| if x { Transpose::Yes } else { Transpose::No };
    for &(m, n, k) in shapes {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let (lda, ldb, ldc) = (if ta { m } else { k } + 3, if tb { k } else { n } + 1, n + 2);
            let mut rng = Rng::new((m * n + k) as u64);
            let a = rng.vec_f32(if ta { k } else { m } * lda);
            let b = rng.vec_f32(if tb { n } else { k } * ldb);
            let (ar, br) = (round(&a), round(&b));
            for beta in [0.0f32, 0.5] {
                let c0 = rng.vec_f32(m * ldc);
                let mut want = c0.clone();
                let (ta_, tb_) = (t(ta), t(tb));
                sgemm_reference(ta_, tb_, m, n, k, 0.7, &ar, lda, &br, ldb, beta, &mut want, ldc)
                    .unwrap();
                let mut got = c0.clone();
                if beta == 0.0 {
                    for i in 0..m {
                        got[i * ldc..i * ldc + n].fill(f32::NAN);
                    }
                }
                let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), got.as_mut_ptr());
                // SAFETY: the buffers hold the shapes and leading dimensions given.
                unsafe { gemm(ta, tb, m, n, k, 0.7, ap, lda, bp, ldb, beta, cp, ldc) };
                let tol = 4.0 * (k as f32 + 2.0) * f32::EPSILON;
                for i in 0..m * ldc {
                    assert!(
                        (got[i] - want[i]).abs() <= tol,
                        "{m}x{n}x{k} ta={ta} tb={tb} beta={beta} @{i}: {} vs {}",
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-register transpose moves element (i, j) to (j, i) for all 256 (distinct) words.
    #[test]
    fn transpose16_transposes() {
        if !available() {
            return;
        }
        let m: Vec<u32> = (0..256).map(|x| x * 7 + 3).collect();
        let mut r: [__m512i; 16] =
            std::array::from_fn(|i| unsafe { _mm512_loadu_si512(m[16 * i..].as_ptr().cast()) });
        unsafe { transpose16(&mut r) };
        let mut got = vec![0u32; 256];
        for (i, v) in r.iter().enumerate() {
            unsafe { _mm512_storeu_si512(got[16 * i..].as_mut_ptr().cast(), *v) };
        }
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(got[16 * j + i], m[16 * i + j], "({i}, {j})");
            }
        }
    }

    /// Every flag pair, shapes off the tile and block sizes (m not a multiple of MR or MC, n of NR
    /// or NC, odd k across KC blocks), beta 0 and not, against the f64 reference on the
    /// bf16-rounded inputs: |Δ| ≤ 4·(k + 2)·ε (f32 additions, terms ≤ 1).
    #[test]
    fn bf16_gemm_matches_the_reference_on_rounded_inputs() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let shapes = [(1, 1, 1), (13, 33, 3), (150, 40, 517), (7, 1030, 64), (300, 70, 255)];
        check_against_the_reference(gemm_st, &shapes);
    }
}
