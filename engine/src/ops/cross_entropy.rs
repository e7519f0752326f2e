//! Cross-entropy over the last dim with integer labels, `ignore_index`, mean over the rows that
//! are not ignored.
//!
//! Mirrors `torch.nn.functional.cross_entropy(logits.view(-1, V), labels.view(-1),
//! ignore_index=-100, reduction='mean')` (log-sum-exp with max subtraction; all rows ignored gives
//! NaN, as torch's 0/0) and llm.c's `crossentropy_forward` + `crossentropy_softmax_backward`.

use super::def::{EvalArgs, GradCtx, Grads, OpDef, Reference};
use super::{OpError, Real};
use crate::backend::cpu::kernels::cross_entropy::check_labels;
use crate::graph::builder::shape_err;
use crate::graph::GraphError;
use crate::graph::{ElemType, Graph, Node, Op, TensorId, IGNORE_INDEX};
use crate::plan::split::LossHead;
use crate::DType;

/// (logits (…, V), labels (…) i64) → () the mean over labels != ignore_index.
///
/// This op *is* the softmax + cross-entropy fusion: the forward is a log-sum-exp per row
/// (no probabilities stored), the backward recomputes softmax from the logits once and
/// writes softmax − onehot (see `passes` for why there is no separate pass).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossEntropy {
    pub ignore_index: i64,
}

impl Reference for CrossEntropy {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        outs[0][0] = cross_entropy_forward(a.f(0), a.ids(1), a.last(0), self.ignore_index)?;
        Ok(())
    }
}

impl OpDef for CrossEntropy {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }

    fn attrs(&self) -> String {
        format!("ignore_index={}", self.ignore_index)
    }

    fn loss_head(&self) -> Option<LossHead> {
        Some(LossHead { inputs: &[0], outputs: &[], scratch: true })
    }

    fn check_ids<'a>(
        &self,
        g: &Graph,
        node: &Node,
        ids: &dyn Fn(usize) -> Option<&'a [i64]>,
    ) -> Result<(), OpError> {
        let v = *g.shape(node.inputs[0]).last().unwrap_or(&1);
        ids(1).map_or(Ok(()), |l| check_labels(l, v, self.ignore_index).map(|_| ()))
    }

    fn grad(&self, cx: &mut GradCtx<'_>) -> Result<Grads, GraphError> {
        let (ins, dy) = (cx.ins(), cx.gy()?);
        let dlogits = cx.g.cross_entropy_backward(dy, ins[0], ins[1], self.ignore_index)?;
        Ok(vec![Some(dlogits), None])
    }
}

/// (dloss (), logits (…, V), labels (…)) → dlogits (…, V)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossEntropyBackward {
    pub ignore_index: i64,
}

impl Reference for CrossEntropyBackward {
    fn eval<T: Real>(&self, a: &EvalArgs<'_, T>, outs: &mut [Vec<T>]) -> Result<(), OpError> {
        let (dloss, v) = (a.f(0)[0], a.last(1));
        cross_entropy_backward(&mut outs[0], dloss, a.f(1), a.ids(2), v, self.ignore_index)?;
        Ok(())
    }
}

impl OpDef for CrossEntropyBackward {
    fn name(&self) -> &'static str {
        "cross_entropy_backward"
    }

    fn attrs(&self) -> String {
        format!("ignore_index={}", self.ignore_index)
    }

    // Over dlogits.
    fn inplace_inputs(&self) -> &'static [usize] {
        &[1]
    }

    // (dloss, logits, labels) → dlogits: usually written over the logits in place.
    fn loss_head(&self) -> Option<LossHead> {
        Some(LossHead { inputs: &[1], outputs: &[0], scratch: true })
    }
}

/// The mean loss over rows whose label != ignore_index.
// logits: (R, V)
// labels: (R)
pub fn cross_entropy_forward<T: Real>(
    logits: &[T],
    labels: &[i64],
    v: usize,
    ignore_index: i64,
) -> Result<T, OpError> {
    let mut sum = T::ZERO;
    let mut count = 0usize;
    for (r, (row, &label)) in logits.chunks_exact(v).zip(labels).enumerate() {
        let Some(y) = check_label(label, r, v, ignore_index)? else {
            continue;
        };
        sum += log_sum_exp(row) - row[y];
        count += 1;
    }
    Ok(sum / T::from_f64(count as f64))
}

/// dlogits = dloss/count · (softmax(row) - onehot(label)) on counted rows, 0 on ignored rows.
// dlogits, logits: (R, V)
// labels: (R)
pub fn cross_entropy_backward<T: Real>(
    dlogits: &mut [T],
    dloss: T,
    logits: &[T],
    labels: &[i64],
    v: usize,
    ignore_index: i64,
) -> Result<(), OpError> {
    let count = labels.iter().filter(|&&l| l != ignore_index).count();
    let g = dloss / T::from_f64(count.max(1) as f64);
    for (r, ((drow, row), &label)) in
        dlogits.chunks_exact_mut(v).zip(logits.chunks_exact(v)).zip(labels).enumerate()
    {
        let Some(y) = check_label(label, r, v, ignore_index)? else {
            drow.fill(T::ZERO);
            continue;
        };
        let lse = log_sum_exp(row);
        for (d, &s) in drow.iter_mut().zip(row) {
            *d = g * (s - lse).exp();
        }
        drow[y] -= g;
    }
    Ok(())
}

