//! The GEMM ops' launches: cuBLASLt calls with their epilogues.
use super::elementwise as ew;
use crate::backend::cpu::kernels::matmul::MatMulPlan;
use crate::backend::gpu::{Epilogue, GemmPtrs, GemmShape};
use crate::exec::gpu::contiguous;
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::support::GpuSupport;
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op::{GeluBackward, Linear, MatMul};
use crate::graph::{ElemType, Graph, Op, TensorId};
use crate::ops::gelu::GeluApprox;
use crate::plan::{Plan, PlanError};
use crate::DType;

/// The GEMMs whose output only a tanh GELU's backward reads, run in place over it (GPT-2's MLP
/// backward: the projection's dx is the GELU's dy): cuBLASLt's DGELU epilogue gives
/// dpre = product ∘ gelu'(pre) directly, from the pre-activation the forward's GELU_AUX_BIAS
/// saved, and the GELU backward node launches nothing. Per such MatMul node: the GELU backward
/// node and the pre-activation. Only where the GEMM is one plain product in the storage dtype
/// and pre has the output's dense layout (the aux takes C's leading dimension).
pub(crate) fn dgelu_pairs(g: &Graph, plan: &Plan) -> Vec<(usize, usize, TensorId)> {
    let producers = g.producers();
    let mut readers = vec![0usize; g.tensors().len()];
    for n in g.nodes() {
        n.inputs.iter().for_each(|t| readers[t.index()] += 1);
    }
    let dense = |t: TensorId| plan.places[t.index()].strides == contiguous(g.shape(t));
    let elem = |t: TensorId| g.tensor(t).elem;
    let mut pairs = Vec::new();
    for s in plan.steps.iter().filter(|s| s.inplace == Some(1)) {
        let node = &g.nodes()[s.node];
        if !matches!(node.op, Op::GeluBackward(GeluBackward { approx: GeluApprox::Tanh })) {
            continue;
        }
        let (pre, dy) = (node.inputs[0], node.inputs[1]);
        let Some(i) = producers[dy.index()] else { continue };
        let mm = &g.nodes()[i];
        let Op::MatMul(MatMul { ta, tb }) = mm.op else { continue };
        let (a, b) = (mm.inputs[0], mm.inputs[1]);
        let strides = |t: TensorId| plan.places[t.index()].strides.clone();
        let one = MatMulPlan::new(
            ta,
            tb,
            (g.shape(a), &strides(a)),
            (g.shape(b), &strides(b)),
            (g.shape(dy), &strides(dy)),
        )
        .is_some_and(|m| m.offs.len() == 1);
        let same = elem(a) == elem(dy) && elem(b) == elem(dy) && elem(pre) == elem(dy);
        if one && same && readers[dy.index()] == 1 && dense(dy) && dense(pre) {
            pairs.push((i, s.node, pre));
        }
    }
    pairs
}

/// `offs` (a matmul plan's matrices, in order) cut into maximal consecutive runs that are each
/// one arithmetic progression in all three operands: a strided batched GEMM apiece. A batch
/// over dims the layouts do not merge into one stride takes several — eager attention's
/// q·kᵀ over (B, H) with q a permuted (B, T, H, D) view, whose matrices sit at b·T·H·D + h·D,
/// is one GEMM of H matrices per b (Gemma 2's soft-capped attention, which stays unfused).
pub(crate) fn strided_runs(offs: &[(usize, usize, usize)]) -> Vec<std::ops::Range<usize>> {
    let step = |i: usize| {
        let (x, y) = (offs[i], offs[i + 1]);
        let d = |p: usize, q: usize| q as i64 - p as i64;
        (d(x.0, y.0), d(x.1, y.1), d(x.2, y.2))
    };
    let mut runs = Vec::new();
    let mut start = 0;
    while start < offs.len() {
        let mut end = (start + 2).min(offs.len());
        while end < offs.len() && step(end - 1) == step(start) {
            end += 1;
        }
        runs.push(start..end);
        start = end;
    }
    runs
}

