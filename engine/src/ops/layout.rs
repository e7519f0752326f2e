//! Layout ops: permute (transpose), and split / concat along the last dim. Reshape needs no
//! kernel (tensors are contiguous: the data is unchanged).
//!
//! Mirrors `torch.permute(...).contiguous()`, `torch.split(x, sizes, dim=-1)` (GPT-2 splits
//! c_attn's output into q, k, v) and `torch.cat(xs, dim=-1)`, its backward.

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::OpError;
use super::Real;
use crate::graph::builder::shape_err;
use crate::graph::GraphError;
use crate::graph::{ElemType, Graph, Op, TensorId};
use crate::plan::Req;

/// (x) → the same data under the output's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reshape;

impl Reference for Reshape {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        outs[0].copy_from_slice(a.f(0));
        Ok(())
    }
}

impl OpDef for Reshape {
    fn name(&self) -> &'static str {
        "reshape"
    }

    fn read_req(&self, _slot: usize) -> Req {
        // Views and strided copies read any strides.
        Req::Any
    }

    fn write_req(&self, _slot: usize) -> Req {
        Req::Any
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let (sx, dy) = (cx.shape(cx.ins()[0]), cx.gy()?);
        Ok(vec![Some(cx.g.reshape(dy, &sx)?)])
    }
}

/// (x) → x.permute(perm), materialised.
#[derive(Debug, Clone, PartialEq)]
pub struct Permute {
    pub perm: Vec<usize>,
}

impl Reference for Permute {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        permute_forward(&mut outs[0], a.f(0), a.shape(0), &self.perm);
        Ok(())
    }
}

impl OpDef for Permute {
    fn name(&self) -> &'static str {
        "permute"
    }

    fn attrs(&self) -> String {
        format!("perm={:?}", self.perm)
    }

    fn read_req(&self, _slot: usize) -> Req {
        // Views and strided copies read any strides.
        Req::Any
    }

    fn write_req(&self, _slot: usize) -> Req {
        Req::Any
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let dy = cx.gy()?;
        Ok(vec![Some(cx.g.permute(dy, &inverse_perm(&self.perm))?)])
    }
}

/// (x (…, Σ sizes)) → one output `(…, sizes[i])` per size.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    pub sizes: Vec<usize>,
}

impl Reference for Split {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let mut views: Vec<&mut [T]> = outs.iter_mut().map(|o| &mut o[..]).collect();
        split_forward(&mut views, a.f(0), &self.sizes);
        Ok(())
    }
}

impl OpDef for Split {
    fn name(&self) -> &'static str {
        "split"
    }

    fn attrs(&self) -> String {
        format!("sizes={:?}", self.sizes)
    }

    fn read_req(&self, _slot: usize) -> Req {
        // Views and strided copies read any strides.
        Req::Any
    }

    fn write_req(&self, _slot: usize) -> Req {
        Req::Any
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        // Unused pieces contribute zeros.
        let mut pieces = Vec::with_capacity(cx.outs().len());
        for (&o, d) in cx.outs().iter().zip(cx.gout) {
            pieces.push(match d {
                Some(d) => *d,
                None => {
                    let s = cx.shape(o);
                    cx.g.fill(&s, 0.0)
                }
            });
        }
        Ok(vec![Some(cx.g.concat(&pieces)?)])
    }
}

/// (x_0 (…, n_0), x_1 (…, n_1), …) → (…, Σ n_i)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Concat;

impl Reference for Concat {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let xs: Vec<&[T]> = (0..a.operands()).map(|i| a.f(i)).collect();
        let sizes: Vec<usize> = (0..a.operands()).map(|i| a.last(i)).collect();
        concat_forward(&mut outs[0], &xs, &sizes);
        Ok(())
    }
}

impl OpDef for Concat {
    fn name(&self) -> &'static str {
        "concat"
    }

    fn read_req(&self, _slot: usize) -> Req {
        // Views and strided copies read any strides.
        Req::Any
    }

    fn write_req(&self, _slot: usize) -> Req {
        Req::Any
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let sizes: Vec<usize> = cx
            .ins()
            .iter()
            .map(|&t| *cx.g.shape(t).last().expect("concat inputs are >= 1-D"))
            .collect();
        let dy = cx.gy()?;
        Ok(cx.g.split(dy, &sizes)?.into_iter().map(Some).collect())
    }
}

