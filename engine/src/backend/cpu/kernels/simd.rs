//! Vectorisation helpers: run-time dispatch to AVX-512 / AVX2+FMA copies of a kernel body, and
//! branch-free f32 `exp`, `erf`, `tanh` that LLVM vectorises.
//!
//! The crate is compiled for baseline x86-64 (SSE2), so a hot loop written plainly runs 4 lanes
//! wide without FMA. [`multiversion!`] compiles one `#[inline(always)]` body three times — with
//! `avx512f…`, with `avx2,fma`, and plain — and picks one per call from [`level`] (CPU
//! detection once, overridable with `ORTBENCH_SIMD=avx512|avx2|base` to test or compare paths).
//! Results do not depend on the level: bodies use `mul_add` explicitly (an exact fused
//! multiply-add on every path) and never rely on reassociation; reductions accumulate in
//! [`LANES`] partial sums in a fixed order.
//!
//! The math functions follow Cephes (`expf`, `tanhf`) and Abramowitz & Stegun 7.1.26 (`erf`,
//! max abs error 1.5e-7, 5e-7 evaluated in f32 — the formula ATen's vectorised CPU `erf` uses, so the engine's GELU is
//! as close to PyTorch's as libm's).

use std::sync::atomic::{AtomicU8, Ordering};

/// Instruction-set level of the kernel copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Base,
    V3,
    V4,
}

static LEVEL: AtomicU8 = AtomicU8::new(0);

/// The level kernels run at: the best the CPU has, unless `ORTBENCH_SIMD` says otherwise.
#[inline]
pub fn level() -> Level {
    match LEVEL.load(Ordering::Relaxed) {
        1 => Level::Base,
        2 => Level::V3,
        3 => Level::V4,
        _ => {
            let l = detect();
            LEVEL.store(
                match l {
                    Level::Base => 1,
                    Level::V3 => 2,
                    Level::V4 => 3,
                },
                Ordering::Relaxed,
            );
            l
        }
    }
}

fn detect() -> Level {
    let want = std::env::var("ORTBENCH_SIMD").unwrap_or_default().to_ascii_lowercase();
    #[cfg(target_arch = "x86_64")]
    {
        let v3 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let v4 = v3
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq");
        match want.as_str() {
            "base" | "generic" => Level::Base,
            "avx2" if v3 => Level::V3,
            _ if v4 => Level::V4,
            _ if v3 => Level::V3,
            _ => Level::Base,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = want;
        Level::Base
    }
}

/// `fn $name<G…>(args)` calling the `#[inline(always)]` `$body(args)` compiled for the best
/// instruction set the CPU has.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident<$($g:ident: $bound:path),*>($($a:ident: $t:ty),* $(,)?) $(-> $ret:ty)? => $body:path) => {
        $(#[$m])*
        #[allow(
            clippy::too_many_arguments,
            reason = "the macro forwards whatever the kernel it wraps takes"
        )]
        $vis fn $name<$($g: $bound),*>($($a: $t),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
                #[allow(clippy::too_many_arguments, reason = "the macro forwards whatever the kernel it wraps takes")]
                unsafe fn v4<$($g: $bound),*>($($a: $t),*) $(-> $ret)? {
                    $body($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments, reason = "the macro forwards whatever the kernel it wraps takes")]
                unsafe fn v3<$($g: $bound),*>($($a: $t),*) $(-> $ret)? {
                    $body($($a),*)
                }
                match $crate::backend::cpu::kernels::simd::level() {
                    // SAFETY: the level says the CPU has these features.
                    $crate::backend::cpu::kernels::simd::Level::V4 => return unsafe { v4($($a),*) },
                    $crate::backend::cpu::kernels::simd::Level::V3 => return unsafe { v3($($a),*) },
                    $crate::backend::cpu::kernels::simd::Level::Base => {}
                }
            }
            $body($($a),*)
        }
    };
}
pub(crate) use multiversion;

/// Partial sums per reduction: 16 f32 = one AVX-512 vector (two AVX2 ones).
pub const LANES: usize = 16;

/// Σ x, in LANES partial sums then a fixed-order tree (vectorises without reassociation).
#[inline(always)]
pub fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    for (l, &v) in rest.iter().enumerate() {
        acc[l] += v;
    }
    reduce_add(acc)
}

/// Σ x·y, as [`sum`].
#[inline(always)]
pub fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &y[..n]);
    let full = n / LANES * LANES;
    for (cx, cy) in x[..full].chunks_exact(LANES).zip(y[..full].chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = cx[l].mul_add(cy[l], acc[l]);
        }
    }
    for l in 0..n - full {
        acc[l] = x[full + l].mul_add(y[full + l], acc[l]);
    }
    reduce_add(acc)
}

