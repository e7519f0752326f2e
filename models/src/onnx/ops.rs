//! The engine's ops as ONNX nodes: [`Exporter::node`] and the ops that take several ONNX
//! nodes (the norms, rotary, GELU, the masked softmax and its causal mask).

use ortbench_engine::graph::op::{
    Binary, Dropout, Fill, Gelu, LayerNorm, MatMul, Permute, RmsNorm, Rotary, Scale, Softmax,
    Split, Unary,
};
use ortbench_engine::graph::{GeluApprox, Op, TensorId};
use ortbench_engine::ops::pointwise::{BinaryFn, UnaryFn};

use super::proto;
use super::sizes::Dim;
use super::{
    attr_f, attr_i, attr_ints, attr_t, tensor_f32, tensor_raw, Exporter, NodeAt, Out,
    SQRT_2_OVER_PI,
};

impl Exporter<'_> {
    /// One engine node as ONNX nodes. References: the ONNX operator docs
    /// (https://onnx.ai/onnx/operators/) and the engine op's doc in engine/src/graph/op.rs.
    pub(super) fn node(&mut self, i: usize, live: &[bool]) -> Result<(), String> {
        let g = self.probes.graph();
        let node = &g.nodes()[i];
        let x: Vec<String> = node.inputs.iter().map(|&t| self.name(t).to_string()).collect();
        let y: Vec<String> = node.outputs.iter().map(|&t| self.name(t).to_string()).collect();
        let nm = format!("n{i}_{}", node.op.name());
        let at = NodeAt { nm: &nm, i, x: &x, y: &y };
        let rank = |t: TensorId| g.shape(t).len() as i64;
        match &node.op {
            // Constant (…) of the output's shape: an initializer when the shape is fixed,
            // else ConstantOfShape (https://onnx.ai/onnx/operators/onnx__ConstantOfShape.html).
            Op::Fill(Fill { value }) => {
                let dims = self.probes.dims(node.outputs[0])?;
                match dims.iter().map(|d| d.as_const()).collect::<Option<Vec<i64>>>() {
                    Some(shape) => {
                        let n = shape.iter().product::<i64>() as usize;
                        let t = tensor_raw(&y[0], proto::FLOAT, &shape, value.to_le_bytes().repeat(n));
                        self.out.inits.push(t);
                    }
                    None => {
                        let shape = self.shape(&dims);
                        let v = tensor_f32("value", &[1], &[*value]);
                        self.out.node("ConstantOfShape", &nm, &[&shape], &[&y[0]], vec![attr_t("value", v)]);
                    }
                }
            }
            // table (V, C), ids (…) → (…, C): Gather on axis 0
            // (https://onnx.ai/onnx/operators/onnx__Gather.html).
            Op::Embedding => self.out.node("Gather", &nm, &[&x[0], &x[1]], &[&y[0]], vec![attr_i("axis", 0)]),
            // a (…, M, K) · b (…, K, N) or (K, N) → (…, M, N); ta/tb as a Transpose of the last
            // two axes first. ONNX MatMul broadcasts a 2-D b over a's batch axes, as the engine
            // (https://onnx.ai/onnx/operators/onnx__MatMul.html).
            Op::MatMul(MatMul { ta, tb }) => {
                let operand = |t: TensorId, name: &str, transpose: bool, out: &mut Out| {
                    if !transpose {
                        return name.to_string();
                    }
                    let r = rank(t);
                    let mut perm: Vec<i64> = (0..r).collect();
                    perm.swap(r as usize - 1, r as usize - 2);
                    out.op("Transpose", &format!("{nm}_t"), &[name], vec![attr_ints("perm", &perm)])
                };
                let a = operand(node.inputs[0], &x[0], *ta, &mut self.out);
                let b = operand(node.inputs[1], &x[1], *tb, &mut self.out);
                self.out.node("MatMul", &nm, &[&a, &b], &[&y[0]], vec![]);
            }
            // x (…, C) + bias (C); a + b with b's shape a suffix of a's: numpy broadcasting
            // aligns trailing axes, the engine's rule (https://onnx.ai/onnx/operators/onnx__Add.html).
            Op::BiasAdd | Op::Add => self.out.node("Add", &nm, &[&x[0], &x[1]], &[&y[0]], vec![]),
            // s·x (…) (https://onnx.ai/onnx/operators/onnx__Mul.html).
            Op::Scale(Scale { s }) => {
                let s = self.out.f32(*s);
                self.out.node("Mul", &nm, &[&x[0], &s], &[&y[0]], vec![]);
            }
            Op::Gelu(Gelu { approx }) => self.gelu(&nm, &x[0], &y[0], *approx),
            // (…) → tanh (https://onnx.ai/onnx/operators/onnx__Tanh.html).
            Op::Tanh => self.out.node("Tanh", &nm, &[&x[0]], &[&y[0]], vec![]),
            Op::LayerNorm(LayerNorm { eps }) => self.layer_norm(at, *eps, live)?,
            Op::Softmax(Softmax { scale, causal }) => {
                let dims = self.probes.dims(node.inputs[0])?;
                let mask = x.get(1).map(|s| s.as_str());
                self.softmax(&nm, &x[0], mask, &y[0], *scale, (*causal).then(|| (dims[dims.len() - 2], dims[dims.len() - 1])));
            }
            // Inference: HF's eval mode, where dropout is the identity; the graph was built with
            // p = 0 everywhere (https://onnx.ai/onnx/operators/onnx__Identity.html).
            Op::Dropout(Dropout { p, .. }) => {
                if *p != 0.0 {
                    return Err(format!("dropout with p = {p} (export builds with dropout off: this is a bug)"));
                }
                self.out.node("Identity", &nm, &[&x[0]], &[&y[0]], vec![]);
            }
            // (…) → the output's shape, computed at run time; allowzero = 1 so a size that is 0
            // stays 0 instead of meaning "copy" (https://onnx.ai/onnx/operators/onnx__Reshape.html).
            Op::Reshape => {
                let dims = self.probes.dims(node.outputs[0])?;
                let shape = self.shape(&dims);
                self.out.node("Reshape", &nm, &[&x[0], &shape], &[&y[0]], vec![attr_i("allowzero", 1)]);
            }
            // x.permute(perm) (https://onnx.ai/onnx/operators/onnx__Transpose.html).
            Op::Permute(Permute { perm }) => {
                let perm: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
                self.out.node("Transpose", &nm, &[&x[0]], &[&y[0]], vec![attr_ints("perm", &perm)]);
            }
            // x (…, Σ sizes) → (…, sizes[i]) on the last axis, sizes at run time (BERT's
            // classifier splits off token 0 as [C, (T − 1)·C])
            // (https://onnx.ai/onnx/operators/onnx__Split.html, `split` as an input since 13).
            Op::Split(Split { sizes }) => {
                let dims = (0..sizes.len())
                    .map(|k| {
                        self.probes.fit(&format!("split size {k}"), |g| match &g.nodes()[i].op {
                            Op::Split(Split { sizes }) => sizes[k],
                            _ => unreachable!("the probes' nodes have the same ops"),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let split = self.shape(&dims);
                let outs: Vec<&str> = y.iter().map(|s| s.as_str()).collect();
                self.out.node("Split", &nm, &[&x[0], &split], &outs, vec![attr_i("axis", -1)]);
            }
            // (…, n_i) … → (…, Σ n_i) (https://onnx.ai/onnx/operators/onnx__Concat.html).
            Op::Concat => {
                let refs: Vec<&str> = x.iter().map(|s| s.as_str()).collect();
                self.out.node("Concat", &nm, &refs, &[&y[0]], vec![attr_i("axis", -1)]);
            }
            // f(x) elementwise (engine/src/ops/pointwise.rs); every function says its export.
            Op::Unary(Unary { f }) => match f {
                // SiLU: x·σ(x) (https://onnx.ai/onnx/operators/onnx__Sigmoid.html; opset 17
                // has no Swish).
                UnaryFn::Silu => {
                    let s = self.out.op("Sigmoid", &format!("{nm}_sigmoid"), &[&x[0]], vec![]);
                    self.out.node("Mul", &nm, &[&x[0], &s], &[&y[0]], vec![]);
                }
                // max(x, 0) (https://onnx.ai/onnx/operators/onnx__Relu.html).
                UnaryFn::Relu => self.out.node("Relu", &nm, &[&x[0]], &[&y[0]], vec![]),
            },
            // f(a, b), b's shape a suffix of a's: numpy broadcasting aligns trailing axes.
            Op::Binary(Binary { f }) => match f {
                BinaryFn::Mul => self.out.node("Mul", &nm, &[&x[0], &x[1]], &[&y[0]], vec![]),
            },
            Op::RmsNorm(RmsNorm { eps }) => self.rms_norm(at, *eps, live)?,
            Op::Rotary(Rotary { inverse }) => self.rotary(at, *inverse)?,
            other => {
                return Err(format!(
                    "the engine op '{}' has no ONNX export (the export takes the unoptimized inference graph; fused and backward ops are not expected there)",
                    other.name()
                ))
            }
        }
        Ok(())
    }

    /// LayerNorm's y and, when read, its size-1 row mean; its rstd has no export.
    fn layer_norm(&mut self, at: NodeAt<'_>, eps: f32, live: &[bool]) -> Result<(), String> {
        let NodeAt { nm, i, x, y } = at;
        let node = &self.probes.graph().nodes()[i];
        let [y_t, mean_t, rstd_t] = node.outputs[..] else {
            unreachable!("layernorm has 3 outputs")
        };
        let x0 = node.inputs[0];
        if live[rstd_t.index()] {
            return Err(
                "the rstd output of a LayerNorm is read: only y and the size-1 mean have an export"
                    .into(),
            );
        }
        if live[y_t.index()] {
            // x (…, C), w (C), b (C) → y (…, C) over the last axis
            // (https://onnx.ai/onnx/operators/onnx__LayerNormalization.html, opset 17).
            let attrs = vec![attr_i("axis", -1), attr_f("epsilon", eps)];
            self.out.node("LayerNormalization", nm, &[&x[0], &x[1], &x[2]], &[&y[0]], attrs);
        }
        if live[mean_t.index()] {
            // Builder::stop_gradient: the row mean of x (…, 1) is x itself, exactly
            // (one term): Squeeze the size-1 axis → (…)
            // (https://onnx.ai/onnx/operators/onnx__Squeeze.html).
            if self.probes.dims(x0)?.last().and_then(|d| d.as_const()) != Some(1) {
                return Err("the mean output of a LayerNorm over more than one value is read: only the size-1 row mean (stop_gradient) has an export".into());
            }
            let axes = self.out.i64s(&[-1], false);
            self.out.node("Squeeze", &format!("{nm}_mean"), &[&x[0], &axes], &[&y[1]], vec![]);
        }
        Ok(())
    }

    /// HF's LlamaRMSNorm: x (…, C), w (C) → w·(x·1/√(mean(x²) + eps)) over the last
    /// axis, in f32 (opset 17 has no RMSNormalization: it arrives in 23)
    /// (https://onnx.ai/onnx/operators/onnx__ReduceMean.html, axes an attribute in 13).
    fn rms_norm(&mut self, at: NodeAt<'_>, eps: f32, live: &[bool]) -> Result<(), String> {
        let NodeAt { nm, i, x, y } = at;
        let node = &self.probes.graph().nodes()[i];
        let [_, rstd_t] = node.outputs[..] else { unreachable!("rms_norm has 2 outputs") };
        if live[rstd_t.index()] {
            return Err("the rstd output of an RMSNorm is read: only y has an export".into());
        }
        let o = &mut self.out;
        let sq = o.op("Mul", &format!("{nm}_sq"), &[&x[0], &x[0]], vec![]);
        let attrs = vec![attr_ints("axes", &[-1]), attr_i("keepdims", 1)];
        let ms = o.op("ReduceMean", &format!("{nm}_ms"), &[&sq], attrs); // (…, 1)
        let eps = o.f32(eps);
        let v = o.op("Add", &format!("{nm}_var"), &[&ms, &eps], vec![]);
        let sd = o.op("Sqrt", &format!("{nm}_sqrt"), &[&v], vec![]);
        let rstd = o.op("Reciprocal", &format!("{nm}_rstd"), &[&sd], vec![]);
        let xh = o.op("Mul", &format!("{nm}_xhat"), &[&x[0], &rstd], vec![]);
        o.node("Mul", nm, &[&x[1], &xh], &[&y[0]], vec![]);
        Ok(())
    }

    /// HF's apply_rotary_pos_emb: x (…, T, D), cos, sin (T, D) → x·cos +
    /// rotate_half(x)·sin, rotate_half(x) = cat(−x[D/2:], x[:D/2]); `inverse` negates
    /// sin (the backward's rotation, not expected in an inference graph but exact).
    fn rotary(&mut self, at: NodeAt<'_>, inverse: bool) -> Result<(), String> {
        let NodeAt { nm, i, x, y } = at;
        let x0 = self.probes.graph().nodes()[i].inputs[0];
        let dims = self.probes.dims(x0)?;
        let d = dims.last().and_then(|d| d.as_const()).ok_or("rotary's head size must be fixed")?;
        let halves = self.out.i64s(&[d / 2, d / 2], false);
        let (x1, x2) = (format!("{nm}_x1"), format!("{nm}_x2"));
        let o = &mut self.out;
        o.node(
            "Split",
            &format!("{nm}_split"),
            &[&x[0], &halves],
            &[&x1, &x2],
            vec![attr_i("axis", -1)],
        );
        let neg = o.op("Neg", &format!("{nm}_neg"), &[&x2], vec![]);
        let rot = o.op("Concat", &format!("{nm}_rot"), &[&neg, &x1], vec![attr_i("axis", -1)]);
        let sin = if inverse {
            o.op("Neg", &format!("{nm}_nsin"), &[&x[2]], vec![])
        } else {
            x[2].clone()
        };
        let a = o.op("Mul", &format!("{nm}_cos"), &[&x[0], &x[1]], vec![]);
        let b = o.op("Mul", &format!("{nm}_sin"), &[&rot, &sin], vec![]);
        o.node("Add", nm, &[&a, &b], &[&y[0]], vec![]);
        Ok(())
    }

    /// HF's GELU (ATen's `GeluKernel.cpp`, engine/src/ops/gelu.rs), as the engine rounds it:
    /// erf: (0.5·x)·(1 + erf(x·(1/√2))); tanh: (0.5·x)·(1 + tanh(√(2/π)·(x + 0.044715·x·x·x))).
    /// Opset 17 has no Gelu op (it arrives in 20).
    // x: (…) -> (…)
    fn gelu(&mut self, nm: &str, x: &str, y: &str, approx: GeluApprox) {
        let o = &mut self.out;
        let inner = match approx {
            GeluApprox::Erf => {
                let c = o.f32(std::f64::consts::FRAC_1_SQRT_2 as f32);
                let u = o.op("Mul", &format!("{nm}_u"), &[x, &c], vec![]);
                o.op("Erf", &format!("{nm}_erf"), &[&u], vec![])
            }
            GeluApprox::Tanh => {
                let (kappa, c) = (o.f32(0.044715), o.f32(SQRT_2_OVER_PI as f32));
                // κ·x·x·x in the engine's order: ((κ·x)·x)·x.
                let k1 = o.op("Mul", &format!("{nm}_kx"), &[&kappa, x], vec![]);
                let k2 = o.op("Mul", &format!("{nm}_kxx"), &[&k1, x], vec![]);
                let k3 = o.op("Mul", &format!("{nm}_kxxx"), &[&k2, x], vec![]);
                let s = o.op("Add", &format!("{nm}_sum"), &[x, &k3], vec![]);
                let u = o.op("Mul", &format!("{nm}_u"), &[&c, &s], vec![]);
                o.op("Tanh", &format!("{nm}_tanh"), &[&u], vec![])
            }
        };
        let (one, half) = (o.f32(1.0), o.f32(0.5));
        let p = o.op("Add", &format!("{nm}_1p"), &[&one, &inner], vec![]);
        let hx = o.op("Mul", &format!("{nm}_hx"), &[&half, x], vec![]);
        o.node("Mul", nm, &[&hx, &p], &[y], vec![]);
    }

    /// softmax(x·scale + mask) over the last axis, keys j > i at −∞ when causal, and — the
    /// engine's rule (engine/src/ops/softmax.rs, torch's `_safe_softmax`) — a row whose every
    /// entry is −∞ (a left pad under the causal mask) gives zeros, where ONNX Softmax gives
    /// NaN: Where(ReduceMax(z) = −∞, 0, Softmax(z))
    /// (https://onnx.ai/onnx/operators/onnx__Softmax.html, onnx__ReduceMax.html, opset 13+).
    // x: (…, Tq, Tk), mask broadcastable to x -> (…, Tq, Tk)
    fn softmax(
        &mut self,
        nm: &str,
        x: &str,
        mask: Option<&str>,
        y: &str,
        scale: f32,
        causal: Option<(Dim, Dim)>,
    ) {
        let mut z = x.to_string();
        if scale != 1.0 {
            let s = self.out.f32(scale);
            z = self.out.op("Mul", &format!("{nm}_scaled"), &[&z, &s], vec![]);
        }
        if let Some(m) = mask {
            z = self.out.op("Add", &format!("{nm}_masked"), &[&z, m], vec![]);
        }
        if let Some((tq, tk)) = causal {
            // The engine overwrites j > i with −∞ after adding the mask: Where, not Add.
            let future = self.causal_future(tq, tk); // (Tq, Tk) bool
            let ninf = self.out.f32(f32::NEG_INFINITY);
            z = self.out.op("Where", &format!("{nm}_causal"), &[&future, &ninf, &z], vec![]);
        }
        let o = &mut self.out;
        let p = o.op("Softmax", &format!("{nm}_probs"), &[&z], vec![attr_i("axis", -1)]);
        let max = o.op(
            "ReduceMax",
            &format!("{nm}_max"),
            &[&z],
            vec![attr_ints("axes", &[-1]), attr_i("keepdims", 1)],
        );
        let ninf = o.f32(f32::NEG_INFINITY);
        let dead = o.op("Equal", &format!("{nm}_all_masked"), &[&max, &ninf], vec![]); // (…, Tq, 1)
        let zero = o.f32(0.0);
        o.node("Where", nm, &[&dead, &zero, &p], &[y], vec![]);
    }

    /// (Tq, Tk) bool, true at key j > query i: Greater(Range(Tk), Unsqueeze(Range(Tq), 1)).
    fn causal_future(&mut self, tq: Dim, tk: Dim) -> String {
        if let Some(s) = self.causal.get(&(tq, tk)) {
            return s.clone();
        }
        let (nq, nk) = (self.scalar_size(tq), self.scalar_size(tk));
        let o = &mut self.out;
        let (zero, one) = (o.i64s(&[0], true), o.i64s(&[1], true));
        let q = o.op("Range", "causal_q", &[&zero, &nq, &one], vec![]); // (Tq)
        let axes = o.i64s(&[1], false);
        let q = o.op("Unsqueeze", "causal_q", &[&q, &axes], vec![]); // (Tq, 1)
        let k = o.op("Range", "causal_k", &[&zero, &nk, &one], vec![]); // (Tk)
        let future = o.op("Greater", "causal_future", &[&k, &q], vec![]); // (Tq, Tk)
        self.causal.insert((tq, tk), future.clone());
        future
    }
}
