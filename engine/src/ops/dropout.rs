//! Dropout with a counter-based RNG: element i of a dropout site keeps its value iff
//! `uniform(seed, offset + i) >= p`, and kept values are scaled by 1/(1-p).
//!
//! Mirrors `torch.nn.functional.dropout(x, p, training=True)` in distribution (inverted dropout),
//! and PyTorch's CUDA philox (seed, offset) scheme in design: the mask is a pure function of
//! (seed, counter), so the backward regenerates it instead of storing it (ORT and FlashAttention
//! do the same). The bits differ from PyTorch's RNG, so masks are not bit-identical to torch's.
//!
//! The step's `seed` is a run-time value (a new one each step); the `offset` is fixed per dropout
//! site when the graph is built, so sites never share counters.

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::Real;
use crate::graph::builder::check_p;
use crate::graph::GraphError;
use crate::graph::{Graph, Op, TensorId};

/// (x) → x·keep/(1-p), keep from the counter-based RNG at (step seed, offset + index).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    pub p: f32,
    pub offset: u64,
}

impl Reference for Dropout {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        dropout_forward(&mut outs[0], a.f(0), self.p, a.seed, self.offset);
        Ok(())
    }
}

impl OpDef for Dropout {
    fn name(&self) -> &'static str {
        "dropout"
    }

    fn attrs(&self) -> String {
        format!("p={} offset={}", self.p, self.offset)
    }

    fn inplace_inputs(&self) -> &'static [usize] {
        &[0]
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        // The same mask, regenerated from (step seed, offset).
        let dy = cx.gy()?;
        Ok(vec![Some(cx.g.dropout_at(dy, self.p, self.offset)?)])
    }
}

/// A 64-bit mix of (seed, counter): splitmix64's finalizer applied twice, keyed by the seed.
pub fn hash(seed: u64, counter: u64) -> u64 {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    mix(mix(seed.wrapping_add(0x9E37_79B9_7F4A_7C15)) ^ counter.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Uniform in [0, 1) with 24 random bits (exactly representable in f32).
pub fn uniform(seed: u64, counter: u64) -> f32 {
    (hash(seed, counter) >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

/// Whether element `counter` survives dropout with probability `p`.
pub fn keep(seed: u64, counter: u64, p: f32) -> bool {
    uniform(seed, counter) >= p
}

/// The multiplier of a kept element: 1/(1-p), and 0 when p = 1 (everything dropped).
pub fn keep_scale<T: Real>(p: f32) -> T {
    if p >= 1.0 {
        T::ZERO
    } else {
        T::ONE / T::from_f64(1.0 - p as f64)
    }
}

/// `out[i] = x[i]/(1-p)` if `keep(seed, offset+i)`, else 0. Its backward is the same call on the
/// gradient with the same (p, seed, offset).
// out, x: (N)
pub fn dropout_forward<T: Real>(out: &mut [T], x: &[T], p: f32, seed: u64, offset: u64) {
    let s: T = keep_scale(p);
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = if keep(seed, offset + i as u64, p) { v * s } else { T::ZERO };
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// Inverted dropout with probability `p`; the site gets its own range of RNG counters.
    pub fn dropout(&mut self, x: TensorId, p: f32) -> Result<TensorId, GraphError> {
        let op = "dropout";
        check_p(op, p)?;
        let numel = self.info(x)?.numel() as u64;
        let offset = self.rng_offset;
        // A p = 0 site draws no counters, so eliminating it (`passes::eliminate`) leaves every
        // other site's mask unchanged.
        if p > 0.0 {
            self.rng_offset += numel;
        }
        self.unary(op, Op::Dropout(Dropout { p, offset }), x)
    }

    // ---------------------------------------------------------------- backward ops (autodiff)

    /// A dropout reusing a forward site's counters: the backward regenerates its mask.
    pub(crate) fn dropout_at(
        &mut self,
        x: TensorId,
        p: f32,
        offset: u64,
    ) -> Result<TensorId, GraphError> {
        self.unary("dropout", Op::Dropout(Dropout { p, offset }), x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    #[test]
    fn drops_about_p_and_scales_the_rest() {
        let n = 100_000;
        let x = vec![1.0f32; n];
        let mut y = vec![0.0f32; n];
        dropout_forward(&mut y, &x, 0.1, 42, 0);
        let dropped = y.iter().filter(|&&v| v == 0.0).count() as f64 / n as f64;
        assert!((dropped - 0.1).abs() < 0.005, "dropped fraction {dropped}");
        assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.9).abs() < 1e-6));
        let mean = y.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        assert!((mean - 1.0).abs() < 0.01, "inverted dropout keeps the mean: {mean}");
    }

    #[test]
    fn mask_is_a_function_of_seed_and_counter() {
        let x = Rng::new(9).vec(1000);
        let run = |seed, offset| {
            let mut y = vec![0.0; 1000];
            dropout_forward(&mut y, &x, 0.5, seed, offset);
            y
        };
        assert_eq!(run(1, 0), run(1, 0));
        assert_ne!(run(1, 0), run(2, 0));
        // Offsets address a global counter: the mask tail of site 0 is the head of a site at +500.
        let zeros = |y: &[f64]| y.iter().map(|&v| v == 0.0).collect::<Vec<_>>();
        assert_eq!(zeros(&run(1, 0)[500..]), zeros(&run(1, 500)[..500]));
        // p = 0 is the identity, p = 1 drops everything.
        let mut y = vec![0.0; 1000];
        dropout_forward(&mut y, &x, 0.0, 1, 0);
        assert_eq!(y, x);
        dropout_forward(&mut y, &x, 1.0, 1, 0);
        assert!(y.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn backward_is_the_same_mask_and_matches_finite_differences() {
        let mut rng = Rng::new(10);
        let (x, dy) = (rng.vec(64), rng.vec(64));
        let mut dx = vec![0.0; 64];
        dropout_forward(&mut dx, &dy, 0.3, 5, 17);
        let fd = fd_grad(&x, FD_STEP, |x| {
            let mut y = vec![0.0; 64];
            dropout_forward(&mut y, x, 0.3, 5, 17);
            dot(&y, &dy)
        });
        assert_close(&dx, &fd, FD_TOL, "dx");
    }
}