/// log Σ exp(row), subtracting the max first.
// row: (V)
fn log_sum_exp<T: Real>(row: &[T]) -> T {
    let mut max = T::NEG_INFINITY;
    for &s in row {
        max = max.max(s);
    }
    let mut sum = T::ZERO;
    for &s in row {
        sum += (s - max).exp();
    }
    max + sum.ln()
}

fn check_label(
    label: i64,
    position: usize,
    v: usize,
    ignore_index: i64,
) -> Result<Option<usize>, OpError> {
    if label == ignore_index {
        return Ok(None);
    }
    if label < 0 || label as usize >= v {
        return Err(OpError::IndexOutOfRange {
            op: "cross_entropy",
            index: label,
            position,
            limit: v,
        });
    }
    Ok(Some(label as usize))
}

/// The op's graph constructors: operand checks and the output shape rule.
impl Graph {
    /// Mean cross-entropy of `logits` (…, V) against `labels` (…), ignoring label -100.
    pub fn cross_entropy(
        &mut self,
        logits: TensorId,
        labels: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.cross_entropy_with_ignore(logits, labels, IGNORE_INDEX)
    }

    pub fn cross_entropy_with_ignore(
        &mut self,
        logits: TensorId,
        labels: TensorId,
        ignore_index: i64,
    ) -> Result<TensorId, GraphError> {
        let op = "cross_entropy";
        let (sl, _) = self.float_arg(op, "logits", logits)?;
        let sy = self.ids_arg(op, "labels", labels)?;
        if sl.is_empty() || sy[..] != sl[..sl.len() - 1] {
            return Err(shape_err(
                op,
                "labels must have logits' shape without its last (class) dim",
                &[("logits", &sl), ("labels", &sy)],
            ));
        }
        // The loss stays f32 whatever the storage dtype, as in PyTorch autocast.
        Ok(self.push(
            Op::CrossEntropy(CrossEntropy { ignore_index }),
            vec![logits, labels],
            vec![(vec![], ElemType::Float(DType::F32))],
        )[0])
    }

    pub(crate) fn cross_entropy_backward(
        &mut self,
        dloss: TensorId,
        logits: TensorId,
        labels: TensorId,
        ignore_index: i64,
    ) -> Result<TensorId, GraphError> {
        let op = "cross_entropy_backward";
        let (sd, _) = self.float_arg(op, "dloss", dloss)?;
        let (sl, dt) = self.float_arg(op, "logits", logits)?;
        let sy = self.ids_arg(op, "labels", labels)?;
        if !sd.is_empty() || sl.is_empty() || sy[..] != sl[..sl.len() - 1] {
            return Err(shape_err(
                op,
                "inconsistent operands",
                &[("dloss", &sd), ("logits", &sl), ("labels", &sy)],
            ));
        }
        let attrs = Op::CrossEntropyBackward(CrossEntropyBackward { ignore_index });
        Ok(self.push(attrs, vec![dloss, logits, labels], vec![(sl, ElemType::Float(dt))])[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    const IGNORE: i64 = -100;

    #[test]
    fn matches_pytorch_f32() {
        let x = [0.3f32, -1.2, 2.0, 0.7, 1.5, 0.1, -0.4, -2.2];
        // F.cross_entropy(x.view(2, 4), labels) in torch 2.11 f32.
        let l1 = cross_entropy_forward(&x, &[2, IGNORE], 4, IGNORE).unwrap();
        let l2 = cross_entropy_forward(&x, &[2, 0], 4, IGNORE).unwrap();
        assert!((l1 - 0.40277976).abs() < 1e-6, "{l1}");
        assert!((l2 - 0.3770313).abs() < 1e-6, "{l2}");
        assert!(cross_entropy_forward(&x, &[IGNORE, IGNORE], 4, IGNORE).unwrap().is_nan());
    }

    #[test]
    fn backward_with_ignored_rows_matches_finite_differences() {
        let (r, v) = (5, 7);
        let mut rng = Rng::new(15);
        let logits: Vec<f64> = rng.vec(r * v).iter().map(|x| 3.0 * x).collect();
        let labels = [3, IGNORE, 0, 6, IGNORE];
        let mut d = vec![0.0; r * v];
        cross_entropy_backward(&mut d, 1.7, &logits, &labels, v, IGNORE).unwrap();
        let fd = fd_grad(&logits, FD_STEP, |x| {
            1.7 * cross_entropy_forward(x, &labels, v, IGNORE).unwrap()
        });
        assert_close(&d, &fd, FD_TOL, "dlogits");
        assert!(d[v..2 * v].iter().all(|&g| g == 0.0), "ignored rows get no gradient");
    }

    #[test]
    fn bad_label_is_an_error() {
        let x = [0.0f32; 4];
        assert!(cross_entropy_forward(&x, &[4], 4, IGNORE).is_err());
        assert!(cross_entropy_forward(&x, &[-1], 4, IGNORE).is_err());
    }
}
