//! engine/kernels/attention.cu (flash-style forward; backward as `attention_backward_dq`,
//! which also writes delta = rowsum(dO ⊙ O), then `attention_backward_dkdv`) against the CPU
//! kernels in engine/src/backend/cpu/kernels/attention.rs, in f32/f16/bf16 on every test device
//! (SIMT warp 32/64 × both thread orders; or the GPU).
//!
//! Cases: sizes that are not multiples of the tiles (T = 37 against the executor's tiles of 8,
//! 16, 32 and 64 and bq > bk — each case gives the device just the shared memory its tiles
//! need, so the launcher's own choice picks them —, Tq ≠ Tk both ways, Dv ≠ D), causal and not, no mask / a (B, 1, 1, Tk) key-padding mask (−1e4 or −∞)
//! / a (1, H, Tq, Tk) mask / left padding under the causal mask (the first keys of batch 1 −∞,
//! so its first queries see no key: zeros out, LSE +∞, zero gradients, as torch's sdpa), dropout
//! 0 and 0.1 (nonzero offset), HF's eager left padding (the padded keys at bfloat16's finfo.min,
//! finite: its queries with no key attend to their keys alike, a max that absorbs log l — what
//! the kernels keep (m, log l) apart for; −∞ in f16, which cannot hold it), scores soft-capped (Gemma 2: cap·tanh(scale·q·k), caps of 1.5
//! and 2 where scale·q·k spans a few units, so tanh bends) or not, operands in the (B, T, H·D)
//! "heads inside the rows" layout and in (B, H, T, D), so every stride is exercised.
//!
//! Tolerances, per element: f32_rel plus one unit roundoff u of a half dtype relative to the
//! element, and here also a term of the tensor's largest element (`of_largest` in the kernel
//! harness; most kernel tests have none). Attention needs it: its outputs are sums whose terms
//! cancel (out = Σ P·V over V of both signs, lse = max + log Σ, dq and dk sums of dS·K and
//! dS·Q), so an element near zero carries the rounding of terms the size of the largest ones.
//! Measured worst on the SIMT harness, f32, beyond the per-element part: 1e-7 of the largest
//! element (forward), 4e-7 (backward).
//! - f32 forward and lse 1e-5, and 1e-5 of the largest: the online softmax (running max,
//!   rescaled partial sums, one division at the end) and the CPU's two-pass softmax (SIMD-lane
//!   partial sums, a reciprocal) and GEMMs add the same terms in other orders, a few ulp apart;
//!   the CPU's exp is a Cephes polynomial (~1 ulp), the kernel's libm/GPU expf.
//! - f32 backward 1e-5, and 1e-5 of the largest: the same, through four products.
//! - half forward: everything is f32 on both sides from the same rounded inputs and rounded once
//!   at the end, so 1e-5 + u (two nearly equal f32 values may round to neighbouring halfs), and
//!   1e-5 of the largest (the f32 part).
//! - half backward: 1e-5 + 2u, of the element and of the largest. delta = rowsum(dO ⊙ O) reads
//!   O as stored, i.e. rounded to the dtype (what the engine saves), where the CPU sums dP ⊙ P
//!   in f32: delta is off by up to u·Σ|dO||O|, which shifts every dS of its row by P·Δ·scale,
//!   up to about one more u of the largest gradient (measured worst: 0.75u for dq, 0.45u for
//!   dk; f32 cases all within 4e-7).
//!   A wrong index, a wrong dropout element or a missing tile moves an element by a sizeable
//!   fraction of the largest one (≥ 1e-2), well past 2u of f16 (2e-3); for bf16 (2u = 1.6e-2)
//!   the f32 and f16 runs of the same case are the sharp check.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::backend::cpu::kernels::attention::{self as cpu, AttnPlan};
use ortbench_engine::backend::cpu::kernels::softmax::MaskMap;
use ortbench_engine::backend::cpu::pool::Pool;
use ortbench_engine::exec::gpu::launch::attention::{self as launch, Dims, Scores, Strided};
use ortbench_engine::exec::gpu::launch::{Device, Mask as LMask, Seed};
use ortbench_engine::exec::gpu::support::attention_smem;
use ortbench_simt::{Buf, Dtype};

const SEED: u64 = 77;
const OFFSET: u64 = 1000;

