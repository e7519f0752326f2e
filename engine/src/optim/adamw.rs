//! Multi-tensor fused AdamW over one flat parameter buffer.
//!
//! Reference: torch.optim.AdamW (`_single_tensor_adamw`, decoupled weight decay, Loshchilov &
//! Hutter 2019) as HF Trainer uses it, and Apex's `multi_tensor_adam` / DeepSpeed's fused Adam
//! for the "one pass over every parameter" shape. Because parameters, gradients and both
//! moments are flat and aligned, a step is one loop (one kernel launch on a GPU) instead of
//! one small op per tensor; loss-scale unscaling, the overflow check and global-norm clipping
//! fold into it as a single gradient multiplier, and in mixed precision the same loop writes
//! the compute-dtype copy of each parameter.

use half::{bf16, f16};

/// Hyper-parameters, with HF Trainer's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// Clip gradients at this global L2 norm; 0 disables clipping.
    pub max_grad_norm: f32,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 5e-5,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
        }
    }
}

/// The per-step scalars of the update, computed in f64 once per step (the GPU kernel
/// `adamw_step` reads them from its arguments or the step block, so both devices use the same
/// values).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepScalars {
    /// lr / (1 − β1^t)
    pub step_size: f32,
    /// 1 / √(1 − β2^t)
    pub inv_bc2_sqrt: f32,
    /// 1 − lr·weight_decay (applied to decaying segments only)
    pub decay_mul: f32,
}

impl AdamWConfig {
    /// The scalars of update number `t` (1-based; skipped steps do not count) at `lr`.
    pub fn step_scalars(&self, t: u64, lr: f32) -> StepScalars {
        let t = t as i32;
        let bc1 = 1.0 - f64::from(self.beta1).powi(t);
        let bc2 = 1.0 - f64::from(self.beta2).powi(t);
        StepScalars {
            step_size: (f64::from(lr) / bc1) as f32,
            inv_bc2_sqrt: (1.0 / bc2.sqrt()) as f32,
            decay_mul: (1.0 - f64::from(lr) * f64::from(self.weight_decay)) as f32,
        }
    }
}

/// A contiguous range of the flat buffer sharing one decay setting (HF: no decay on biases
/// and layer-norm weights).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub start: usize,
    pub len: usize,
    pub decay: bool,
}

/// The compute-dtype copy of the parameters that the forward pass reads in mixed precision.
pub enum ParamMirror<'a> {
    None,
    F16(&'a mut [f16]),
    Bf16(&'a mut [bf16]),
    /// The copy the CPU executor reads: f32 slots holding the values rounded to the dtype
    /// (its emulation of f16/bf16 storage, see `exec::planned`).
    Rounded(crate::DType, &'a mut [f32]),
}

/// What the gradient pass found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradStats {
    /// Global L2 norm of the unscaled gradients (before clipping), as clip_grad_norm_ returns.
    pub norm: f32,
    /// False when any gradient is inf/NaN: the step is skipped.
    pub finite: bool,
}

/// Sum of squares of `grads · inv_scale` (f64 accumulation) and whether all are finite.
// grads: (N,) flat
pub fn sum_squares(grads: &[f32], inv_scale: f32, threads: usize) -> (f64, bool) {
    let partial = |g: &[f32]| {
        let mut acc = 0f64;
        let mut finite = true;
        for c in g.chunks(1024) {
            let mut s = 0f32;
            for &x in c {
                let y = x * inv_scale;
                s += y * y;
            }
            // A single check per chunk: inf/NaN propagate through the sum.
            finite &= s.is_finite();
            acc += f64::from(s);
        }
        (acc, finite)
    };
    par_chunks(grads.len(), threads, |r| partial(&grads[r]))
        .into_iter()
        .fold((0.0, true), |(a, f), (b, g)| (a + b, f && g))
}

/// Runs `f` over `threads` contiguous ranges of 0..n on scoped threads.
fn par_chunks<R: Send>(
    n: usize,
    threads: usize,
    f: impl Fn(std::ops::Range<usize>) -> R + Sync,
) -> Vec<R> {
    let threads = threads.max(1).min(n.div_ceil(1 << 16).max(1));
    let per = n.div_ceil(threads);
    if threads == 1 {
        return vec![f(0..n)];
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let r = (t * per).min(n)..((t + 1) * per).min(n);
                let f = &f;
                s.spawn(move || f(r))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("optimizer thread panicked")).collect()
    })
}

