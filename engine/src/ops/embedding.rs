//! Embedding: gather rows of a table by integer id.
//!
//! Mirrors `torch.nn.functional.embedding` (no padding_idx, no max_norm) and llm.c's
//! `encoder_forward` / `encoder_backward` (train_gpt2.c).

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::{OpError, Real};
use crate::graph::builder::shape_err;
use crate::graph::GraphError;
use crate::graph::{ElemType, Graph, Node, Op, TensorId};

/// (table (V, C), ids (…)) → (…, C)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Embedding;

impl Reference for Embedding {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        embedding_forward(&mut outs[0], a.ids(1), a.f(0), a.shape(0)[1])?;
        Ok(())
    }
}

impl OpDef for Embedding {
    fn name(&self) -> &'static str {
        "embedding"
    }

    fn check_ids<'a>(
        &self,
        g: &Graph,
        node: &Node,
        ids: &dyn Fn(usize) -> Option<&'a [i64]>,
    ) -> Result<(), OpError> {
        let vocab = g.shape(node.inputs[0])[0];
        ids(1).map_or(Ok(()), |d| crate::backend::cpu::kernels::embedding::check_ids(d, vocab))
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let ins = cx.ins();
        let (vocab, dy) = (cx.g.shape(ins[0])[0], cx.gy()?);
        let dtable = cx.need[0].then(|| cx.g.embedding_backward(ins[1], dy, vocab)).transpose()?;
        Ok(vec![dtable, None])
    }
}

/// (ids (…), dy (…, C)) → dtable (V, C): scatter-add of rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmbeddingBackward;

impl Reference for EmbeddingBackward {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let c = a.out_shape(0)[1];
        embedding_backward(&mut outs[0], a.ids(0), a.f(1), c)?;
        Ok(())
    }
}

impl OpDef for EmbeddingBackward {
    fn name(&self) -> &'static str {
        "embedding_backward"
    }
}

/// `out[n, :] = table[ids[n], :]`
// out: (N, C)
// ids: (N)
// table: (V, C)
pub fn embedding_forward<T: Real>(
    out: &mut [T],
    ids: &[i64],
    table: &[T],
    c: usize,
) -> Result<(), OpError> {
    let v = table.len() / c;
    for (n, &id) in ids.iter().enumerate() {
        let row = check_id(id, n, v)?;
        out[n * c..(n + 1) * c].copy_from_slice(&table[row * c..(row + 1) * c]);
    }
    Ok(())
}

/// `dtable[v, :]` = sum of `dout[n, :]` over the n with `ids[n] == v` (a scatter-add: repeated ids
/// accumulate, as in PyTorch's dense embedding backward).
// dtable: (V, C)
// ids: (N)
// dout: (N, C)
pub fn embedding_backward<T: Real>(
    dtable: &mut [T],
    ids: &[i64],
    dout: &[T],
    c: usize,
) -> Result<(), OpError> {
    let v = dtable.len() / c;
    dtable.fill(T::ZERO);
    for (n, &id) in ids.iter().enumerate() {
        let row = check_id(id, n, v)?;
        for (d, &g) in dtable[row * c..(row + 1) * c].iter_mut().zip(&dout[n * c..(n + 1) * c]) {
            *d += g;
        }
    }
    Ok(())
}

fn check_id(id: i64, position: usize, limit: usize) -> Result<usize, OpError> {
    if id < 0 || id as usize >= limit {
        return Err(OpError::IndexOutOfRange { op: "embedding", index: id, position, limit });
    }
    Ok(id as usize)
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// Rows of `table` (V, C) gathered by `ids` (…) → (…, C).
    pub fn embedding(&mut self, table: TensorId, ids: TensorId) -> Result<TensorId, GraphError> {
        let op = "embedding";
        let (ts, dt) = self.float_arg(op, "table", table)?;
        let is = self.ids_arg(op, "ids", ids)?;
        if ts.len() != 2 {
            return Err(shape_err(op, "table must be 2-D (V, C)", &[("table", &ts), ("ids", &is)]));
        }
        let mut out = is;
        out.push(ts[1]);
        Ok(self.push(Op::Embedding, vec![table, ids], vec![(out, ElemType::Float(dt))])[0])
    }

    pub(crate) fn embedding_backward(
        &mut self,
        ids: TensorId,
        dy: TensorId,
        vocab: usize,
    ) -> Result<TensorId, GraphError> {
        let op = "embedding_backward";
        let is = self.ids_arg(op, "ids", ids)?;
        let (sd, dt) = self.float_arg(op, "dy", dy)?;
        if sd.len() != is.len() + 1 || sd[..is.len()] != is[..] {
            return Err(shape_err(op, "dy must be (ids…, C)", &[("ids", &is), ("dy", &sd)]));
        }
        let c = sd[sd.len() - 1];
        Ok(self.push(
            Op::EmbeddingBackward,
            vec![ids, dy],
            vec![(vec![vocab, c], ElemType::Float(dt))],
        )[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    #[test]
    fn gathers_rows_and_backward_matches_finite_differences() {
        let (v, c) = (5, 3);
        let ids = [4i64, 0, 4, 2]; // a repeated id: its gradient rows must add up
        let mut rng = Rng::new(1);
        let table = rng.vec(v * c);
        let r = rng.vec(ids.len() * c);
        let mut out = vec![0.0; ids.len() * c];
        embedding_forward(&mut out, &ids, &table, c).unwrap();
        assert_eq!(&out[0..3], &table[12..15]);
        assert_eq!(&out[3..6], &table[0..3]);

        let mut dtable = vec![0.0; v * c];
        embedding_backward(&mut dtable, &ids, &r, c).unwrap();
        let fd = fd_grad(&table, FD_STEP, |t| {
            let mut o = vec![0.0; ids.len() * c];
            embedding_forward(&mut o, &ids, t, c).unwrap();
            dot(&o, &r)
        });
        assert_close(&dtable, &fd, FD_TOL, "dtable");
    }

    #[test]
    fn out_of_range_id_is_an_error() {
        let table = [1.0f32; 6];
        let mut out = [0.0f32; 2];
        let err = embedding_forward(&mut out, &[3], &table, 2).unwrap_err();
        assert_eq!(
            err,
            OpError::IndexOutOfRange { op: "embedding", index: 3, position: 0, limit: 3 }
        );
        assert!(embedding_forward(&mut out, &[-1], &table, 2).is_err());
    }
}