impl GpuKernel for MatMul {
    // A product of a half and an f32 operand: the f32 one cast to half here.
    fn workspace(&self, _sup: &GpuSupport, g: &Graph, node: usize) -> usize {
        let n = &g.nodes()[node];
        match (g.tensor(n.inputs[0]).elem, g.tensor(n.inputs[1]).elem) {
            (ElemType::Float(x), ElemType::Float(y)) if x != y => {
                g.tensor(if x == DType::F32 { n.inputs[0] } else { n.inputs[1] }).numel()
            }
            _ => 0,
        }
    }

    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let MatMul { ta, tb } = self;
        let g = cx.g;
        let (a, b, c) = (cx.node.inputs[0], cx.node.inputs[1], cx.node.outputs[0]);
        let m = MatMulPlan::new(
            *ta,
            *tb,
            (g.shape(a), r.strides(a)),
            (g.shape(b), r.strides(b)),
            (g.shape(c), r.strides(c)),
        )
        .ok_or_else(|| cx.no(" for these operand layouts"))?;
        let parts: Vec<MatMulPlan> = strided_runs(&m.offs)
            .into_iter()
            .map(|run| MatMulPlan { offs: m.offs[run].to_vec(), ..m.clone() })
            .collect();
        let no = |why: &str| cx.no(why);
        if cx.dt(a) == cx.dt(b) {
            let mut gemms =
                parts.iter().map(|p| r.gemm(p, (a, b, c), &no)).collect::<Result<Vec<_>, _>>()?;
            // The GELU backward's work in this GEMM's epilogue (`dgelu_pairs` pairs one-matrix
            // products only: the GELU backward node launches nothing, so never drop it).
            match (r.dgelu_aux(cx.i), &mut gemms[..]) {
                (None, _) => {}
                (Some(pre), [Call::Gemm(shape, ptrs)]) => {
                    shape.epilogue = Epilogue::DGelu;
                    ptrs.aux = pre;
                }
                (Some(_), _) => return Err(cx.no(" with a DGELU epilogue over several GEMMs")),
            }
            return Ok(gemms);
        }
        // An f32 operand of a half product (BERT's stop-gradient is a layer_norm's f32 mean):
        // cast into the workspace, the CPU's rounding of what it reads.
        let (f, h) = if cx.dt(a) == DType::F32 { (a, b) } else { (b, a) };
        if !g.tensor(f).elem.is_float()
            || r.strides(f) != contiguous(g.shape(f))
            || cx.dt(c) != cx.dt(h)
        {
            return Err(cx.no(&format!(
                " for operands in {:?} and {:?} into {:?}",
                cx.dt(a),
                cx.dt(b),
                cx.dt(c)
            )));
        }
        let w = cx.ws.ok_or_else(|| cx.no(" without the workspace for its cast operand"))?;
        let src = if f == a { cx.inp(0) } else { cx.inp(1) };
        let cast = ew::Cast { from: DType::F32, to: cx.dt(h), out: w, x: src, n: cx.n(f) };
        let mut calls = vec![cast.launch(r.device()).into()];
        let ptrs = if f == a { (w, cx.inp(1), cx.out(0)) } else { (cx.inp(0), w, cx.out(0)) };
        for p in &parts {
            calls.push(r.gemm_at(p, (cx.dt(h), cx.dt(h), cx.dt(c)), ptrs, &no)?);
        }
        Ok(calls)
    }
}

/// The epilogue a linear layer's GEMM takes on the GPU, when one does its bias (and GELU) work:
/// cuBLASLt's bias epilogue (C = product + bias) without GELU, its GELU_AUX_BIAS (the
/// pre-activation product + bias saved as aux, C = its GELU) for the tanh GELU (cuBLASLt's only
/// GELU: GPT-2's `gelu_new`). Not for the erf GELU (BERT's), a batched product or a
/// pre-activation laid out otherwise than y (the aux takes C's leading dimension): those run
/// the GEMM, then elementwise.cu's bias + GELU or bias add.
fn linear_epilogue(gelu: Option<GeluApprox>, batched: bool, same_layout: bool) -> Option<Epilogue> {
    match gelu {
        _ if batched => None,
        None => Some(Epilogue::Bias),
        Some(GeluApprox::Tanh) if same_layout => Some(Epilogue::BiasGeluAux),
        Some(_) => None,
    }
}

