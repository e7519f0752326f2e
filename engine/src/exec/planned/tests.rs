//! The planned executor against the reference executor, in f32, on the same inputs and dropout
//! seeds: GPT-2- and BERT-style training graphs (dropout on, so the masks must agree element
//! for element) and random-ish graphs that exercise every op and every view the planner folds
//! or copies.
//!
//! Tolerances: loss within 1e-5 relative; each parameter's gradient within
//! max|Δ| ≤ 1e-5·max|g_ref| + 1e-7·G, G the largest |g| of all parameters (the two differ in
//! summation order only: GEMM blocking, vectorised reductions, a 1-ulp exp and a 5e-7 erf; a
//! wrong mask, stride or in-place would be an O(1) error on some tensor). The G floor is for
//! tensors whose exact gradient is 0, where both sides return rounding noise: attention key
//! biases (softmax is shift-invariant per row).

use super::*;
use crate::graph::AttentionOpts;
use crate::plan::testgraphs::{
    bert_like, gpt_like, gpt_like_dtype, params, random_graph, Dims, Feed,
};
use crate::RefExecutor;

const LOSS_RTOL: f32 = 1e-5;
const RTOL: f32 = 1e-5;
const FLOOR: f32 = 1e-7;

/// Runs both executors; returns the worst per-tensor ratio max|Δ| / (RTOL·max|g| + ATOL).
fn compare(g: &Graph, feed: &Feed, seed: u64, what: &str) -> f32 {
    compare_inputs(g, &feed.inputs(g), seed, what)
}

/// [`compare`] on the given inputs.
fn compare_inputs(g: &Graph, inputs: &Inputs<'_>, seed: u64, what: &str) -> f32 {
    let p = params(g, seed ^ 0x55);
    let inputs = inputs.clone();
    let n = g.num_param_elems();
    let mut g_ref = vec![0.0f32; n];
    let l_ref = RefExecutor::new(g).train_step(&p, &inputs, seed, &mut g_ref).unwrap();
    let mut ex = PlannedExecutor::new(g).unwrap();
    ex.plan().check(g).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut g_fast = vec![f32::NAN; n];
    let l_fast = ex.train_step(&p, &inputs, seed, &mut g_fast).unwrap();
    assert!(
        (l_fast - l_ref).abs() <= LOSS_RTOL * l_ref.abs(),
        "{what}: loss {l_fast} vs reference {l_ref}"
    );
    let mut worst = 0f32;
    let big = g_ref.iter().fold(0f32, |m, v| m.max(v.abs()));
    for prm in g.params() {
        let (a, b) =
            (&g_fast[prm.offset..prm.offset + prm.len], &g_ref[prm.offset..prm.offset + prm.len]);
        let max_g = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let max_d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(a.iter().all(|v| v.is_finite()), "{what}: {} has a non-finite gradient", prm.name);
        let tol = RTOL * max_g + FLOOR * big;
        assert!(
            max_d <= tol,
            "{what}: gradient of {} differs by {max_d:e} (max |g| {max_g:e})\n{}",
            prm.name,
            ex.plan().summary(g)
        );
        worst = worst.max(max_d / tol);
    }
    // A second step with the same inputs and seed gives the same results (no stale state).
    let mut g2 = vec![f32::NAN; n];
    let l2 = ex.train_step(&p, &inputs, seed, &mut g2).unwrap();
    assert_eq!(l2.to_bits(), l_fast.to_bits(), "{what}: second step differs");
    assert!(
        g2.iter().zip(&g_fast).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{what}: second step's gradients differ"
    );
    worst
}

fn tiny(layers: usize, dropout: f32) -> Dims {
    Dims { b: 2, t: 9, c: 24, h: 3, v: 37, layers, dropout }
}

#[test]
fn gpt_like_matches_the_reference_executor() {
    for dropout in [0.0, 0.1] {
        let d = tiny(2, dropout);
        let g = gpt_like(&d).unwrap();
        let w = compare(&g, &Feed::new(&d, 1), 7, &format!("gpt p={dropout}"));
        println!("gpt p={dropout}: worst tensor at {:.1}% of tolerance", 100.0 * w);
    }
}

#[test]
fn bert_like_matches_the_reference_executor() {
    for (dropout, classify) in [(0.0, false), (0.1, false), (0.1, true)] {
        let d = tiny(2, dropout);
        let g = bert_like(&d, classify).unwrap();
        let w = compare(&g, &Feed::new(&d, 2), 8, &format!("bert p={dropout} classify={classify}"));
        println!(
            "bert p={dropout} classify={classify}: worst tensor at {:.1}% of tolerance",
            100.0 * w
        );
    }
}

