//! Rotary position embedding (RoPE) as HF applies it to queries and keys.
//!
//! Mirrors `apply_rotary_pos_emb` of HF's Llama (Mistral, Qwen2, Qwen3):
//! `q·cos + rotate_half(q)·sin` with `rotate_half(x) = cat(−x[D/2:], x[:D/2])`, cos and sin of
//! shape (T, D) broadcast over the leading dims. HF builds them as cos/sin of
//! `emb = cat(freqs, freqs)`, so both halves are equal; then the Jacobian is a rotation of each
//! pair (x[i], x[i + D/2]) by the angle at i, and its transpose — the backward — is the
//! rotation by minus that angle: the same op with sin negated (`inverse`). Kernels:
//! `backend/cpu/kernels/rotary.rs` (CPU), `engine/kernels/rotary.cu` with its launcher in
//! `exec/gpu/launch/rotary.rs` (GPU).

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::Real;
use crate::graph::builder::shape_err;
use crate::graph::GraphError;
use crate::graph::{ElemType, Graph, Op, TensorId};
use crate::plan::Req;

/// (x (…, T, D), cos (T, D), sin (T, D)) → y (…, T, D) = x·cos + rotate_half(x)·sin with
/// rotate_half(x) = cat(−x[D/2:], x[:D/2]) (HF's `apply_rotary_pos_emb`); `inverse` negates
/// sin, which is the backward of the forward (cos and sin have equal halves, as HF's
/// emb = cat(freqs, freqs)). cos and sin are fed inputs without gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rotary {
    pub inverse: bool,
}

impl Reference for Rotary {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        rotary_forward(&mut outs[0], a.f(0), a.f(1), a.f(2), a.last(0), self.inverse);
        Ok(())
    }
}

impl OpDef for Rotary {
    fn name(&self) -> &'static str {
        "rotary"
    }

    fn attrs(&self) -> String {
        format!("inverse={}", self.inverse)
    }

    fn read_req(&self, slot: usize) -> Req {
        // x: rows of D at any strides (q or k inside their projection's (B, T, H·D) rows, the
        // head permute folded); cos and sin dense.
        if slot == 0 {
            Req::Rows
        } else {
            Req::Contig
        }
    }

    fn write_req(&self, _slot: usize) -> Req {
        // y: rows of D at any strides (the backward's dq, dk into the projection's gradient).
        Req::Rows
    }

    // Rotary reads the pair (x[i], x[i + D/2]) before it writes (y[i], y[i + D/2]); its
    // backward is the same op over dy.
    fn inplace_inputs(&self) -> &'static [usize] {
        &[0]
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        // cos and sin have equal halves (HF's cat(freqs, freqs)), so the transposed Jacobian is
        // the rotation by the opposite angle: the same op with sin negated.
        if cx.need[1] || cx.need[2] {
            return Err(GraphError::Autodiff(
                "rotary: cos or sin depends on a parameter; they are fed inputs without gradient"
                    .into(),
            ));
        }
        let (ins, dy) = (cx.ins(), cx.gy()?);
        Ok(vec![Some(cx.g.rotary_op(dy, ins[1], ins[2], !self.inverse)?), None, None])
    }
}

