//! Operands as rows at strides on a GPU: the leading dims of a `Req::Rows` tensor (last dim
//! contiguous) folded into at most three, which the kernels taking rows (rotary, SwiGLU) index
//! as row r = (i0·n1 + i1)·n2 + i2 at i0·s0 + i1·s1 + i2·s2 per operand.

use crate::exec::gpu::kernel::NodeCx;
use crate::exec::gpu::Resolver;
use crate::graph::TensorId;
use crate::plan::PlanError;

/// The leading dims (n0, n1, n2) and each operand's element strides over them.
pub type Rows3<const K: usize> = ([usize; 3], [[i64; 3]; K]);

/// `lead` and each operand's strides over it as at most three dims: size-1 dims dropped,
/// neighbours merged where every operand steps through them as one (stride of the outer = size
/// × stride of the inner), ones prepended. None when more than three remain.
pub fn rows3<const K: usize>(lead: &[usize], strides: [&[usize]; K]) -> Option<Rows3<K>> {
    let mut dims: Vec<(usize, [usize; K])> = Vec::new();
    for (j, &n) in lead.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let s: [usize; K] = std::array::from_fn(|k| strides[k][j]);
        match dims.last_mut() {
            Some(o) if (0..K).all(|k| o.1[k] == n * s[k]) => *o = (o.0 * n, s),
            _ => dims.push((n, s)),
        }
    }
    if dims.len() > 3 {
        return None;
    }
    while dims.len() < 3 {
        dims.insert(0, (1, [0; K]));
    }
    let sizes = [dims[0].0, dims[1].0, dims[2].0];
    Some((sizes, std::array::from_fn(|k| [0, 1, 2].map(|d| dims[d].1[k] as i64))))
}

/// The operands `ts` of a node (all with the node's leading dims, those of `ts[0]`) at the
/// plan's strides, as [`rows3`]; a plan error naming the op when they do not fold into three.
pub fn rows_of<const K: usize>(
    r: &Resolver<'_>,
    cx: &NodeCx<'_>,
    ts: [TensorId; K],
) -> Result<Rows3<K>, PlanError> {
    let shape = cx.g.shape(ts[0]);
    let lead = &shape[..shape.len() - 1];
    rows3(lead, ts.map(|t| &r.strides(t)[..lead.len()])).ok_or_else(|| {
        cx.no(&format!(
            ": {} rows over more than three leading dims that do not merge",
            cx.node.op.name()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::rows3;

    /// q (B, T, H·D) seen as (B, H, T, D) stays three dims; dense rows merge into one; a
    /// size-1 dim drops out; Phi-3's halves of (B, T, 2I) merge into rows at stride 2I; four
    /// dims that cannot merge are refused.
    #[test]
    fn rows3_merges_what_steps_as_one_and_refuses_the_rest() {
        let (b, h, t, d) = (2usize, 3usize, 5usize, 4usize);
        let q = [t * h * d, d, h * d];
        let dense = [h * t * d, t * d, d];
        let s = |v: [usize; 3]| v.map(|x| x as i64);
        assert_eq!(rows3(&[b, h, t], [&q, &dense]), Some(([b, h, t], [s(q), s(dense)])));
        assert_eq!(rows3(&[b, h, t], [&dense, &dense]), Some(([1, 1, b * h * t], [[0, 0, 4]; 2])));
        assert_eq!(rows3(&[b, 1, t], [&[t * d, 0, d]]), Some(([1, 1, b * t], [[0, 0, 4]])));
        let i = 7;
        assert_eq!(
            rows3(&[b, t], [&[t * 2 * i, 2 * i], &[t * i, i]]),
            Some(([1, 1, b * t], [[0, 0, 2 * i as i64], [0, 0, i as i64]]))
        );
        assert_eq!(rows3(&[2, 2, 2, 2], [&[1000, 100, 10, 1], &[8, 4, 2, 1]]), None);
    }
}