/// Masked-LM labels (~15% labelled): the head's matmuls and bias gradient run on the labelled
/// rows only (`plan::rows`), with the same results.
#[test]
fn sparse_labels_run_row_restricted_kernels_with_the_same_results() {
    for b in [2usize, 9] {
        let d = Dims { b, t: 16, c: 24, h: 3, v: 301, layers: 1, dropout: 0.1 };
        for (name, g, want) in
            [("bert", bert_like(&d, false).unwrap(), 4), ("gpt", gpt_like(&d).unwrap(), 3)]
        {
            let feed = Feed::mlm(&d, 11);
            assert!(feed.labels.iter().filter(|&&l| l != -100).count() * 2 <= feed.labels.len());
            let ex = PlannedExecutor::new(&g).unwrap();
            assert_eq!(ex.row_restricted_steps(), want, "{name}");
            compare(&g, &feed, 3, &format!("{name} b={b} with MLM labels"));
        }
    }
    // All labels ignored: the loss is NaN on both sides (0/0), the gradients zero.
    let d = Dims { b: 2, t: 16, c: 24, h: 3, v: 301, layers: 1, dropout: 0.0 };
    let g = bert_like(&d, false).unwrap();
    let mut feed = Feed::new(&d, 1);
    feed.labels.fill(-100);
    let p = params(&g, 1);
    let mut grads = vec![f32::NAN; p.len()];
    let mut ex = PlannedExecutor::new(&g).unwrap();
    let l = ex.train_step(&p, &feed.inputs(&g), 0, &mut grads).unwrap();
    assert!(l.is_nan() && grads.iter().all(|&x| x == 0.0));
}

/// The executed-FLOP count (HFU's numerator) leaves out exactly the rows a row-restricted
/// step skipped: the decoder's forward, its input gradient and its weight gradient, 2·C·V
/// each per unlabelled row.
#[test]
fn executed_flops_leave_out_the_skipped_rows() {
    let d = Dims { b: 9, t: 16, c: 24, h: 3, v: 301, layers: 1, dropout: 0.0 };
    let g = bert_like(&d, false).unwrap();
    let p = params(&g, 1);
    let mut grads = vec![0.0f32; p.len()];
    let mut ex = PlannedExecutor::new(&g).unwrap();
    // 3 of 4 rows labelled: above the row cap, so the dense kernels run.
    let dense_feed = Feed::new(&d, 1);
    ex.train_step(&p, &dense_feed.inputs(&g), 0, &mut grads).unwrap();
    let dense = ex.last_step_flops();
    let mlm = Feed::mlm(&d, 11);
    ex.train_step(&p, &mlm.inputs(&g), 0, &mut grads).unwrap();
    let sparse = ex.last_step_flops();
    let rows = d.b * d.t;
    let labelled = mlm.labels.iter().filter(|&&l| l != -100).count();
    let skipped = 3.0 * 2.0 * ((rows - labelled) * d.c * d.v) as f64;
    assert!(dense > skipped, "{dense} {skipped}");
    assert_eq!(
        dense - sparse,
        skipped,
        "dense {dense}, sparse {sparse}, {labelled}/{rows} rows labelled"
    );
}

/// Every view of the transformer graphs folds: no copies.
#[test]
fn transformer_views_all_fold() {
    let d = tiny(2, 0.1);
    for (name, g) in [
        ("gpt", gpt_like(&d).unwrap()),
        ("bert", bert_like(&d, false).unwrap()),
        ("bert-cls", bert_like(&d, true).unwrap()),
    ] {
        let ex = PlannedExecutor::new(&g).unwrap();
        let (folded, copied) = ex.plan().view_counts(&g);
        assert!(
            folded > 0 && copied == 0,
            "{name}: {folded} folded, {copied} copied\n{}",
            ex.plan().summary(&g)
        );
    }
}