#[derive(Clone, Copy, Debug)]
enum Mask {
    None,
    /// (B, 1, 1, Tk): ~25% of the keys (never key 0, so no causal row is all masked) get this
    /// value, the others a random bias in [-1, 1).
    KeyPad(f32),
    /// (1, H, Tq, Tk): random in [-2, 1), ~10% −1e4 (never key 0).
    Full,
    /// (B, 1, 1, Tk): keys 0..n of batch 1 are −∞ (left padding), the rest a random bias.
    LeftPad(usize),
    /// (B, 1, 1, Tk): keys 0..n of batch 1 at HF's eager minimum (bfloat16's finfo.min,
    /// rounded to the dtype: −∞ in f16), the rest a random bias.
    EagerLeftPad(usize),
    /// (1, 1, Tq, Tk): a sliding window of w keys (Mistral's, Qwen2/3's per layer): key j
    /// visible to query i iff i − j < w (0), else −∞; the causal flag cuts the future.
    Window(usize),
}

#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    h: usize,
    /// K/V heads: h for multi-head attention, fewer for grouped-query (a divisor of h).
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    causal: bool,
    mask: Mask,
    p: f32,
    /// The tiles (bq, bk) the launcher picks at this case's shared memory ([`Prob::device`]).
    tiles: (usize, usize),
    /// The scores' tanh soft-cap.
    softcap: Option<f32>,
}

#[allow(clippy::too_many_arguments)]
const fn case(
    b: usize,
    (h, hkv): (usize, usize),
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    causal: bool,
    mask: Mask,
    p: f32,
    tiles: (usize, usize),
) -> Case {
    Case { b, h, hkv, tq, tk, d, dv, causal, mask, p, tiles, softcap: None }
}

/// `c` with its scores soft-capped at `cap`.
const fn capped(c: Case, cap: f32) -> Case {
    Case { softcap: Some(cap), ..c }
}

const CASES: [Case; 12] = [
    case(2, (3, 3), 37, 37, 24, 24, false, Mask::KeyPad(-1e4), 0.0, (16, 16)),
    case(2, (3, 3), 37, 37, 24, 24, true, Mask::None, 0.1, (32, 32)),
    // bq > bk: one partial query tile over two key tiles, causal.
    case(2, (3, 3), 37, 37, 24, 24, true, Mask::KeyPad(f32::NEG_INFINITY), 0.0, (64, 32)),
    case(2, (3, 3), 37, 37, 24, 24, false, Mask::Full, 0.1, (8, 8)),
    // Tq < Tk and Tq > Tk (causal stays top-left aligned), Dv ≠ D.
    case(1, (2, 2), 29, 45, 20, 12, true, Mask::KeyPad(-1e4), 0.1, (16, 16)),
    case(1, (2, 2), 45, 19, 20, 12, true, Mask::Full, 0.0, (64, 64)),
    // Left padding: queries 0..21 of batch 1 see no key (spanning a whole 16-row tile).
    case(2, (2, 2), 37, 37, 16, 16, true, Mask::LeftPad(21), 0.1, (16, 16)),
    // Grouped-query (2 query heads per K/V head) with dropout and padding, and multi-query
    // (every query head on one K/V head) with a per-head mask.
    case(2, (4, 2), 37, 37, 16, 16, true, Mask::KeyPad(-1e4), 0.1, (16, 16)),
    case(1, (3, 1), 29, 45, 20, 12, false, Mask::Full, 0.0, (16, 16)),
    // Soft-capped: grouped-query with padding and dropout; Tq < Tk, Dv ≠ D, left padding.
    capped(case(2, (4, 2), 37, 37, 16, 16, true, Mask::KeyPad(-1e4), 0.1, (16, 16)), 1.5),
    capped(case(2, (2, 2), 29, 45, 20, 12, true, Mask::LeftPad(21), 0.0, (32, 32)), 2.0),
    // Gemma 2 padded as HF runs it: eager left padding, soft-capped.
    capped(case(2, (2, 2), 37, 37, 16, 16, true, Mask::EagerLeftPad(21), 0.1, (16, 16)), 1.5),
];