/// max x (−∞ for an empty slice).
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    for (l, &v) in rest.iter().enumerate() {
        acc[l] = if v > acc[l] { v } else { acc[l] };
    }
    let mut m = f32::NEG_INFINITY;
    for v in acc {
        m = if v > m { v } else { m };
    }
    m
}

#[inline(always)]
fn reduce_add(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0]
}

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// exp(x) underflows to 0 below this (the smallest normal result, 2^-126).
const EXP_LO: f32 = -87.336_55;
/// exp is clamped to exp(88) ≈ 1.65e38 above this (2^127 stays finite).
const EXP_HI: f32 = 88.0;

/// e^x with ~1 ulp error (Cephes `expf`): 2^n · e^r, n = round(x·log2 e), |r| ≤ ln2/2.
/// Exactly 0 for x < −87.34 (and for −∞), NaN for NaN, clamped to e^88 above 88.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Clamped with selects that keep NaN (f32::max would drop it).
    let xc = if x < EXP_LO { EXP_LO } else { x };
    let xc = if xc > EXP_HI { EXP_HI } else { xc };
    // Round to nearest with the 1.5·2^23 trick (exact for |t| < 2^22): the integer n then sits
    // in the low mantissa bits of `t`, which gives 2^n with integer ops only (a float → int
    // `as` cast saturates, and that keeps LLVM from vectorising the loop).
    let t = xc * LOG2E + 12_582_912.0;
    let n = t - 12_582_912.0;
    let r = n.mul_add(-0.693_359_4, xc);
    let r = n.mul_add(2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5); // Cephes: 5.0000001201e-1
    let y = (p * r).mul_add(r, r) + 1.0;
    let scale = f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23);
    let v = y * scale;
    if x < EXP_LO {
        0.0
    } else {
        v
    }
}

/// erf(x), Abramowitz & Stegun 7.1.26 (|error| ≤ 1.5e-7, ≤ 5e-7 in f32): 1 − t·P(t)·e^(−x²), t = 1/(1+p|x|).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / 0.327_591_1f32.mul_add(a, 1.0);
    let mut p = 1.061_405_4f32;
    p = p.mul_add(t, -1.453_152);
    p = p.mul_add(t, 1.421_413_8);
    p = p.mul_add(t, -0.284_496_74);
    p = p.mul_add(t, 0.254_829_6);
    let y = 1.0 - p * t * exp(-a * a);
    if x < 0.0 {
        -y
    } else {
        y
    }
}

/// tanh(x) (Cephes `tanhf`): an odd polynomial for |x| < 0.625, else 1 − 2/(e^(2|x|) + 1).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let z = x * x;
    let mut p = -5.704_988_7e-3f32;
    p = p.mul_add(z, 2.063_909e-2);
    p = p.mul_add(z, -5.373_972e-2);
    p = p.mul_add(z, 1.333_144e-1);
    p = p.mul_add(z, -3.333_328e-1);
    let small = (p * z).mul_add(x, x);
    let big = 1.0 - 2.0 / (exp(2.0 * a) + 1.0);
    let big = if x < 0.0 { -big } else { big };
    if a < 0.625 {
        small
    } else {
        big
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> impl Iterator<Item = f32> {
        (-20000..=20000).map(|i| i as f32 * 1e-3)
    }

    #[test]
    fn exp_is_within_2_ulp_of_libm_and_handles_the_edges() {
        for x in grid().chain([-87.0, -80.5, 50.0, 87.9]) {
            let (a, b) = (exp(x), x.exp());
            assert!((a - b).abs() <= 2.0 * f32::EPSILON * b, "exp({x}) = {a} vs {b}");
        }
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-1000.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(100.0).is_finite());
        assert_eq!(exp(0.0), 1.0);
    }

    /// A&S 7.1.26 is within 1.5e-7 of erf in exact arithmetic; evaluated in f32 the worst case
    /// on this grid is 4.3e-7 (a few ulps of values near ±1).
    #[test]
    fn erf_and_tanh_match_libm() {
        let (mut worst_erf, mut worst_tanh) = (0f32, 0f32);
        for x in grid() {
            worst_erf = worst_erf.max((erf(x) - libm::erff(x)).abs());
            let t = x.tanh();
            worst_tanh = worst_tanh.max((tanh(x) - t).abs() / t.abs().max(f32::MIN_POSITIVE));
        }
        assert!(worst_erf <= 5e-7, "erf: max abs error {worst_erf:e}");
        assert!(worst_tanh <= 4.0 * f32::EPSILON, "tanh: max rel error {worst_tanh:e}");
    }

    #[test]
    fn reductions_match_sequential_sums() {
        let x: Vec<f32> =
            (0..1001).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01 + 0.001).collect();
        let s: f64 = x.iter().map(|&v| v as f64).sum();
        assert!((sum(&x) as f64 - s).abs() < 1e-4);
        let d: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
        assert!((dot(&x, &x) as f64 - d).abs() < 1e-3);
        assert_eq!(max(&x), x.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }
}