/// A graph of the pointwise ops: x → scale → silu (in place over the scaled copy) → · gate
/// (same shape) → · w (broadcast over rows) → cross-entropy, with labels from [`Feed`] over
/// (b, t) rows of v classes.
fn pointwise_graph(d: &Dims) -> Graph {
    use crate::ops::pointwise::{BinaryFn, UnaryFn};
    let mut g = Graph::new();
    let x = g.param("x", &[d.b, d.t, d.v]).unwrap();
    let gate = g.param("gate", &[d.b, d.t, d.v]).unwrap();
    let w = g.param("w", &[d.v]).unwrap();
    let s = g.scale(x, 2.5).unwrap();
    let h = g.apply(UnaryFn::Silu, s).unwrap();
    let m = g.apply2(BinaryFn::Mul, h, gate).unwrap();
    let y = g.apply2(BinaryFn::Mul, m, w).unwrap();
    let labels = g.input_ids("labels", &[d.b, d.t]).unwrap();
    let loss = g.cross_entropy(y, labels).unwrap();
    g.set_loss(loss).unwrap();
    crate::autodiff::backward(&g, loss).unwrap()
}

#[test]
fn pointwise_ops_match_the_reference_executor() {
    let d = Dims { b: 3, t: 7, c: 0, h: 0, v: 13, layers: 0, dropout: 0.0 };
    let g = pointwise_graph(&d);
    let w = compare(&g, &Feed::new(&d, 5), 3, "pointwise");
    let ex = PlannedExecutor::new(&g).unwrap();
    let inplace = ex.plan().steps.iter().filter(|s| s.inplace.is_some()).count();
    assert!(inplace > 0, "some pointwise op runs in place: {}", ex.plan().summary(&g));
    println!("pointwise: worst tensor at {:.1}% of tolerance", 100.0 * w);
}

#[test]
fn random_graphs_match_the_reference_executor() {
    let mut copies = 0;
    for seed in 0..40 {
        let (g, d) = random_graph(seed, 10).unwrap();
        compare(&g, &Feed::new(&d, seed), seed, &format!("random graph {seed}"));
        let ex = PlannedExecutor::new(&g).unwrap();
        copies += ex.plan().view_counts(&g).1;
    }
    assert!(copies > 0, "the random graphs should need some copies");
}

/// Sessions move into rank threads (`parallel`): the executor must be Send.
#[test]
fn the_executor_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<PlannedExecutor>();
    check::<crate::session::TrainSession>();
}

#[test]
fn input_errors_are_errors_not_panics() {
    let d = tiny(1, 0.0);
    let g = gpt_like(&d).unwrap();
    let mut ex = PlannedExecutor::new(&g).unwrap();
    let p = params(&g, 1);
    let mut grads = vec![0.0; p.len()];
    let mut feed = Feed::new(&d, 3);
    let ok = ex.train_step(&p, &feed.inputs(&g), 0, &mut grads);
    assert!(ok.is_ok());
    let missing = Inputs::new().ids("input_ids", &feed.ids);
    assert!(matches!(ex.train_step(&p, &missing, 0, &mut grads), Err(ExecError::MissingInput(_))));
    let extra = feed.inputs(&g).ids("nope", &feed.ids);
    assert!(matches!(
        ex.train_step(&p, &extra, 0, &mut grads),
        Err(ExecError::UnknownInput { .. })
    ));
    assert!(matches!(
        ex.train_step(&p[1..], &feed.inputs(&g), 0, &mut grads),
        Err(ExecError::ParamLen { .. })
    ));
    feed.ids[3] = d.v as i64; // out of the vocabulary
    let e = ex.train_step(&p, &feed.inputs(&g), 0, &mut grads).unwrap_err();
    assert!(
        matches!(e, ExecError::Op { op: "embedding", source: OpError::IndexOutOfRange { .. }, .. }),
        "{e}"
    );
    feed.ids[3] = 0;
    feed.labels[5] = 1000;
    let e = ex.train_step(&p, &feed.inputs(&g), 0, &mut grads).unwrap_err();
    assert!(matches!(e, ExecError::Op { op: "cross_entropy", .. }), "{e}");
}

#[test]
fn forward_graphs_are_plan_errors() {
    let mut fwd = Graph::new();
    let x = fwd.param("x", &[2, 3]).unwrap();
    let _ = fwd.gelu(x, GeluApprox::Erf).unwrap();
    assert!(matches!(PlannedExecutor::new(&fwd), Err(PlanError::NotTraining)));
}

