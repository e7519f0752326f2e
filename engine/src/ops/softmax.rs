//! Softmax over the last dim of `x·scale + mask`, with an optional causal mask.
//!
//! Mirrors `torch.softmax(x * scale + mask, dim=-1)` (max-subtracted, as ATen) with the causal
//! mask of `torch.tril` (HF GPT-2 / `scaled_dot_product_attention(is_causal=True)`: query i sees
//! keys j ≤ i), and llm.c's `softmax_forward`. The backward is `_softmax_backward_data`.

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::{MaskView, Real};
use crate::graph::builder::{broadcastable, shape_err};
use crate::graph::GraphError;
use crate::graph::{ElemType, Graph, Op, TensorId};

/// (x (…, N) [, mask broadcastable to x]) → softmax(x·scale + mask) over the last dim;
/// `causal` masks j > i over the last two dims.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Softmax {
    pub scale: f32,
    pub causal: bool,
}

impl Reference for Softmax {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let s = a.shape(0);
        let tq = if s.len() >= 2 { s[s.len() - 2] } else { 1 };
        let m = a.mask(1, s);
        let (scale, last) = (a.t(self.scale), a.last(0));
        softmax_forward(&mut outs[0], a.f(0), last, scale, self.causal, tq, m.as_ref());
        Ok(())
    }
}

impl OpDef for Softmax {
    fn name(&self) -> &'static str {
        "softmax"
    }

    fn attrs(&self) -> String {
        format!("scale={} causal={}", self.scale, self.causal)
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        cx.no_mask_grad(1)?;
        let (outs, dy) = (cx.outs(), cx.gy()?);
        Ok(vec![Some(cx.g.softmax_backward(outs[0], dy, self.scale)?), None])
    }
}

/// (y, dy) → dx, gradient w.r.t. the unscaled input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftmaxBackward {
    pub scale: f32,
}

impl Reference for SoftmaxBackward {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        softmax_backward(&mut outs[0], a.f(0), a.f(1), a.last(0), a.t(self.scale));
        Ok(())
    }
}

impl OpDef for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "softmax_backward"
    }

    fn attrs(&self) -> String {
        format!("scale={}", self.scale)
    }

    // Over dy.
    fn inplace_inputs(&self) -> &'static [usize] {
        &[1]
    }
}

/// y = softmax(x·scale + mask) over rows of length `n`; with `causal`, row r is query
/// i = r mod `tq` and entries j > i are -inf (weight 0).
// y, x: (R, N), R = (…, Tq)
// mask: broadcastable to (…, Tq, N)
pub fn softmax_forward<T: Real>(
    y: &mut [T],
    x: &[T],
    n: usize,
    scale: T,
    causal: bool,
    tq: usize,
    mask: Option<&MaskView<'_, T>>,
) {
    for (r, (xr, yr)) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)).enumerate() {
        let moff = mask.map(|m| m.row_offset(r));
        for j in 0..n {
            yr[j] = xr[j] * scale;
            if let (Some(m), Some(off)) = (mask, moff) {
                yr[j] += m.at(off, j);
            }
        }
        if causal {
            yr[(r % tq + 1).min(n)..].fill(T::NEG_INFINITY);
        }
        softmax_in_place(yr);
    }
}