/// y = x·cos + rotate_half(x)·sin·σ with σ = −1 when `inverse` (else 1), per row of D, the row
/// at position t = row mod T reading cos[t], sin[t].
// y: (R, D), R = (…)·T
// x: (R, D)
// cos, sin: (T, D)
pub fn rotary_forward<T: Real>(
    y: &mut [T],
    x: &[T],
    cos: &[T],
    sin: &[T],
    d: usize,
    inverse: bool,
) {
    let h = d / 2;
    let tt = cos.len() / d;
    let sg = if inverse { -T::ONE } else { T::ONE };
    for (r, (xr, yr)) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).enumerate() {
        let t = r % tt;
        let (c, s) = (&cos[t * d..(t + 1) * d], &sin[t * d..(t + 1) * d]);
        for i in 0..d {
            // rotate_half(x)[i] = −x[i + D/2] in the first half, x[i − D/2] in the second.
            let rot = if i < h { -xr[i + h] } else { xr[i - h] };
            yr[i] = xr[i] * c[i] + rot * s[i] * sg;
        }
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// HF's `apply_rotary_pos_emb` on one of q, k: x·cos + rotate_half(x)·sin, with
    /// rotate_half(x) = cat(−x[D/2:], x[:D/2]). cos and sin are (T, D) graph inputs (HF's
    /// cos/sin of `cat(freqs, freqs)`: equal halves, which the backward relies on), no gradient.
    // x: (…, T, D), cos, sin: (T, D) -> (…, T, D)
    pub fn rotary(
        &mut self,
        x: TensorId,
        cos: TensorId,
        sin: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.rotary_op(x, cos, sin, false)
    }

    /// [`Graph::rotary`] with sin negated when `inverse` (its backward).
    pub(crate) fn rotary_op(
        &mut self,
        x: TensorId,
        cos: TensorId,
        sin: TensorId,
        inverse: bool,
    ) -> Result<TensorId, GraphError> {
        let op = "rotary";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let (sc, _) = self.float_arg(op, "cos", cos)?;
        let (ss, _) = self.float_arg(op, "sin", sin)?;
        let named: &[(&str, &[usize])] = &[("x", &sx), ("cos", &sc), ("sin", &ss)];
        if sx.len() < 2 || sc.len() != 2 || sc != ss || sc[..] != sx[sx.len() - 2..] {
            return Err(shape_err(op, "need x (…, T, D) with cos and sin (T, D)", named));
        }
        if !sc[1].is_multiple_of(2) {
            return Err(shape_err(op, "the rotated dim D must be even", named));
        }
        Ok(self.push(
            Op::Rotary(Rotary { inverse }),
            vec![x, cos, sin],
            vec![(sx, ElemType::Float(dt))],
        )[0])
    }
}

/// cos/sin of HF's `emb = cat(freqs, freqs)` for T positions, D dims, base 10000.
#[cfg(test)]
pub(crate) fn hf_cos_sin(t: usize, d: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut c, mut s) = (vec![0.0; t * d], vec![0.0; t * d]);
    for p in 0..t {
        for i in 0..d {
            let j = i % (d / 2);
            let inv_freq = 1.0 / 10000f64.powf((2 * j) as f64 / d as f64);
            // + 0.1: position 0's sin is not zero (zeros hide missing terms).
            let a = p as f64 * inv_freq + 0.1;
            c[p * d + i] = a.cos();
            s[p * d + i] = a.sin();
        }
    }
    (c, s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    /// The forward's definition at one element: HF's formula written out.
    #[test]
    fn matches_hf_formula() {
        let (b, t, d) = (2, 3, 6);
        let (c, s) = hf_cos_sin(t, d);
        let x = Rng::new(3).vec(b * t * d);
        let mut y = vec![0.0; b * t * d];
        rotary_forward(&mut y, &x, &c, &s, d, false);
        for r in 0..b * t {
            let p = r % t;
            for i in 0..d {
                let rot = if i < 3 { -x[r * d + i + 3] } else { x[r * d + i - 3] };
                let want = x[r * d + i] * c[p * d + i] + rot * s[p * d + i];
                assert!((y[r * d + i] - want).abs() < 1e-15);
            }
        }
    }

    /// The inverse op is the backward: Rotary{inverse}(dy) equals the finite-difference
    /// gradient of Σ rotary(x)·dy (f64, FD_TOL), with HF's equal-halves cos/sin.
    #[test]
    fn inverse_is_the_backward_by_finite_differences() {
        let (b, t, d) = (2, 5, 8);
        let (c, s) = hf_cos_sin(t, d);
        let mut rng = Rng::new(71);
        let (x, dy) = (rng.vec(b * t * d), rng.vec(b * t * d));
        let mut dx = vec![0.0; b * t * d];
        rotary_forward(&mut dx, &dy, &c, &s, d, true);
        let fd = fd_grad(&x, FD_STEP, |x| {
            let mut y = vec![0.0; b * t * d];
            rotary_forward(&mut y, x, &c, &s, d, false);
            dot(&y, &dy)
        });
        assert_close(&dx, &fd, FD_TOL, "dx");
    }
}