/// f16/bf16 graphs: every stored activation and gradient holds a value of the dtype (rounding
/// at each output), the loss differs from f32's by no more than the dtype's precision allows,
/// and a loss scale seeds the backward (gradients scale by it exactly, a power of two).
#[test]
fn half_precision_graphs_store_rounded_values_and_scale_the_seed() {
    let d = tiny(2, 0.0);
    let f32_graph = gpt_like(&d).unwrap();
    let n = f32_graph.num_param_elems();
    let params: Vec<f32> =
        (0..n).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.2 + 1e-3).collect();
    let feed = Feed::new(&d, 3);
    let mut g32 = vec![0.0; n];
    let l32 = PlannedExecutor::new(&f32_graph)
        .unwrap()
        .train_step(&params, &feed.inputs(&f32_graph), 0, &mut g32)
        .unwrap();
    for (dt, tol) in [(crate::DType::F16, 2e-3f32), (crate::DType::BF16, 2e-2)] {
        let g = gpt_like_dtype(&d, dt).unwrap();
        let p: Vec<f32> = params.iter().map(|&x| dt.round(x)).collect();
        let mut ex = PlannedExecutor::new(&g).unwrap();
        let mut grads = vec![0.0; n];
        let l = ex.train_step(&p, &feed.inputs(&g), 0, &mut grads).unwrap();
        assert!(l != l32 && ((l - l32) / l32).abs() < tol, "{dt}: loss {l} vs f32 {l32}");
        // Parameter gradients are f32 (computed from rounded activations and activation
        // gradients): close to the f32 graph's, not equal, and not rounded to the dtype.
        assert!(
            grads.iter().any(|&x| dt.round(x).to_bits() != x.to_bits()),
            "{dt}: parameter gradients are rounded"
        );
        let gmax = g32.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = grads.iter().zip(&g32).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst > 0.0 && worst < 10.0 * tol * gmax,
            "{dt}: max |Δgrad| {worst} vs max |g| {gmax}"
        );
        assert!(grads.iter().filter(|&&x| x != 0.0).count() > n / 2);
        ex.set_loss_scale(1024.0).unwrap();
        let mut scaled = vec![0.0; n];
        let l2 = ex.train_step(&p, &feed.inputs(&g), 0, &mut scaled).unwrap();
        assert_eq!(l2, l, "the loss itself is not scaled");
        // bf16 has f32's exponent range: a power-of-two scale commutes with every rounding and
        // the gradients scale exactly. In f16, intermediate gradients below 2^-14 are
        // subnormal (fewer mantissa bits) without the scale and normal with it — the reason
        // loss scaling exists — so they agree only to f16's precision.
        let gmax = grads.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (a, b) in grads.iter().zip(&scaled) {
            if dt == crate::DType::BF16 {
                assert_eq!((a * 1024.0).to_bits(), b.to_bits(), "{dt}");
            } else {
                assert!((a * 1024.0 - b).abs() <= 1e-2 * gmax * 1024.0, "{dt}: {a} · 1024 vs {b}");
            }
        }
    }
}