/// row = softmax(row), subtracting the max first so exp never overflows. A row whose every
/// entry is −∞ (every key masked: a left-padded query under the causal mask) becomes zeros,
/// as torch's sdpa does since 2.5 (`_safe_softmax`) — not 0/0 = NaN, which would poison the
/// gradients of the whole batch.
// row: (N)
pub fn softmax_in_place<T: Real>(row: &mut [T]) {
    let mut max = T::NEG_INFINITY;
    for &v in row.iter() {
        max = max.max(v);
    }
    if max == T::NEG_INFINITY {
        row.fill(T::ZERO);
        return;
    }
    let mut sum = T::ZERO;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = T::ONE / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// dx = scale·y·(dy - Σ_j dy_j·y_j): the gradient w.r.t. the unscaled input x. Masked entries
/// have y = 0 and so get 0.
// dx, y, dy: (R, N)
pub fn softmax_backward<T: Real>(dx: &mut [T], y: &[T], dy: &[T], n: usize, scale: T) {
    for ((dxr, yr), dyr) in dx.chunks_exact_mut(n).zip(y.chunks_exact(n)).zip(dy.chunks_exact(n)) {
        let mut s = T::ZERO;
        for j in 0..n {
            s += dyr[j] * yr[j];
        }
        for j in 0..n {
            dxr[j] = scale * yr[j] * (dyr[j] - s);
        }
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// softmax(x·scale + mask) over the last dim; `causal` masks j > i over the last two dims;
    /// `mask` is additive and broadcastable to x (it gets no gradient).
    pub fn softmax(
        &mut self,
        x: TensorId,
        scale: f32,
        causal: bool,
        mask: Option<TensorId>,
    ) -> Result<TensorId, GraphError> {
        let op = "softmax";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        if sx.is_empty() || (causal && sx.len() < 2) {
            return Err(shape_err(op, "x must be at least 1-D (2-D when causal)", &[("x", &sx)]));
        }
        let mut inputs = vec![x];
        if let Some(m) = mask {
            let (sm, _) = self.float_arg(op, "mask", m)?;
            if !broadcastable(&sm, &sx) {
                return Err(shape_err(
                    op,
                    "mask must broadcast to x",
                    &[("x", &sx), ("mask", &sm)],
                ));
            }
            inputs.push(m);
        }
        Ok(self.push(
            Op::Softmax(Softmax { scale, causal }),
            inputs,
            vec![(sx, ElemType::Float(dt))],
        )[0])
    }

    pub(crate) fn softmax_backward(
        &mut self,
        y: TensorId,
        dy: TensorId,
        scale: f32,
    ) -> Result<TensorId, GraphError> {
        self.binary_same(
            "softmax_backward",
            Op::SoftmaxBackward(SoftmaxBackward { scale }),
            [("y", y), ("dy", dy)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    #[test]
    fn matches_pytorch_f32() {
        let x = [0.3f32, -1.2, 2.0, 0.7, 1.5, 0.1, -0.4, -2.2];
        // F.softmax(x, -1) in torch 2.11 f32.
        let want = [
            0.12211649f32,
            0.027247872,
            0.6684593,
            0.18217643,
            0.70378464,
            0.17355117,
            0.1052641,
            0.017400037,
        ];
        let mut y = [0.0f32; 8];
        softmax_forward(&mut y, &x, 4, 1.0, false, 2, None);
        for i in 0..8 {
            assert!((y[i] - want[i]).abs() <= 1e-7, "y[{i}]");
        }
    }

    #[test]
    fn causal_rows_only_see_the_past() {
        let (t, n) = (3, 3);
        let x = Rng::new(1).vec(2 * t * n);
        let mut y = vec![0.0; 2 * t * n];
        softmax_forward(&mut y, &x, n, 1.0, true, t, None);
        assert_eq!(y[0], 1.0); // query 0 sees only key 0
        assert_eq!((y[1], y[2], y[5]), (0.0, 0.0, 0.0));
        assert!(y[4] > 0.0 && y[9] == 1.0);
    }

    #[test]
    fn backward_with_scale_causal_and_broadcast_mask_matches_finite_differences() {
        // x: (B=2, H=2, T=3, T=3); mask: (B, 1, 1, T), BERT's padding mask layout.
        let (b, h, t) = (2, 2, 3);
        let mut rng = Rng::new(8);
        let x = rng.vec(b * h * t * t);
        let mask_data = rng.vec(b * t);
        let dy = rng.vec(b * h * t * t);
        let full = [b, h, t, t];
        for causal in [false, true] {
            let mask = MaskView::new(&mask_data, &[b, 1, 1, t], &full);
            let fwd = |x: &[f64]| {
                let mut y = vec![0.0; x.len()];
                softmax_forward(&mut y, x, t, 0.7, causal, t, Some(&mask));
                y
            };
            let y = fwd(&x);
            let mut dx = vec![0.0; x.len()];
            softmax_backward(&mut dx, &y, &dy, t, 0.7);
            let fd = fd_grad(&x, FD_STEP, |x| dot(&fwd(x), &dy));
            assert_close(&dx, &fd, FD_TOL, &format!("dx causal={causal}"));
        }
    }

    #[test]
    fn mask_broadcast_reads_the_right_entries() {
        // mask (2, 1, 3) against x (2, 2, 3): row r of x uses mask row r / 2.
        let mask = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let m = MaskView::new(&mask, &[2, 1, 3], &[2, 2, 3]);
        assert_eq!(
            (m.row_offset(0), m.row_offset(1), m.row_offset(2), m.row_offset(3)),
            (0, 0, 3, 3)
        );
        assert_eq!(m.at(3, 2), 6.0);
        let last = MaskView::new(&mask[..2], &[2, 1], &[2, 2, 3]); // broadcast along the last dim
        assert_eq!((last.at(last.row_offset(1), 2), last.row_offset(2)), (2.0, 0));
    }
}