impl GpuKernel for Linear {
    // y (…, N) = [gelu](x (…, K)·op(w) + bias (N)); pre (…, N) the pre-activation with GELU.
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let Linear { tb, gelu } = *self;
        let g = cx.g;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let (x, w) = (ins[0], ins[1]);
        let plan_into = |r: &Resolver<'_>, c| {
            MatMulPlan::new(
                false,
                tb,
                (g.shape(x), r.strides(x)),
                (g.shape(w), r.strides(w)),
                (g.shape(c), r.strides(c)),
            )
            .ok_or_else(|| cx.no(" for these operand layouts"))
        };
        cx.same(&[outs[0], x, w, ins[2]])?;
        let y = plan_into(r, outs[0])?;
        let same_layout = gelu.is_none() || r.strides(outs[1]) == r.strides(outs[0]);
        if let Some(epi) = linear_epilogue(gelu, y.offs.len() > 1, same_layout) {
            // One GEMM: C = y, the bias (and aux = pre) in its epilogue.
            let Call::Gemm(shape, ptrs) = r.gemm(&y, (x, w, outs[0]), &|why: &str| cx.no(why))?
            else {
                unreachable!("Resolver::gemm returns a GEMM")
            };
            let aux = if gelu.is_some() { cx.out(1) } else { 0 };
            let ptrs = GemmPtrs { bias: cx.inp(2), aux, ..ptrs };
            return Ok(vec![Call::Gemm(GemmShape { epilogue: epi, ..shape }, ptrs)]);
        }
        // The GEMM into pre (with GELU) or y, then the bias (+ GELU) kernel.
        let c = outs[usize::from(gelu.is_some())];
        cx.same(&[c])?;
        let m = plan_into(r, c)?;
        let cols = cx.last(outs[0]);
        let rows = cx.n(outs[0]) / cols.max(1);
        let gemm = r.gemm(&m, (x, w, c), &|why: &str| cx.no(why))?;
        let dtype = cx.dt(outs[0]);
        let epi = match gelu {
            Some(approx) => ew::BiasGelu {
                dtype,
                y: cx.out(0),
                pre: cx.out(1),
                bias: cx.inp(2),
                rows,
                c: cols,
                approx,
            }
            .launch(r.device()),
            None => ew::Add {
                dtype,
                to_f32: false,
                out: cx.out(0),
                a: cx.out(0),
                b: cx.inp(2),
                n: cx.n(outs[0]),
                nb: cols,
            }
            .launch(r.device()),
        };
        Ok(vec![gemm, epi.into()])
    }
}

#[cfg(test)]
mod tests {
    use super::strided_runs;

    /// Each run one progression per operand, the runs in order covering every matrix, none
    /// able to take the next matrix in.
    fn check(offs: &[(usize, usize, usize)]) -> usize {
        let runs = strided_runs(offs);
        let flat: Vec<usize> = runs.iter().flat_map(|r| r.clone()).collect();
        assert_eq!(flat, (0..offs.len()).collect::<Vec<_>>(), "{offs:?}: {runs:?}");
        let d = |i: usize, j: usize| {
            let (x, y) = (offs[i], offs[j]);
            let s = |p: usize, q: usize| q as i64 - p as i64;
            (s(x.0, y.0), s(x.1, y.1), s(x.2, y.2))
        };
        for r in &runs {
            for i in r.start + 1..r.end.saturating_sub(1) {
                assert_eq!(d(i, i + 1), d(r.start, r.start + 1), "{offs:?}: run {r:?}");
            }
            if r.len() >= 2 && r.end < offs.len() {
                assert_ne!(d(r.end - 1, r.end), d(r.start, r.start + 1), "{offs:?}: {r:?}");
            }
        }
        runs.len()
    }

    #[test]
    fn strided_runs_cut_a_batch_into_maximal_progressions() {
        // One progression (a weight shared by every matrix: stride 0), one matrix, none.
        assert_eq!(check(&[(0, 0, 0), (40, 0, 30), (80, 0, 60)]), 1);
        assert_eq!(check(&[(7, 3, 5)]), 1);
        assert_eq!(check(&[]), 0);
        // q·kᵀ over (B 3, H 5): q a permuted (B, T 7, H, D 6) view, kᵀ and the scores dense.
        let (t, h, d) = (7, 5, 6);
        let offs: Vec<_> = (0..3)
            .flat_map(|b| {
                (0..h)
                    .map(move |i| (b * t * h * d + i * d, (b * h + i) * t * d, (b * h + i) * t * t))
            })
            .collect();
        assert_eq!(check(&offs), 3);
        // Random offsets, runs of repeated steps among them.
        let mut x = 0x2545_f491_u64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m) as usize
        };
        for _ in 0..200 {
            let n = 1 + next(12);
            let mut offs = vec![(next(50), next(50), next(50))];
            while offs.len() < n {
                let step = (next(3), next(3), next(3));
                for _ in 0..1 + next(4) {
                    let (a, b, c) = *offs.last().unwrap();
                    offs.push((a + step.0, b + step.1, c + step.2));
                }
            }
            offs.truncate(n);
            check(&offs);
        }
    }
}