/// A bf16 graph's matmuls resolve to the bf16 GEMM where the CPU has it (f32 graphs' never),
/// and a step on it gives the f32 GEMM's results on the same bf16 values: the loss within
/// 1e-5 relative, every parameter gradient within 1e-3 of the largest (the pairwise f32
/// additions of `vdpbf16ps`, then bf16 roundings of activations that land on the other side).
#[test]
fn bf16_matmuls_run_on_the_bf16_gemm_with_the_f32_gemms_results() {
    use crate::backend::cpu::blas::{bf16_gemm_enabled, GemmKind};
    let d = tiny(2, 0.0);
    let kinds = |ex: &PlannedExecutor| -> Vec<GemmKind> {
        ex.steps
            .iter()
            .filter_map(|s| match &s.aux {
                Aux::MatMul(m, _) => Some(m.kind),
                _ => None,
            })
            .collect()
    };
    let f32_ex = PlannedExecutor::new(&gpt_like(&d).unwrap()).unwrap();
    assert!(kinds(&f32_ex).iter().all(|&k| k == GemmKind::F32));
    let g = gpt_like_dtype(&d, crate::DType::BF16).unwrap();
    let mut ex = PlannedExecutor::new(&g).unwrap();
    let found = kinds(&ex);
    assert!(found.len() >= 6, "{found:?}");
    if !bf16_gemm_enabled() {
        eprintln!("skipped the comparison: the bf16 GEMM is off on this machine");
        assert!(found.iter().all(|&k| k == GemmKind::F32));
        return;
    }
    assert!(found.iter().all(|&k| k == GemmKind::Bf16), "{found:?}");
    let n = g.num_param_elems();
    let p: Vec<f32> = (0..n)
        .map(|i| crate::DType::BF16.round(((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.2 + 1e-3))
        .collect();
    let feed = Feed::new(&d, 3);
    let mut g_bf16 = vec![0.0; n];
    let l_bf16 = ex.train_step(&p, &feed.inputs(&g), 0, &mut g_bf16).unwrap();
    for s in &mut ex.steps {
        if let Aux::MatMul(m, _) = &mut s.aux {
            m.kind = GemmKind::F32;
        }
    }
    let mut g_f32 = vec![0.0; n];
    let l_f32 = ex.train_step(&p, &feed.inputs(&g), 0, &mut g_f32).unwrap();
    assert!(((l_bf16 - l_f32) / l_f32).abs() < 1e-5, "loss {l_bf16} vs {l_f32}");
    let gmax = g_f32.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = g_bf16.iter().zip(&g_f32).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= 1e-3 * gmax, "max |Δgrad| {worst} vs max |g| {gmax}");
}

use crate::graph::GeluApprox;

/// A Llama-like block as the family writes it, fused: embedding → RMSNorm → q, k, v
/// projections into (B, T, H·D) / (B, T, Hkv·D) rows, heads permuted out → rotary on q and k
/// (HF's equal-halves cos/sin, fed) → grouped-query attention (causal, dropout) reading k, v
/// with Hkv heads inside their (B, T, C) rows → o projection → residual → RMSNorm → tied
/// head → cross-entropy. Through the planned executor (views folded, rotary in place, GQA
/// strides) against the reference executor, H = 6 with Hkv = 2, 1 and 6.
#[test]
fn llama_like_ops_match_the_reference_executor() {
    let (b, t, h, dh, v) = (2usize, 9usize, 6usize, 4usize, 37usize);
    let c = h * dh;
    let (cos, sin) = crate::ops::rotary::hf_cos_sin(t, dh);
    let (cos, sin): (Vec<f32>, Vec<f32>) =
        (cos.iter().map(|&x| x as f32).collect(), sin.iter().map(|&x| x as f32).collect());
    let d = Dims { b, t, c, h, v, layers: 1, dropout: 0.0 };
    let feed = Feed::new(&d, 4);
    for (hkv, p) in [(2usize, 0.1f32), (1, 0.0), (6, 0.1)] {
        let mut g = Graph::new();
        let ids = g.input_ids("input_ids", &[b, t]).unwrap();
        let labels = g.input_ids("labels", &[b, t]).unwrap();
        let cos_t = g.input_float("cos", &[t, dh]).unwrap();
        let sin_t = g.input_float("sin", &[t, dh]).unwrap();
        let wte = g.param("wte", &[v, c]).unwrap();
        let ln1 = g.param("ln1.weight", &[c]).unwrap();
        let wq = g.param("q", &[c, c]).unwrap();
        let wk = g.param("k", &[hkv * dh, c]).unwrap();
        let wv = g.param("v", &[hkv * dh, c]).unwrap();
        let wo = g.param("o", &[c, c]).unwrap();
        let ln2 = g.param("ln2.weight", &[c]).unwrap();
        let x = g.embedding(wte, ids).unwrap();
        let hs = g.rms_norm(x, ln1, 1e-6).unwrap();
        let heads = |g: &mut Graph, w, n: usize| {
            let y = g.linear(hs, w, None).unwrap();
            let y = g.reshape(y, &[b, t, n, dh]).unwrap();
            g.permute(y, &[0, 2, 1, 3]).unwrap()
        };
        let q = heads(&mut g, wq, h);
        let k = heads(&mut g, wk, hkv);
        let vv = heads(&mut g, wv, hkv);
        let q = g.rotary(q, cos_t, sin_t).unwrap();
        let k = g.rotary(k, cos_t, sin_t).unwrap();
        let opts =
            AttentionOpts { causal: true, scale: None, dropout_p: p, mask: None, softcap: None };
        let a = g.attention(q, k, vv, opts).unwrap();
        let a = g.permute(a, &[0, 2, 1, 3]).unwrap();
        let a = g.reshape(a, &[b, t, c]).unwrap();
        let a = g.linear(a, wo, None).unwrap();
        let x = g.add(x, a).unwrap();
        let y = g.rms_norm(x, ln2, 1e-6).unwrap();
        let logits = g.matmul(y, wte, false, true).unwrap();
        let loss = g.cross_entropy(logits, labels).unwrap();
        g.set_loss(loss).unwrap();
        let g = crate::autodiff::backward(&g, loss).unwrap();
        let inputs = Inputs::new()
            .ids("input_ids", &feed.ids)
            .ids("labels", &feed.labels)
            .floats("cos", &cos)
            .floats("sin", &sin);
        let what = format!("llama-like hkv={hkv} p={p}");
        let w = compare_inputs(&g, &inputs, 9, &what);
        println!("{what}: worst tensor at {:.1}% of tolerance", 100.0 * w);
    }
}

/// HF's repeat_kv written with reshape and concat, in front of a transposed product (as eager
/// attention reads k), through the planned executor against the reference executor: the
/// concat reading one tensor three times must be a copy (one tensor has one place), and the
/// backward's split of the transposed gradient must not lay out its input with a piece's
/// strides (rows that overlap): `plan::layout::non_overlapping`.
#[test]
fn repeated_concat_and_split_of_a_transposed_gradient_match_the_reference() {
    for transposed in [false, true] {
        let mut g = Graph::new();
        let x0 = g.param("x", &[2, 3, 8]).unwrap();
        let wx = g.param("wx", &[8, 8]).unwrap();
        let x1 = g.matmul(x0, wx, false, false).unwrap();
        let x1 = g.reshape(x1, &[2, 3, 2, 4]).unwrap();
        let x = g.permute(x1, &[0, 2, 1, 3]).unwrap(); // (B, Hkv, T, D) with head strides
        let r = g.repeat_kv(x, 3).unwrap(); // (2, 6, 3, 4)
        let a = g.param("a", &[2, 6, 4, 4]).unwrap();
        let y = if transposed {
            let rt = g.transpose(r, 2, 3).unwrap();
            g.matmul(a, rt, false, false).unwrap() // (2, 6, 4, 3)
        } else {
            let w = g.param("w", &[4, 3]).unwrap();
            g.matmul(r, w, false, false).unwrap() // (2, 6, 3, 3)
        };
        let rows = g.shape(y)[..3].to_vec();
        let labels = g.input_ids("labels", &rows).unwrap();
        let loss = g.cross_entropy(y, labels).unwrap();
        g.set_loss(loss).unwrap();
        let g = crate::autodiff::backward(&g, loss).unwrap();
        let l: Vec<i64> = (0..rows.iter().product::<usize>()).map(|i| (i % 3) as i64).collect();
        let what = format!("repeat_kv transposed={transposed}");
        compare_inputs(&g, &Inputs::new().ids("labels", &l), 9, &what);
    }
}

/// The attention's (B, H, T, T) probabilities take no arena memory on the CPU (its backward
/// recomputes them): each attention's second output spans two floats per query row, its
/// softmax statistics, and the arena is smaller, by at least one layer's probabilities less
/// those, than the same graph's plan with every tensor stored whole. That the recomputed ones
/// are right: `gpt_like_matches_the_reference_executor`.
#[test]
fn attention_keeps_row_statistics_not_its_probabilities() {
    /// The CPU's kernels, with every tensor stored whole.
    struct Whole(CpuSupport);
    impl KernelSupport for Whole {
        fn name(&self) -> &'static str {
            "cpu, every tensor whole"
        }
        fn check(&self, g: &Graph, node: usize) -> Result<(), PlanError> {
            self.0.check(g, node)
        }
        fn reads(&self, g: &Graph, node: usize, slot: usize) -> bool {
            self.0.reads(g, node, slot)
        }
        fn workspace(&self, g: &Graph, node: usize) -> usize {
            self.0.workspace(g, node)
        }
    }
    let d = Dims { b: 2, t: 64, c: 24, h: 3, v: 37, layers: 2, dropout: 0.0 };
    let g = gpt_like(&d).unwrap();
    let ours = plan::build(&g, &CpuSupport::new(2)).unwrap();
    let whole = plan::build(&g, &Whole(CpuSupport::new(2))).unwrap();
    let probs: Vec<TensorId> = g
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::Attention(_)))
        .map(|n| n.outputs[1])
        .collect();
    assert_eq!(probs.len(), d.layers);
    for &p in &probs {
        let (first, end) = ours.arena_byte_span(&g, p);
        assert_eq!(end - first, d.b * d.h * d.t * 2 * 4, "probabilities {p:?}' bytes");
    }
    let layer = d.b * d.h * d.t * (d.t - 2) * 4;
    assert!(
        whole.peak_bytes() >= ours.peak_bytes() + layer,
        "arena {} bytes, {} with the probabilities stored (one layer's: {layer})",
        ours.peak_bytes(),
        whole.peak_bytes()
    );
}