/// (b, h, t) strides of a (B, H, T, X) operand of `h` heads stored as (B, T, H·X): heads inside
/// the rows.
fn merged(h: usize, t: usize, x: usize) -> [usize; 3] {
    [t * h * x, x, h * x]
}
/// (b, h, t) strides of a contiguous (B, H, T, X) operand of `h` heads.
fn heads_first(h: usize, t: usize, x: usize) -> [usize; 3] {
    [h * t * x, t * x, x]
}
fn at(s: &[usize; 3], b: usize, h: usize, t: usize) -> usize {
    b * s[0] + h * s[1] + t * s[2]
}
/// Buffer `at` with (b, h, t) strides `s`, as the launchers take an operand.
fn st<P>(at: P, s: [usize; 3]) -> Strided<P> {
    Strided { at, strides: s.map(|v| v as i64) }
}

/// Everything one case needs: inputs rounded to the dtype, layouts, the CPU's outputs.
struct Prob {
    c: Case,
    scale: f32,
    qs: [usize; 3],
    ks: [usize; 3],
    vs: [usize; 3],
    os: [usize; 3],
    gs: [usize; 3],
    dqs: [usize; 3],
    dks: [usize; 3],
    dvs: [usize; 3],
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    dout: Vec<f32>,
    mask_shape: [usize; 4],
    mask: Option<Vec<f32>>,
    out: Vec<f32>,
    /// Per query row, log Σ_j exp(s_ij), and (m, log l) as the kernels keep it (f64, rounded).
    lse: Vec<f32>,
    stats: Vec<f32>,
    /// The CPU kernel's statistics for its backward: (max, 1/sum) per query row.
    cpu_stats: Vec<f32>,
}

impl Prob {
    fn new(c: Case, dt: Dtype, seed: u64) -> Prob {
        let mut rng = Rng::new(seed);
        let (nq, nk, nv, no) = (
            c.b * c.h * c.tq * c.d,
            c.b * c.hkv * c.tk * c.d,
            c.b * c.hkv * c.tk * c.dv,
            c.b * c.h * c.tq * c.dv,
        );
        // q, k in [-2, 2): scores of a few units, so the softmax is far from uniform.
        let q = rng.vec(nq, -2.0, 2.0, dt);
        let k = rng.vec(nk, -2.0, 2.0, dt);
        let v = rng.vec(nv, -1.0, 1.0, dt);
        let dout = rng.vec(no, -1.0, 1.0, dt);
        let (mask_shape, mask) = match c.mask {
            Mask::None => ([1, 1, 1, 1], None),
            Mask::KeyPad(pad) => {
                let mut m = rng.vec(c.b * c.tk, -1.0, 1.0, dt);
                for (i, x) in m.iter_mut().enumerate() {
                    if i % c.tk != 0 && rng.below(4) == 0 {
                        *x = dt.round(pad);
                    }
                }
                ([c.b, 1, 1, c.tk], Some(m))
            }
            Mask::LeftPad(n) => {
                let mut m = rng.vec(c.b * c.tk, -1.0, 1.0, dt);
                m[c.tk..c.tk + n].fill(f32::NEG_INFINITY);
                ([c.b, 1, 1, c.tk], Some(m))
            }
            Mask::EagerLeftPad(n) => {
                let mut m = rng.vec(c.b * c.tk, -1.0, 1.0, dt);
                m[c.tk..c.tk + n].fill(dt.round(-3.389_531_4e38));
                ([c.b, 1, 1, c.tk], Some(m))
            }
            Mask::Window(w) => {
                let m = (0..c.tq * c.tk)
                    .map(|x| if x / c.tk < x % c.tk + w { 0.0 } else { f32::NEG_INFINITY })
                    .collect();
                ([1, 1, c.tq, c.tk], Some(m))
            }
            Mask::Full => {
                let mut m = rng.vec(c.h * c.tq * c.tk, -2.0, 1.0, dt);
                for (i, x) in m.iter_mut().enumerate() {
                    if i % c.tk != 0 && rng.below(10) == 0 {
                        *x = dt.round(-1e4);
                    }
                }
                ([1, c.h, c.tq, c.tk], Some(m))
            }
        };
        let mut p = Prob {
            c,
            scale: 1.0 / (c.d as f32).sqrt(),
            qs: merged(c.h, c.tq, c.d),
            ks: heads_first(c.hkv, c.tk, c.d),
            vs: merged(c.hkv, c.tk, c.dv),
            os: merged(c.h, c.tq, c.dv),
            gs: heads_first(c.h, c.tq, c.dv),
            dqs: heads_first(c.h, c.tq, c.d),
            dks: merged(c.hkv, c.tk, c.d),
            dvs: merged(c.hkv, c.tk, c.dv),
            q,
            k,
            v,
            dout,
            mask_shape,
            mask,
            out: vec![f32::NAN; no],
            lse: Vec::new(),
            stats: Vec::new(),
            cpu_stats: vec![f32::NAN; c.b * c.h * c.tq * 2],
        };
        let plan = p.plan();
        let pool = Pool::new(2);
        let mut ws = vec![0f32; plan.forward_workspace(pool.threads())];
        // SAFETY: buffers sized for the plan's shapes and strides (each a permutation of a
        // dense (B, H, T, X) block).
        unsafe {
            cpu::attention_forward(
                &pool,
                &plan,
                p.out.as_mut_ptr(),
                &mut p.cpu_stats,
                p.q.as_ptr(),
                p.k.as_ptr(),
                p.v.as_ptr(),
                p.mask.as_deref(),
                SEED,
                &mut ws,
            )
        };
        (p.lse, p.stats) = p.stats_f64();
        p
    }