/// out = x.permute(perm), materialised: `out.shape[i] = shape[perm[i]]`.
// out: (shape[perm[0]], …, shape[perm[r-1]])
// x: shape
pub fn permute_forward<T: Real>(out: &mut [T], x: &[T], shape: &[usize], perm: &[usize]) {
    let rank = shape.len();
    let mut x_strides = vec![1; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        x_strides[d] = x_strides[d + 1] * shape[d + 1];
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    // Stride in x of each output dim, then walk the output with an odometer.
    let strides: Vec<usize> = perm.iter().map(|&p| x_strides[p]).collect();
    let mut idx = vec![0usize; rank];
    let mut src = 0usize;
    for o in out.iter_mut() {
        *o = x[src];
        for d in (0..rank).rev() {
            idx[d] += 1;
            src += strides[d];
            if idx[d] < out_shape[d] {
                break;
            }
            src -= strides[d] * out_shape[d];
            idx[d] = 0;
        }
    }
}

/// The permutation that undoes `perm` (the backward of a permute is a permute by it).
pub fn inverse_perm(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

/// `outs[i] = x[:, start_i .. start_i + sizes[i]]` for rows of length Σ sizes.
// outs[i]: (R, sizes[i])
// x: (R, Σ sizes)
pub fn split_forward<T: Real>(outs: &mut [&mut [T]], x: &[T], sizes: &[usize]) {
    let n: usize = sizes.iter().sum();
    for (r, row) in x.chunks_exact(n).enumerate() {
        let mut start = 0;
        for (out, &s) in outs.iter_mut().zip(sizes) {
            out[r * s..(r + 1) * s].copy_from_slice(&row[start..start + s]);
            start += s;
        }
    }
}

/// `out[:, start_i .. start_i + sizes[i]] = xs[i]`: the inverse of [`split_forward`].
// out: (R, Σ sizes)
// xs[i]: (R, sizes[i])
pub fn concat_forward<T: Real>(out: &mut [T], xs: &[&[T]], sizes: &[usize]) {
    let n: usize = sizes.iter().sum();
    for (r, row) in out.chunks_exact_mut(n).enumerate() {
        let mut start = 0;
        for (x, &s) in xs.iter().zip(sizes) {
            row[start..start + s].copy_from_slice(&x[r * s..(r + 1) * s]);
            start += s;
        }
    }
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// The same data under a new shape with the same number of elements.
    pub fn reshape(&mut self, x: TensorId, shape: &[usize]) -> Result<TensorId, GraphError> {
        let op = "reshape";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        if sx.iter().product::<usize>() != shape.iter().product::<usize>() {
            return Err(shape_err(
                op,
                "the element count changes",
                &[("x", &sx), ("shape", shape)],
            ));
        }
        Ok(self.push(Op::Reshape, vec![x], vec![(shape.to_vec(), ElemType::Float(dt))])[0])
    }

    /// x.permute(perm): output dim `i` is input dim `perm[i]`.
    pub fn permute(&mut self, x: TensorId, perm: &[usize]) -> Result<TensorId, GraphError> {
        let op = "permute";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        let mut seen = vec![false; sx.len()];
        let valid = perm.len() == sx.len()
            && perm.iter().all(|&p| p < sx.len() && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(GraphError::Attr {
                op,
                msg: format!(
                    "{perm:?} is not a permutation of the {} dims of x {}",
                    sx.len(),
                    crate::graph::fmt_shape(&sx)
                ),
            });
        }
        let out = perm.iter().map(|&p| sx[p]).collect();
        Ok(self.push(
            Op::Permute(Permute { perm: perm.to_vec() }),
            vec![x],
            vec![(out, ElemType::Float(dt))],
        )[0])
    }

    /// Swaps dims d0 and d1 (a permute).
    pub fn transpose(&mut self, x: TensorId, d0: usize, d1: usize) -> Result<TensorId, GraphError> {
        let rank = self.info(x)?.shape.len();
        let mut perm: Vec<usize> = (0..rank).collect();
        if d0 < rank && d1 < rank {
            perm.swap(d0, d1);
        } else {
            return Err(GraphError::Attr {
                op: "permute",
                msg: format!("transpose of dims {d0}, {d1} of a {rank}-D tensor"),
            });
        }
        self.permute(x, &perm)
    }

    /// Splits the last dim into pieces of `sizes` (which must add up to it).
    pub fn split(&mut self, x: TensorId, sizes: &[usize]) -> Result<Vec<TensorId>, GraphError> {
        let op = "split";
        let (sx, dt) = self.float_arg(op, "x", x)?;
        if sx.is_empty()
            || sizes.is_empty()
            || sizes.contains(&0)
            || sizes.iter().sum::<usize>() != sx[sx.len() - 1]
        {
            return Err(shape_err(
                op,
                format!("sizes {sizes:?} must be positive and add up to x's last dim"),
                &[("x", &sx)],
            ));
        }
        let outs = sizes
            .iter()
            .map(|&s| {
                let mut o = sx.clone();
                *o.last_mut().expect("checked non-empty") = s;
                (o, ElemType::Float(dt))
            })
            .collect();
        Ok(self.push(Op::Split(Split { sizes: sizes.to_vec() }), vec![x], outs))
    }

    /// Concatenates along the last dim; all other dims must agree.
    pub fn concat(&mut self, xs: &[TensorId]) -> Result<TensorId, GraphError> {
        let op = "concat";
        let mut shapes = Vec::with_capacity(xs.len());
        let mut dt = self.dtype;
        for &x in xs {
            let (s, d) = self.float_arg(op, "input", x)?;
            dt = d;
            shapes.push(s);
        }
        let names: Vec<String> = (0..xs.len()).map(|i| format!("x{i}")).collect();
        let named: Vec<(&str, &[usize])> =
            names.iter().map(|n| n.as_str()).zip(shapes.iter().map(|s| s.as_slice())).collect();
        let Some(first) = shapes.first() else {
            return Err(GraphError::Attr { op, msg: "needs at least one input".into() });
        };
        let lead = &first[..first.len().saturating_sub(1)];
        if shapes.iter().any(|s| s.is_empty() || &s[..s.len() - 1] != lead) {
            return Err(shape_err(op, "inputs must agree on all but the last dim", &named));
        }
        let mut out = lead.to_vec();
        out.push(shapes.iter().map(|s| s[s.len() - 1]).sum());
        Ok(self.push(Op::Concat, xs.to_vec(), vec![(out, ElemType::Float(dt))])[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    #[test]
    fn permute_moves_elements_and_inverse_undoes_it() {
        // x: (2, 3, 4) -> (4, 2, 3)
        let shape = [2, 3, 4];
        let perm = [2, 0, 1];
        let x: Vec<f64> = (0..24).map(|v| v as f64).collect();
        let mut y = vec![0.0; 24];
        permute_forward(&mut y, &x, &shape, &perm);
        // y[k, i, j] = x[i, j, k]
        for i in 0..2 {
            for j in 0..3 {
                for k in 0..4 {
                    assert_eq!(y[k * 6 + i * 3 + j], x[i * 12 + j * 4 + k]);
                }
            }
        }
        let mut back = vec![0.0; 24];
        permute_forward(&mut back, &y, &[4, 2, 3], &inverse_perm(&perm));
        assert_eq!(back, x);
    }

    #[test]
    fn permute_backward_matches_finite_differences() {
        let shape = [2, 3, 2, 2];
        let perm = [0, 2, 1, 3]; // the attention head transpose
        let mut rng = Rng::new(11);
        let (x, dy) = (rng.vec(24), rng.vec(24));
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let mut dx = vec![0.0; 24];
        permute_forward(&mut dx, &dy, &out_shape, &inverse_perm(&perm));
        let fd = fd_grad(&x, FD_STEP, |x| {
            let mut y = vec![0.0; 24];
            permute_forward(&mut y, x, &shape, &perm);
            dot(&y, &dy)
        });
        assert_close(&dx, &fd, FD_TOL, "dx");
    }

    #[test]
    fn split_then_concat_round_trips_and_concat_is_splits_backward() {
        let sizes = [2, 3, 1];
        let mut rng = Rng::new(12);
        let x = rng.vec(4 * 6);
        let (mut a, mut b, mut c) = (vec![0.0; 8], vec![0.0; 12], vec![0.0; 4]);
        split_forward(&mut [&mut a[..], &mut b[..], &mut c[..]], &x, &sizes);
        assert_eq!(&b[3..6], &x[8..11]);
        let mut y = vec![0.0; 24];
        concat_forward(&mut y, &[&a[..], &b[..], &c[..]], &sizes);
        assert_eq!(y, x);

        let (da, db, dc) = (rng.vec(8), rng.vec(12), rng.vec(4));
        let mut dx = vec![0.0; 24];
        concat_forward(&mut dx, &[&da[..], &db[..], &dc[..]], &sizes);
        let fd = fd_grad(&x, FD_STEP, |x| {
            let (mut a, mut b, mut c) = (vec![0.0; 8], vec![0.0; 12], vec![0.0; 4]);
            split_forward(&mut [&mut a[..], &mut b[..], &mut c[..]], x, &sizes);
            dot(&a, &da) + dot(&b, &db) + dot(&c, &dc)
        });
        assert_close(&dx, &fd, FD_TOL, "dx");
    }
}