/// Fused AdamW state: both moments, flat, aligned with the parameters it updates.
pub struct AdamW {
    pub cfg: AdamWConfig,
    /// First moment (exp_avg), fp32.
    pub m: Vec<f32>,
    /// Second moment (exp_avg_sq), fp32.
    pub v: Vec<f32>,
    segments: Vec<Segment>,
    /// Optimizer steps taken (skipped steps do not count, as in torch).
    pub step: u64,
    pub threads: usize,
}

impl AdamW {
    /// State for `len` parameters; `segments` must tile 0..len.
    pub fn new(cfg: AdamWConfig, segments: Vec<Segment>, len: usize) -> Self {
        let mut next = 0;
        for s in &segments {
            assert_eq!(s.start, next, "segments must tile the buffer in order");
            next += s.len;
        }
        assert_eq!(next, len, "segments must cover the whole buffer");
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        AdamW { cfg, m: vec![0.0; len], v: vec![0.0; len], segments, step: 0, threads }
    }

    /// The decay segments tiling the buffer this optimizer updates.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Optimizer-state bytes held (the two fp32 moments).
    pub fn state_bytes(&self) -> usize {
        (self.m.len() + self.v.len()) * 4
    }

    /// One full step: gradient statistics, then (if finite) the fused update at `lr`.
    /// `inv_scale` undoes the loss scale. Returns the statistics; nothing is updated when a
    /// gradient is inf/NaN.
    // params, grads: (N,) flat, in the optimizer's segment layout
    pub fn step(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        inv_scale: f32,
        lr: f32,
        mirror: ParamMirror<'_>,
    ) -> GradStats {
        let (ss, finite) = sum_squares(grads, inv_scale, self.threads);
        let stats = GradStats { norm: ss.sqrt() as f32, finite };
        if finite {
            let coef = self.clip_coef(stats.norm);
            self.update(params, grads, inv_scale * coef, lr, mirror);
        }
        stats
    }

    /// torch.nn.utils.clip_grad_norm_'s multiplier: max_norm / (norm + 1e-6), at most 1.
    pub fn clip_coef(&self, norm: f32) -> f32 {
        if self.cfg.max_grad_norm > 0.0 {
            (self.cfg.max_grad_norm / (norm + 1e-6)).min(1.0)
        } else {
            1.0
        }
    }

    /// The fused pass: for every element, g = grad · grad_scale, then decoupled decay, both
    /// moments, bias-corrected update, and the mirror write.
    pub fn update(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        grad_scale: f32,
        lr: f32,
        mut mirror: ParamMirror<'_>,
    ) {
        let n = self.m.len();
        assert!(
            params.len() == n && grads.len() == n,
            "params/grads must match the optimizer state"
        );
        self.step += 1;
        let c = &self.cfg;
        let sc = c.step_scalars(self.step, lr);
        let k = Consts {
            g_scale: grad_scale,
            beta1: c.beta1,
            beta2: c.beta2,
            one_minus_beta1: 1.0 - c.beta1,
            one_minus_beta2: 1.0 - c.beta2,
            step_size: sc.step_size,
            inv_bc2_sqrt: sc.inv_bc2_sqrt,
            eps: c.eps,
            decay_mul: sc.decay_mul,
        };
        let threads = self.threads;
        let segments = &self.segments;
        // Raw views split per thread below; each thread owns a disjoint range.
        let (p_all, m_all, v_all) = (
            SendPtr(params.as_mut_ptr()),
            SendPtr(self.m.as_mut_ptr()),
            SendPtr(self.v.as_mut_ptr()),
        );
        let mirror_ptr = match &mut mirror {
            ParamMirror::None => MirrorPtr::None,
            ParamMirror::F16(x) => {
                assert_eq!(x.len(), n);
                MirrorPtr::F16(SendPtr(x.as_mut_ptr()))
            }
            ParamMirror::Bf16(x) => {
                assert_eq!(x.len(), n);
                MirrorPtr::Bf16(SendPtr(x.as_mut_ptr()))
            }
            ParamMirror::Rounded(d, x) => {
                assert_eq!(x.len(), n);
                MirrorPtr::Rounded(*d, SendPtr(x.as_mut_ptr()))
            }
        };
        par_chunks(n, threads, |range| {
            for seg in segments {
                let lo = range.start.max(seg.start);
                let hi = range.end.min(seg.start + seg.len);
                if lo >= hi {
                    continue;
                }
                // SAFETY: `range`s of different threads are disjoint and within 0..n, and every
                // buffer has n elements (asserted above), so these sub-slices never alias.
                let (p, m, v) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(p_all.get().add(lo), hi - lo),
                        std::slice::from_raw_parts_mut(m_all.get().add(lo), hi - lo),
                        std::slice::from_raw_parts_mut(v_all.get().add(lo), hi - lo),
                    )
                };
                let decay = if seg.decay { k.decay_mul } else { 1.0 };
                adamw_kernel(p, &grads[lo..hi], m, v, &k, decay);
                // SAFETY: as above, the mirror has n elements and this range is ours.
                unsafe {
                    match mirror_ptr {
                        MirrorPtr::None => {}
                        MirrorPtr::F16(x) => {
                            for (d, s) in std::slice::from_raw_parts_mut(x.get().add(lo), hi - lo)
                                .iter_mut()
                                .zip(p.iter())
                            {
                                *d = f16::from_f32(*s);
                            }
                        }
                        MirrorPtr::Bf16(x) => {
                            for (d, s) in std::slice::from_raw_parts_mut(x.get().add(lo), hi - lo)
                                .iter_mut()
                                .zip(p.iter())
                            {
                                *d = bf16::from_f32(*s);
                            }
                        }
                        MirrorPtr::Rounded(dt, x) => {
                            let d = std::slice::from_raw_parts_mut(x.get().add(lo), hi - lo);
                            d.copy_from_slice(p);
                            dt.round_slice(d);
                        }
                    }
                }
            }
        });
    }
}