    fn plan(&self) -> AttnPlan {
        let c = &self.c;
        AttnPlan {
            b: c.b,
            h: c.h,
            hkv: c.hkv,
            tq: c.tq,
            tk: c.tk,
            d: c.d,
            dv: c.dv,
            scale: self.scale,
            causal: c.causal,
            dropout_p: c.p,
            offset: OFFSET,
            softcap: c.softcap,
            q: self.qs,
            k: self.ks,
            v: self.vs,
            o: self.os,
            dq: self.dqs,
            dk: self.dks,
            dvs: self.dvs,
            mask: self
                .mask
                .as_ref()
                .map(|_| MaskMap::new(&self.mask_shape, &[c.b, c.h, c.tq, c.tk])),
        }
    }

    /// The mask's element strides against (B, H, Tq, Tk), 0 where it broadcasts (as `MaskMap`).
    fn mask_strides(&self) -> [i64; 4] {
        let s = self.mask_shape;
        let mut st = [0i64; 4];
        let mut acc = 1i64;
        for d in (0..4).rev() {
            st[d] = if s[d] == 1 { 0 } else { acc };
            acc *= s[d] as i64;
        }
        st
    }

    /// The mask buffer (if any) as the launchers take it.
    fn mask_arg<'a>(&self, mask: &'a mut Option<Buf>) -> Option<LMask<&'a mut Buf>> {
        mask.as_mut().map(|mask| LMask { mask, strides: self.mask_strides() })
    }

    fn mask_at(&self, b: usize, h: usize, i: usize, j: usize) -> f32 {
        match (&self.mask, self.c.mask) {
            (Some(m), Mask::KeyPad(_) | Mask::LeftPad(_) | Mask::EagerLeftPad(_)) => {
                m[b * self.c.tk + j]
            }
            (Some(m), Mask::Full) => m[(h * self.c.tq + i) * self.c.tk + j],
            (Some(m), Mask::Window(_)) => m[i * self.c.tk + j],
            _ => 0.0,
        }
    }

    /// Per query row, in f64 (the CPU kernel does not produce them): log Σ_j exp(s_ij), and the
    /// (max m, log Σ_j exp(s_ij − m)) pairs the GPU kernels keep, flattened.
    fn stats_f64(&self) -> (Vec<f32>, Vec<f32>) {
        let c = &self.c;
        let (mut out, mut stats) = (Vec::new(), Vec::new());
        for b in 0..c.b {
            for h in 0..c.h {
                for i in 0..c.tq {
                    let s: Vec<f64> = (0..c.tk)
                        .filter(|&j| !(c.causal && j > i))
                        .map(|j| {
                            let hk = h / (c.h / c.hkv);
                            let (qo, ko) = (at(&self.qs, b, h, i), at(&self.ks, b, hk, j));
                            let dot: f64 = (0..c.d)
                                .map(|e| self.q[qo + e] as f64 * self.k[ko + e] as f64)
                                .sum();
                            let u = dot * self.scale as f64;
                            let s = match c.softcap {
                                Some(cap) => cap as f64 * u.tanh(),
                                None => u,
                            };
                            s + self.mask_at(b, h, i, j) as f64
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    // No visible key: +∞ (and (+∞, 0)), so that the backward's P is 0.
                    if m == f64::NEG_INFINITY {
                        out.push(f32::INFINITY);
                        stats.extend([f32::INFINITY, 0.0]);
                    } else {
                        let logl = s.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
                        out.push((m + logl) as f32);
                        stats.extend([m as f32, logl as f32]);
                    }
                }
            }
        }
        (out, stats)
    }

    /// The log-sum-exp of each row from the kernels' (m, log l) pairs, in f64.
    fn lse_of(stats: &[f32]) -> Vec<f32> {
        stats.chunks(2).map(|p| (p[0] as f64 + p[1] as f64) as f32).collect()
    }

    fn dims(&self) -> Dims {
        let Case { b, h, hkv, tq, tk, d, dv, .. } = self.c;
        Dims { b, h, hkv, tq, tk, d, dv }
    }

    fn scores<P>(&self) -> Scores<P> {
        let c = &self.c;
        Scores {
            scale: self.scale,
            softcap: c.softcap,
            causal: c.causal,
            dropout_p: c.p,
            seed: Seed::Value(SEED),
            offset: OFFSET,
        }
    }

    /// `dev`'s geometry with just the shared memory the case's tiles need (the most of the
    /// three kernels'): the launchers' tile choice ([`launch::tiles`]) then picks them, as the
    /// executor would on such a device. Without tensor cores: these are attention.cu's tests
    /// (in f16/bf16 too); the tensor-core kernels have theirs ([`Prob::mma_device`]).
    fn device(&self, dev: &Dev) -> Device {
        let (bq, bk) = self.c.tiles;
        let max_smem = attention_smem(bq, bk, self.c.d, self.c.dv).into_iter().max().unwrap();
        let geo = Device { max_smem, mma: false, ..dev.geometry() };
        assert_eq!(launch::tiles(self.dims(), geo), Ok(self.c.tiles), "{:?}", self.c);
        geo
    }

    /// `dev`'s geometry with the shared memory the tensor-core kernels need at this head size;
    /// `None` on a device without tensor cores (the SIMT harness at warp 64).
    fn mma_device(&self, dev: &Dev, dt: Dtype) -> Option<Device> {
        let max_smem = launch::mma_smem(self.c.d).into_iter().max().unwrap();
        let geo = Device { max_smem, ..dev.geometry() };
        geo.mma.then(|| {
            assert_eq!(launch::mma_head_dim(self.dims(), dtype(dt), geo), Some(self.c.d));
            geo
        })
    }

    /// The forward on `dev` at geometry `geo` from the case's inputs in `dt`: out, the rows'
    /// log-sum-exp (from the kernel's (m, log l)) and the kernel the launcher chose.
    fn forward_on(&self, dev: &Dev, geo: Device, dt: Dtype) -> (Buf, Vec<f32>, String) {
        let c = &self.c;
        let (mut out, mut stats) =
            (Buf::poisoned(self.out.len(), dt), Buf::poisoned(c.b * c.h * c.tq * 2, D::F32));
        let (mut q, mut k, mut v) =
            (Buf::from_f32(&self.q, dt), Buf::from_f32(&self.k, dt), Buf::from_f32(&self.v, dt));
        let mut mask = self.mask.as_ref().map(|m| Buf::from_f32(m, dt));
        let l = launch::AttentionForward {
            dtype: dtype(dt),
            out: st(&mut out, self.os),
            stats: &mut stats,
            q: st(&mut q, self.qs),
            k: st(&mut k, self.ks),
            v: st(&mut v, self.vs),
            mask: self.mask_arg(&mut mask),
            dims: self.dims(),
            scores: self.scores(),
        };
        let l = l.launch(geo).unwrap();
        let kernel = l.name.clone();
        dev.run(l).unwrap();
        (out, Prob::lse_of(&stats.to_f32()), kernel)
    }

    fn name(&self, dt: Dtype) -> String {
        let c = &self.c;
        format!(
            "attention {dt:?} B{} H{} Hkv{} Tq{} Tk{} D{} Dv{} causal={} mask={:?} p={} cap={:?} \
             tiles {}x{}",
            c.b,
            c.h,
            c.hkv,
            c.tq,
            c.tk,
            c.d,
            c.dv,
            c.causal,
            c.mask,
            c.p,
            c.softcap,
            c.tiles.0,
            c.tiles.1
        )
    }
}

#[test]
fn forward_matches_the_cpu_kernel_and_lse() {
    for dt in FLOATS {
        for (n, &c) in CASES.iter().enumerate() {
            let p = Prob::new(c, dt, 10 + n as u64);
            for dev in devices() {
                let (out, lse, kernel) = p.forward_on(&dev, p.device(&dev), dt);
                assert!(kernel.starts_with("attention_forward"), "{kernel}");
                let what = format!("{} forward on {dev}", p.name(dt));
                // Sums that cancel (module comment): 1e-5 of the largest element on top.
                let (t, tl) = (tol(dt, 1e-5), tol(D::F32, 1e-5));
                let (t, tl) = (Tol { of_largest: 1e-5, ..t }, Tol { of_largest: 1e-5, ..tl });
                check(&format!("{what}: out"), &out.to_f32(), &p.out, dt, t);
                check(&format!("{what}: lse"), &lse, &p.lse, D::F32, tl);
            }
        }
    }
}

#[test]
fn backward_matches_the_cpu_kernel() {
    backward_cases(&CASES, &FLOATS, 20, false);
}

/// The backward of `cases` in `dts` on every test device against the CPU kernel: attention.cu's
/// kernels, or with `mma` the tensor-core ones (on the devices that have them).
fn backward_cases(cases: &[Case], dts: &[Dtype], seed: u64, mma: bool) {
    for &dt in dts {
        for (n, &c) in cases.iter().enumerate() {
            let p = Prob::new(c, dt, seed + n as u64);
            let (nq, nk, nv) =
                (c.b * c.h * c.tq * c.d, c.b * c.hkv * c.tk * c.d, c.b * c.hkv * c.tk * c.dv);
            // The backward plan's `o` strides are dout's.
            let plan = AttnPlan { o: p.gs, ..p.plan() };
            let pool = Pool::new(2);
            let mut ws = vec![0f32; plan.backward_workspace(pool.threads())];
            let (mut dq0, mut dk0, mut dv0) =
                (vec![f32::NAN; nq], vec![f32::NAN; nk], vec![f32::NAN; nv]);
            // SAFETY: as in Prob::new.
            unsafe {
                cpu::attention_backward(
                    &pool,
                    &plan,
                    (dq0.as_mut_ptr(), dk0.as_mut_ptr(), dv0.as_mut_ptr()),
                    p.dout.as_ptr(),
                    p.q.as_ptr(),
                    p.k.as_ptr(),
                    p.v.as_ptr(),
                    p.mask.as_deref(),
                    &p.cpu_stats,
                    SEED,
                    &mut ws,
                )
            };
            // Half dtypes: see the module comment (delta reads the stored, rounded O); the
            // tensor-core kernels round P and dS to the dtype as the A operands of dV, dK
            // and dQ: one u more of the largest.
            let t = tol(dt, 1e-5 + unit_roundoff(dt));
            let extra = if mma { unit_roundoff(dt) } else { 0.0 };
            let t = Tol { of_largest: t.rel + extra, ..t };
            for dev in devices() {
                let geo = if mma { p.mma_device(&dev, dt) } else { Some(p.device(&dev)) };
                let Some(geo) = geo else { continue };
                let what = format!("{} backward on {dev}", p.name(dt));
                let (mut q, mut k, mut v) =
                    (Buf::from_f32(&p.q, dt), Buf::from_f32(&p.k, dt), Buf::from_f32(&p.v, dt));
                // The forward's outputs as the engine keeps them: o in the dtype, (m, log l) in
                // f32.
                let (mut out, mut g, mut stats) = (
                    Buf::from_f32(&p.out, dt),
                    Buf::from_f32(&p.dout, dt),
                    Buf::from_f32(&p.stats, D::F32),
                );
                let mut mask = p.mask.as_ref().map(|m| Buf::from_f32(m, dt));
                // dq first: it writes delta, which dkdv reads.
                let mut delta = Buf::poisoned(c.b * c.h * c.tq, D::F32);
                let mut dq = Buf::poisoned(nq, dt);
                let dtype = dtype(dt);
                let l = launch::AttentionBackwardDq {
                    dtype,
                    dq: st(&mut dq, p.dqs),
                    delta: &mut delta,
                    dout: st(&mut g, p.gs),
                    out: st(&mut out, p.os),
                    q: st(&mut q, p.qs),
                    k: st(&mut k, p.ks),
                    v: st(&mut v, p.vs),
                    mask: p.mask_arg(&mut mask),
                    stats: &mut stats,
                    dims: p.dims(),
                    scores: p.scores(),
                };
                let l = l.launch(geo).unwrap();
                assert_eq!(l.name.starts_with("attention_mma_"), mma, "{}", l.name);
                dev.run(l).unwrap();
                check(&format!("{what}: dq"), &dq.to_f32(), &dq0, dt, t);

                let (mut dk, mut dv) = (Buf::poisoned(nk, dt), Buf::poisoned(nv, dt));
                let l = launch::AttentionBackwardDkdv {
                    dtype,
                    dk: st(&mut dk, p.dks),
                    dv: st(&mut dv, p.dvs),
                    dout: st(&mut g, p.gs),
                    q: st(&mut q, p.qs),
                    k: st(&mut k, p.ks),
                    v: st(&mut v, p.vs),
                    mask: p.mask_arg(&mut mask),
                    stats: &mut stats,
                    delta: &mut delta,
                    dims: p.dims(),
                    scores: p.scores(),
                };
                let l = l.launch(geo).unwrap();
                assert_eq!(l.name.starts_with("attention_mma_"), mma, "{}", l.name);
                dev.run(l).unwrap();
                check(&format!("{what}: dk"), &dk.to_f32(), &dk0, dt, t);
                check(&format!("{what}: dv"), &dv.to_f32(), &dv0, dt, t);
            }
        }
    }
}

/// The tensor-core kernels' cases (attention_mma.cu): every head size they are built for, T of
/// 77 and 200 (not multiples of their 64-row or 32-row tiles; Tq ≠ Tk both ways), grouped- and
/// multi-query heads, a sliding window, padding masks, dropout.
const MMA_CASES: [Case; 9] = [
    case(2, (4, 2), 77, 77, 64, 64, true, Mask::KeyPad(-1e4), 0.1, (0, 0)),
    case(1, (2, 2), 200, 200, 16, 16, false, Mask::Full, 0.0, (0, 0)),
    case(1, (4, 1), 200, 200, 80, 80, true, Mask::Window(37), 0.0, (0, 0)),
    case(2, (2, 2), 77, 77, 32, 32, true, Mask::LeftPad(21), 0.1, (0, 0)),
    case(1, (2, 2), 45, 77, 128, 128, false, Mask::KeyPad(f32::NEG_INFINITY), 0.0, (0, 0)),
    case(1, (2, 1), 77, 45, 96, 96, true, Mask::None, 0.0, (0, 0)),
    case(1, (3, 3), 200, 77, 64, 64, true, Mask::Window(50), 0.1, (0, 0)),
    // Gemma 2's attention: soft-capped scores, a sliding window, grouped-query, dropout.
    capped(case(1, (4, 2), 77, 77, 64, 64, true, Mask::Window(37), 0.1, (0, 0)), 2.0),
    capped(case(2, (2, 2), 77, 77, 32, 32, true, Mask::EagerLeftPad(21), 0.0, (0, 0)), 2.0),
];

const HALVES: [Dtype; 2] = [Dtype::F16, Dtype::BF16];

/// Tolerances of the tensor-core forward against the CPU kernel: attention.cu's half
/// tolerances (1e-5 + u of the element and 1e-5 of the largest), plus one u of the largest for
/// P rounded to the dtype before P·V (FlashAttention's A operand; the CPU multiplies f32 P).
/// Q·Kᵀ has exact products summed in f32 on both sides, so lse keeps the f32 tolerance.
#[test]
fn mma_forward_matches_the_cpu_kernel_and_lse() {
    for dt in HALVES {
        for (n, &c) in MMA_CASES.iter().enumerate() {
            let p = Prob::new(c, dt, 30 + n as u64);
            for dev in devices() {
                let Some(geo) = p.mma_device(&dev, dt) else { continue };
                let (out, lse, kernel) = p.forward_on(&dev, geo, dt);
                assert!(kernel.starts_with("attention_mma_forward"), "{kernel}");
                let what = format!("{} tensor-core forward on {dev}", p.name(dt));
                let t = tol(dt, 1e-5);
                let t = Tol { of_largest: 1e-5 + unit_roundoff(dt), ..t };
                let tl = Tol { of_largest: 1e-5, ..tol(D::F32, 1e-5) };
                check(&format!("{what}: out"), &out.to_f32(), &p.out, dt, t);
                check(&format!("{what}: lse"), &lse, &p.lse, D::F32, tl);
            }
        }
    }
}

#[test]
fn mma_backward_matches_the_cpu_kernel() {
    backward_cases(&MMA_CASES, &HALVES, 40, true);
}
