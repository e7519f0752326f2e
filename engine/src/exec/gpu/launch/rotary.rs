//! Launcher of `engine/kernels/rotary.cu`: rotary position embedding on q or k, one thread per
//! pair (x[i], x[i + D/2]), grid-stride, in place when the plan says so, on rows at the plan's
//! strides (up to three leading dims: the head permutes around the op folded). CPU
//! counterpart: `backend/cpu/kernels/rotary.rs`; the op: `ops::rotary`.

use super::{grid_stride, kernel_name, Arg, Device, Launch};
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op::Rotary;
use crate::plan::PlanError;
use crate::DType;

/// `rotary_<T>`: y = x·cos + rotate_half(x)·sin (sin negated when `inverse`); y may be x.
// y, x: (n0, n1, n2, d) T rows at strides ys, xs (elements; last stride 1), rows = n0·n1·n2,
// the position of row r is r mod t; cos, sin: (t, d) T
pub struct RotaryLaunch<P> {
    pub dtype: DType,
    pub y: P,
    pub x: P,
    pub cos: P,
    pub sin: P,
    /// (n0, n1, n2): the leading dims.
    pub lead: [usize; 3],
    pub xs: [i64; 3],
    pub ys: [i64; 3],
    pub d: usize,
    pub t: usize,
    pub inverse: bool,
}

impl<P> RotaryLaunch<P> {
    /// Dense (R, d) rows for y and x.
    pub fn dense(
        dtype: DType,
        (y, x, cos, sin): (P, P, P, P),
        rows: usize,
        d: usize,
        t: usize,
        inverse: bool,
    ) -> Self {
        let s = [0, 0, d as i64];
        RotaryLaunch { dtype, y, x, cos, sin, lead: [1, 1, rows], xs: s, ys: s, d, t, inverse }
    }

    pub fn launch(self, dev: Device) -> Launch<P> {
        let sg = if self.inverse { -1.0 } else { 1.0 };
        let rows: usize = self.lead.iter().product();
        let mut args = vec![
            Arg::Ptr(self.y),
            Arg::Ptr(self.x),
            Arg::Ptr(self.cos),
            Arg::Ptr(self.sin),
            Arg::I64(rows as i64),
            Arg::I32(self.d as i32),
            Arg::I32(self.t as i32),
            Arg::I64(self.lead[1] as i64),
            Arg::I64(self.lead[2] as i64),
        ];
        args.extend(self.xs.iter().chain(&self.ys).map(|&s| Arg::I64(s)));
        args.push(Arg::F32(sg));
        grid_stride(kernel_name("rotary", self.dtype), rows * (self.d / 2), dev, args)
    }
}

/// The leading dims of x (…, D) and the x and y strides over them, as at most three dims: size-1
/// dims dropped, neighbours merged where both operands step through them as one (stride of the
/// outer = size × stride of the inner), ones prepended. None when more than three remain.
pub fn rows3(
    lead: &[usize],
    xs: &[usize],
    ys: &[usize],
) -> Option<([usize; 3], [i64; 3], [i64; 3])> {
    let mut dims: Vec<(usize, usize, usize)> = Vec::new();
    for ((&n, &x), &y) in lead.iter().zip(xs).zip(ys) {
        if n == 1 {
            continue;
        }
        match dims.last_mut() {
            Some(o) if o.1 == n * x && o.2 == n * y => *o = (o.0 * n, x, y),
            _ => dims.push((n, x, y)),
        }
    }
    if dims.len() > 3 {
        return None;
    }
    while dims.len() < 3 {
        dims.insert(0, (1, 0, 0));
    }
    Some((
        [dims[0].0, dims[1].0, dims[2].0],
        [dims[0].1 as i64, dims[1].1 as i64, dims[2].1 as i64],
        [dims[0].2 as i64, dims[1].2 as i64, dims[2].2 as i64],
    ))
}

impl GpuKernel for Rotary {
    // (x (…, T, D), cos (T, D), sin (T, D)) → y (…, T, D); x and y rows at the plan's strides
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let (ins, outs) = (&cx.node.inputs, &cx.node.outputs);
        cx.same(&[outs[0], ins[0], ins[1], ins[2]])?;
        let shape = cx.g.shape(ins[0]);
        let (lead, d) = (&shape[..shape.len() - 1], cx.last(ins[0]));
        let (y, yt) = match cx.inplace {
            Some(_) => (cx.inp(0), ins[0]),
            None => (cx.out(0), outs[0]),
        };
        let (xs, ys) = (&r.strides(ins[0])[..lead.len()], &r.strides(yt)[..lead.len()]);
        let (lead, xs, ys) = rows3(lead, xs, ys).ok_or_else(|| {
            cx.no(": rotary rows over more than three leading dims that do not merge")
        })?;
        let l = RotaryLaunch {
            dtype: cx.dt(outs[0]),
            y,
            x: cx.inp(0),
            cos: cx.inp(1),
            sin: cx.inp(2),
            lead,
            xs,
            ys,
            d,
            t: cx.n(ins[1]) / d,
            inverse: self.inverse,
        };
        Ok(vec![l.launch(r.device()).into()])
    }
}

#[cfg(test)]
mod tests {
    use super::rows3;

    /// q (B, T, H·D) seen as (B, H, T, D) stays three dims; dense rows merge into one; a
    /// size-1 dim drops out; four dims that cannot merge are refused.
    #[test]
    fn rows3_merges_what_steps_as_one_and_refuses_the_rest() {
        let (b, h, t, d) = (2usize, 3usize, 5usize, 4usize);
        let q = [t * h * d, d, h * d];
        let dense = [h * t * d, t * d, d];
        assert_eq!(
            rows3(&[b, h, t], &q, &dense),
            Some(([b, h, t], q.map(|s| s as i64), dense.map(|s| s as i64)))
        );
        assert_eq!(
            rows3(&[b, h, t], &dense, &dense),
            Some(([1, 1, b * h * t], [0, 0, 4], [0, 0, 4]))
        );
        assert_eq!(
            rows3(&[b, 1, t], &[t * d, 0, d], &[t * d, 0, d]),
            Some(([1, 1, b * t], [0, 0, 4], [0, 0, 4]))
        );
        assert_eq!(rows3(&[2, 2, 2, 2], &[1000, 100, 10, 1], &[8, 4, 2, 1]), None);
    }
}