struct Consts {
    g_scale: f32,
    beta1: f32,
    beta2: f32,
    one_minus_beta1: f32,
    one_minus_beta2: f32,
    step_size: f32,
    inv_bc2_sqrt: f32,
    eps: f32,
    decay_mul: f32,
}

/// The per-element AdamW update (torch's math, in f32).
// p, g, m, v: (n,)
#[inline]
fn adamw_kernel(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], k: &Consts, decay: f32) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        let g = g * k.g_scale;
        *p *= decay;
        *m = k.beta1 * *m + k.one_minus_beta1 * g;
        *v = k.beta2 * *v + k.one_minus_beta2 * g * g;
        let denom = v.sqrt() * k.inv_bc2_sqrt + k.eps;
        *p -= k.step_size * *m / denom;
    }
}

#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: only used to hand disjoint sub-ranges of one buffer to scoped threads.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

#[derive(Clone, Copy)]
enum MirrorPtr {
    None,
    F16(SendPtr<f16>),
    Bf16(SendPtr<bf16>),
    Rounded(crate::DType, SendPtr<f32>),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic generator: values in ±[0.01, 1), never zero.
    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 11) as f64 / (1u64 << 53) as f64;
                let mag = 0.01 + 0.99 * u;
                (if s & 1 == 0 { mag } else { -mag }) as f32
            })
            .collect()
    }

    /// torch.optim.AdamW's update after clip_grad_norm_ over all gradients at once (one global
    /// norm, as HF Trainer clips), in f64: the reference.
    struct Reference {
        p: Vec<f64>,
        m: Vec<f64>,
        v: Vec<f64>,
        t: i32,
    }

    impl Reference {
        fn step(&mut self, grads: &[f32], segs: &[Segment], c: &AdamWConfig, lr: f64) {
            let norm = grads.iter().map(|&g| f64::from(g).powi(2)).sum::<f64>().sqrt();
            let coef = if c.max_grad_norm > 0.0 {
                (f64::from(c.max_grad_norm) / (norm + 1e-6)).min(1.0)
            } else {
                1.0
            };
            self.t += 1;
            let (b1, b2) = (f64::from(c.beta1), f64::from(c.beta2));
            let (bc1, bc2) = (1.0 - b1.powi(self.t), 1.0 - b2.powi(self.t));
            for s in segs {
                for (i, &g) in grads.iter().enumerate().skip(s.start).take(s.len) {
                    let g = f64::from(g) * coef;
                    if s.decay {
                        self.p[i] *= 1.0 - lr * f64::from(c.weight_decay);
                    }
                    self.m[i] = b1 * self.m[i] + (1.0 - b1) * g;
                    self.v[i] = b2 * self.v[i] + (1.0 - b2) * g * g;
                    let denom = self.v[i].sqrt() / bc2.sqrt() + f64::from(c.eps);
                    self.p[i] -= lr / bc1 * self.m[i] / denom;
                }
            }
        }
    }

    fn segments(n: usize) -> Vec<Segment> {
        // Uneven tensors, alternating decay, like weights and biases.
        let mut segs = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while start < n {
            let len = (37 + 911 * i % 5003).min(n - start);
            segs.push(Segment { start, len, decay: i % 2 == 0 });
            start += len;
            i += 1;
        }
        segs
    }

    #[test]
    fn matches_an_f64_reference_with_global_clipping_and_decay_groups() {
        let n = 300_001; // odd, and large enough to run on several threads
        let cfg = AdamWConfig {
            lr: 1e-3,
            weight_decay: 0.01,
            max_grad_norm: 1.0,
            ..AdamWConfig::default()
        };
        let segs = segments(n);
        let mut opt = AdamW::new(cfg, segs.clone(), n);
        opt.threads = 3;
        let mut p = random(n, 1);
        let mut r = Reference {
            p: p.iter().map(|&x| f64::from(x)).collect(),
            m: vec![0.0; n],
            v: vec![0.0; n],
            t: 0,
        };
        for step in 0..5 {
            // |g| is uniform in [0.01, 1): E[g²] ≈ 1/3, so the global norm is ≈ √(n/3) ≈ 318 at
            // scale 1 and ≈ 0.32 at scale 0.001. Against max_grad_norm 1 only step 2 is clipped;
            // the others run unclipped (checked below, so both paths are exercised).
            let scale = if step == 2 { 1.0 } else { 0.001 };
            let g: Vec<f32> = random(n, 10 + step).iter().map(|x| x * scale).collect();
            let stats = opt.step(&mut p, &g, 1.0, cfg.lr, ParamMirror::None);
            assert!(stats.finite);
            let want_norm = g.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
            assert!((f64::from(stats.norm) - want_norm).abs() < 1e-5 * want_norm);
            let coef = opt.clip_coef(stats.norm);
            if step == 2 {
                assert!(
                    stats.norm > cfg.max_grad_norm && coef < 0.01,
                    "step 2 must clip: norm {} coef {coef}",
                    stats.norm
                );
            } else {
                assert!(
                    stats.norm < cfg.max_grad_norm && coef == 1.0,
                    "step {step} must not clip: norm {} coef {coef}",
                    stats.norm
                );
            }
            r.step(&g, &segs, &cfg, f64::from(cfg.lr));
        }
        // f32 vs f64 over 5 steps of size ~lr: absolute error well below lr·1e-3.
        let worst = p.iter().zip(&r.p).map(|(&a, &b)| (f64::from(a) - b).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-6, "worst |Δp| = {worst:e}");
    }

    #[test]
    fn unscales_and_skips_on_overflow() {
        let n = 1000;
        let cfg = AdamWConfig { lr: 1e-2, max_grad_norm: 0.0, ..AdamWConfig::default() };
        let segs = vec![Segment { start: 0, len: n, decay: true }];
        let (mut a, mut b) = (AdamW::new(cfg, segs.clone(), n), AdamW::new(cfg, segs, n));
        let p0 = random(n, 3);
        let g = random(n, 4);
        let scaled: Vec<f32> = g.iter().map(|x| x * 1024.0).collect();
        let (mut pa, mut pb) = (p0.clone(), p0.clone());
        a.step(&mut pa, &g, 1.0, cfg.lr, ParamMirror::None);
        b.step(&mut pb, &scaled, 1.0 / 1024.0, cfg.lr, ParamMirror::None);
        assert_eq!(pa, pb, "a power-of-two scale unscales exactly");
        let mut bad = g.clone();
        bad[517] = f32::INFINITY;
        let before = pb.clone();
        let stats = b.step(&mut pb, &bad, 1.0, cfg.lr, ParamMirror::None);
        assert!(!stats.finite);
        assert_eq!(pb, before, "an overflowing step changes nothing");
        assert_eq!(b.step, 1, "and does not count");
        bad[517] = f32::NAN;
        assert!(!b.step(&mut pb, &bad, 1.0, cfg.lr, ParamMirror::None).finite);
    }

    #[test]
    fn writes_the_compute_dtype_mirror_in_the_same_pass() {
        let n = 70_000;
        let segs = vec![Segment { start: 0, len: n, decay: false }];
        let mut opt = AdamW::new(AdamWConfig::default(), segs, n);
        opt.threads = 2;
        let mut p = random(n, 5);
        let g = random(n, 6);
        let mut h = vec![bf16::ZERO; n];
        opt.step(&mut p, &g, 1.0, 1e-3, ParamMirror::Bf16(&mut h));
        assert!(p.iter().zip(&h).all(|(a, b)| bf16::from_f32(*a) == *b));
        let mut f = vec![f16::ZERO; n];
        opt.step(&mut p, &g, 1.0, 1e-3, ParamMirror::F16(&mut f));
        assert!(p.iter().zip(&f).all(|(a, b)| f16::from_f32(*a) == *b));
        let mut r = vec![0f32; p.len()];
        opt.step(&mut p, &g, 1.0, 1e-3, ParamMirror::Rounded(crate::DType::F16, &mut r));
        for (a, b) in p.iter().zip(&r) {
            assert_eq!(f16::from_f32(*a).to_f32().to_bits(), b.to_bits());
        }
        assert_eq!(opt.state_bytes(), 8 * n);
    }
}
