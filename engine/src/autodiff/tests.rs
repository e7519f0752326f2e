//! Every gradient rule, checked end to end: a tiny graph around the op, a cross-entropy loss on
//! its output (random labels, some ignored), run by the reference executor in f64, and every
//! parameter coordinate compared with a central finite difference of the forward graph
//! (step 1e-5, tolerance 1e-7·(1 + |fd|), see `ops::testutil`).

use super::backward;
use crate::exec::{Inputs, RefExecutor};
use crate::graph::{AttentionOpts, GeluApprox, Graph, GraphError, TensorId};
use crate::ops::testutil::{assert_close, fd_grad, Rng, FD_STEP, FD_TOL};

/// Extra inputs a test graph declares (ids, masks).
#[derive(Default)]
struct Feeds {
    ids: Vec<(&'static str, Vec<i64>)>,
    floats: Vec<(&'static str, Vec<f32>)>,
}

impl Feeds {
    fn inputs<'a>(&'a self, labels: &'a [i64]) -> Inputs<'a> {
        let mut inputs = Inputs::new().ids("labels", labels);
        for (n, d) in &self.ids {
            inputs = inputs.ids(n, d);
        }
        for (n, d) in &self.floats {
            inputs = inputs.floats(n, d);
        }
        inputs
    }
}

/// Builds `build`'s graph, puts a cross-entropy over the last dim of its output, and checks the
/// autodiff gradient of every parameter coordinate against finite differences.
fn check(seed: u64, feeds: Feeds, build: impl FnOnce(&mut Graph) -> Result<TensorId, GraphError>) {
    let mut g = Graph::new();
    let y = build(&mut g).unwrap();
    let shape = g.shape(y).to_vec();
    let (classes, rows) = (shape[shape.len() - 1], shape[..shape.len() - 1].to_vec());
    let labels_t = g.input_ids("labels", &rows).unwrap();
    let loss = g.cross_entropy(y, labels_t).unwrap();
    g.set_loss(loss).unwrap();
    let train = backward(&g, loss).unwrap();

    let mut rng = Rng::new(seed);
    let n_rows: usize = rows.iter().product();
    let labels: Vec<i64> =
        (0..n_rows).map(|r| if r % 3 == 1 { -100 } else { rng.below(classes) as i64 }).collect();
    let params = rng.vec(g.num_param_elems());
    let inputs = feeds.inputs(&labels);
    let step_seed = 77;

    let mut grads = vec![0.0f64; params.len()];
    let loss_v =
        RefExecutor::new(&train).train_step(&params, &inputs, step_seed, &mut grads).unwrap();
    let fwd = RefExecutor::new(&g);
    let loss_fwd = fwd.run(&params, &inputs, step_seed).unwrap().loss().unwrap();
    assert_eq!(loss_v, loss_fwd, "the training graph computes the forward's loss");
    let fd = fd_grad(&params, FD_STEP, |p| fwd.run(p, &inputs, step_seed).unwrap().loss().unwrap());
    assert_close(&grads, &fd, FD_TOL, &format!("gradient of\n{train}"));
}

#[test]
fn embedding() {
    let feeds = Feeds { ids: vec![("ids", vec![3, 0, 3, 6, 1, 3])], ..Default::default() };
    check(1, feeds, |g| {
        let table = g.param("table", &[7, 5])?;
        let ids = g.input_ids("ids", &[2, 3])?;
        g.embedding(table, ids)
    });
}

#[test]
fn matmul_all_flags_batched_and_shared() {
    let (m, k, n) = (3, 4, 5);
    for ta in [false, true] {
        for tb in [false, true] {
            for shared_b in [false, true] {
                // ta with a shared b needs a 2-D a (the builder rejects the batched case).
                let batch: &[usize] = if ta && shared_b { &[] } else { &[2, 2] };
                check(2, Feeds::default(), |g| {
                    let a_shape: Vec<usize> =
                        batch.iter().copied().chain(if ta { [k, m] } else { [m, k] }).collect();
                    let b_mat = if tb { [n, k] } else { [k, n] };
                    let b_shape: Vec<usize> = if shared_b {
                        b_mat.to_vec()
                    } else {
                        batch.iter().copied().chain(b_mat).collect()
                    };
                    let a = g.param("a", &a_shape)?;
                    let b = g.param("b", &b_shape)?;
                    g.matmul(a, b, ta, tb)
                });
            }
        }
    }
}

#[test]
fn bias_add_and_linear() {
    check(3, Feeds::default(), |g| {
        let x = g.param("x", &[2, 3, 4])?;
        let w = g.param("w", &[6, 4])?;
        let b = g.param("b", &[6])?;
        g.linear(x, w, Some(b))
    });
}

/// The fused linear of `passes::fuse_matmul_bias`, both weight layouts, with and without GELU.
#[test]
fn fused_linear() {
    for (tb, gelu) in [(true, None), (false, Some(GeluApprox::Erf)), (true, Some(GeluApprox::Tanh))]
    {
        check(13, Feeds::default(), |g| {
            let x = g.param("x", &[2, 3, 4])?;
            let w = g.param("w", if tb { &[6, 4] } else { &[4, 6] })?;
            let b = g.param("b", &[6])?;
            g.fused_linear(x, w, b, tb, gelu)
        });
    }
}

/// The fused residual add + LayerNorm of `passes::fuse_add_layernorm`, with the sum read
/// again downstream (pre-LN) so both differentiable outputs carry gradients.
#[test]
fn add_layer_norm_with_the_sum_used_again() {
    check(14, Feeds::default(), |g| {
        let a = g.param("a", &[2, 3, 6])?;
        let b = g.param("b", &[2, 3, 6])?;
        let w = g.param("w", &[6])?;
        let bias = g.param("bias", &[6])?;
        let (sum, y) = g.add_layer_norm(a, b, w, bias, 1e-5)?;
        let y = g.gelu(y, GeluApprox::Erf)?;
        g.add(sum, y)
    });
}

#[test]
fn add_same_shape_and_broadcast() {
    check(4, Feeds::default(), |g| {
        let x = g.param("x", &[2, 3, 4])?;
        let y = g.param("y", &[2, 3, 4])?;
        let pos = g.param("pos", &[3, 4])?;
        let s = g.add(x, y)?;
        g.add(s, pos)
    });
}

#[test]
fn scale_gelu_tanh() {
    for approx in [GeluApprox::Erf, GeluApprox::Tanh] {
        check(5, Feeds::default(), |g| {
            let x = g.param("x", &[3, 5])?;
            let s = g.scale(x, 2.5)?;
            let h = g.gelu(s, approx)?;
            g.tanh(h)
        });
    }
}

#[test]
fn layer_norm() {
    check(6, Feeds::default(), |g| {
        let x = g.param("x", &[2, 3, 6])?;
        let w = g.param("w", &[6])?;
        let b = g.param("b", &[6])?;
        g.layer_norm(x, w, b, 1e-5)
    });
}

#[test]
fn softmax_with_scale_causal_and_mask() {
    let feeds = Feeds {
        floats: vec![("mask", vec![0.0, -1.0, 0.5, 0.0, -2.0, 0.0])],
        ..Default::default()
    };
    check(7, feeds, |g| {
        let x = g.param("x", &[2, 2, 3, 3])?;
        let mask = g.input_float("mask", &[2, 1, 1, 3])?;
        let p = g.softmax(x, 0.8, true, Some(mask))?;
        g.scale(p, 3.0) // spread the probabilities so the loss is not flat
    });
}

#[test]
fn dropout_regenerates_its_mask() {
    check(8, Feeds::default(), |g| {
        let x = g.param("x", &[4, 6])?;
        let d = g.dropout(x, 0.3)?;
        g.dropout(d, 0.5)
    });
}

#[test]
fn reshape_permute_split_concat() {
    check(9, Feeds::default(), |g| {
        let x = g.param("x", &[2, 3, 6])?;
        let parts = g.split(x, &[2, 3, 1])?; // the middle piece is unused: its gradient is zero
        let c = g.concat(&[parts[2], parts[0]])?; // (2, 3, 3)
        let r = g.reshape(c, &[2, 9])?;
        let r = g.reshape(r, &[2, 3, 3])?;
        g.permute(r, &[2, 0, 1])
    });
}

#[test]
fn attention_with_causal_mask_and_dropout() {
    let feeds = Feeds {
        floats: vec![("mask", vec![0.0, 0.0, -1.5, 0.0, -0.5, 0.0, 0.0, 0.0])],
        ..Default::default()
    };
    // The last case soft-capped at 0.5 (Gemma 2's scores: 0.5·tanh(0.7·q·k)).
    for (causal, p, softcap) in [(false, 0.0, None), (true, 0.25, None), (true, 0.25, Some(0.5))] {
        let feeds = Feeds { floats: feeds.floats.clone(), ..Default::default() };
        check(10, feeds, |g| {
            let q = g.param("q", &[2, 2, 4, 3])?;
            let k = g.param("k", &[2, 2, 4, 3])?;
            let v = g.param("v", &[2, 2, 4, 3])?;
            let mask = g.input_float("mask", &[2, 1, 1, 4])?;
            g.attention(
                q,
                k,
                v,
                AttentionOpts { causal, scale: Some(0.7), dropout_p: p, mask: Some(mask), softcap },
            )
        });
    }
}

#[test]
fn tied_parameter_gradient_is_the_sum_of_both_uses() {
    // Tied: logits = embed(W, ids) · Wᵀ. Untied: the same with W1 in the embedding and W2 in the
    // head, both equal to W. dW must equal dW1 + dW2.
    let (v, c) = (6, 4);
    let build = |tied: bool| {
        let mut g = Graph::new();
        let ids = g.input_ids("ids", &[5]).unwrap();
        let labels = g.input_ids("labels", &[5]).unwrap();
        let w1 = g.param("w1", &[v, c]).unwrap();
        let w2 = if tied { w1 } else { g.param("w2", &[v, c]).unwrap() };
        let x = g.embedding(w1, ids).unwrap();
        let logits = g.matmul(x, w2, false, true).unwrap();
        let loss = g.cross_entropy(logits, labels).unwrap();
        backward(&g, loss).unwrap()
    };
    let mut rng = Rng::new(11);
    let w = rng.vec(v * c);
    let (ids, labels) = ([1i64, 4, 4, 0, 5], [2i64, -100, 3, 1, 0]);
    let inputs = Inputs::new().ids("ids", &ids).ids("labels", &labels);

    let tied = build(true);
    let mut g_tied = vec![0.0; v * c];
    RefExecutor::new(&tied).train_step(&w, &inputs, 0, &mut g_tied).unwrap();

    let untied = build(false);
    let ww: Vec<f64> = w.iter().chain(&w).copied().collect();
    let mut g_untied = vec![0.0; 2 * v * c];
    RefExecutor::new(&untied).train_step(&ww, &inputs, 0, &mut g_untied).unwrap();
    let sum: Vec<f64> = (0..v * c).map(|i| g_untied[i] + g_untied[v * c + i]).collect();
    assert_close(&g_tied, &sum, 1e-14, "tied gradient");
    assert!(
        g_untied[..v * c].iter().any(|&x| x != 0.0) && g_untied[v * c..].iter().any(|&x| x != 0.0)
    );
}

#[test]
fn unused_parameters_get_zero_gradients() {
    let mut g = Graph::new();
    let x = g.param("x", &[2, 3]).unwrap();
    let unused = g.param("unused", &[4]).unwrap();
    let _ = unused;
    let labels = g.input_ids("labels", &[2]).unwrap();
    let loss = g.cross_entropy(x, labels).unwrap();
    let train = backward(&g, loss).unwrap();
    assert_eq!(train.param_grad(1), None);
    // x at 0..6, a pad at 6..8, unused at 8..12: the pad is zeroed too.
    assert_eq!(train.num_param_elems(), 12);
    let mut grads = vec![f32::NAN; 12];
    let params = Rng::new(12).vec_f32(12);
    RefExecutor::new(&train)
        .train_step(&params, &Inputs::new().ids("labels", &[0, 2]), 0, &mut grads)
        .unwrap();
    assert!(grads[6..].iter().all(|&v| v == 0.0) && grads[..6].iter().all(|v| v.is_finite()));
}

#[test]
fn masks_that_depend_on_parameters_and_double_backward_are_errors() {
    let mut g = Graph::new();
    let x = g.param("x", &[2, 3]).unwrap();
    let m = g.param("m", &[3]).unwrap();
    let p = g.softmax(x, 1.0, false, Some(m)).unwrap();
    let labels = g.input_ids("labels", &[2]).unwrap();
    let loss = g.cross_entropy(p, labels).unwrap();
    let err = backward(&g, loss).unwrap_err().to_string();
    assert!(err.contains("softmax") && err.contains("mask"), "{err}");

    let mut g = Graph::new();
    let x = g.param("x", &[2, 3]).unwrap();
    let labels = g.input_ids("labels", &[2]).unwrap();
    let loss = g.cross_entropy(x, labels).unwrap();
    let train = backward(&g, loss).unwrap();
    assert!(matches!(backward(&train, loss), Err(GraphError::Autodiff(_))));
    let not_scalar = backward(&g, x).unwrap_err();
    assert!(matches!(not_scalar, GraphError::Shape { op: "loss", .. }), "{not_scalar}");
}

#[test]
fn training_graph_prints_its_backward() {
    let mut g = Graph::new();
    let x = g.param("x", &[2, 3]).unwrap();
    let w = g.param("w", &[4, 3]).unwrap();
    let y = g.matmul(x, w, false, true).unwrap();
    let labels = g.input_ids("labels", &[2]).unwrap();
    let loss = g.cross_entropy(y, labels).unwrap();
    let text = backward(&g, loss).unwrap().to_string();
    for line in [
        "%5 = fill() value=1 () f32  // d%4",
        "%6 = cross_entropy_backward(%5, %2, %3) ignore_index=-100 (2,4) f32  // d%2",
        "%7 = matmul(%6, %1) ta=false tb=false (2,3) f32  // d%0",
        "%8 = matmul(%6, %0) ta=true tb=false (4,3) f32  // d%1",
        "loss = %4",
        "grad \"w\" = %8",
    ] {
        assert!(text.lines().any(|l| l == line), "missing line {line:?} in\n{text}");
    }
}

#[test]
fn unary_pointwise_functions() {
    for &f in crate::ops::pointwise::UnaryFn::ALL {
        check(13, Feeds::default(), |g| {
            let x = g.param("x", &[3, 5])?;
            let s = g.scale(x, 3.0)?;
            g.apply(f, s)
        });
    }
}

#[test]
fn binary_pointwise_functions_same_shape_and_broadcast() {
    for &f in crate::ops::pointwise::BinaryFn::ALL {
        check(14, Feeds::default(), |g| {
            let x = g.param("x", &[2, 3, 4])?;
            let y = g.param("y", &[2, 3, 4])?;
            let w = g.param("w", &[3, 4])?;
            let s = g.apply2(f, x, y)?;
            g.apply2(f, s, w)
        });
    }
}

#[test]
fn rms_norm() {
    check(16, Feeds::default(), |g| {
        let x = g.param("x", &[2, 3, 7])?;
        let w = g.param("w", &[7])?;
        g.rms_norm(x, w, 1e-6)
    });
}

/// x·cos + rotate_half(x)·sin with HF's equal-halves cos/sin fed as inputs: the rule emits the
/// inverse rotary, checked against finite differences of the forward.
#[test]
fn rotary_with_hf_cos_sin() {
    let (t, d) = (5, 6);
    let (c, s) = crate::ops::rotary::hf_cos_sin(t, d);
    let f32s = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<_>>();
    let feeds = Feeds { floats: vec![("cos", f32s(c)), ("sin", f32s(s))], ..Default::default() };
    check(17, feeds, |g| {
        let x = g.param("x", &[2, 3, t, d])?;
        let cos = g.input_float("cos", &[t, d])?;
        let sin = g.input_float("sin", &[t, d])?;
        let y = g.rotary(x, cos, sin)?;
        g.scale(y, 2.0)
    });
}

/// Grouped-query (H = 6, Hkv = 2) and multi-query (Hkv = 1) attention: the kv heads' gradients
/// sum over the query heads that read them.
#[test]
fn grouped_and_multi_query_attention() {
    let mask = vec![0.0, 0.0, -1.5, 0.0, -0.5, 0.0, 0.0, 0.0];
    for (hkv, causal, p) in [(2, false, 0.0), (2, true, 0.25), (1, true, 0.0), (1, false, 0.3)] {
        let feeds = Feeds { floats: vec![("mask", mask.clone())], ..Default::default() };
        check(18, feeds, |g| {
            let q = g.param("q", &[2, 6, 4, 3])?;
            let k = g.param("k", &[2, hkv, 4, 3])?;
            let v = g.param("v", &[2, hkv, 4, 3])?;
            let mask = g.input_float("mask", &[2, 1, 1, 4])?;
            g.attention(
                q,
                k,
                v,
                AttentionOpts {
                    causal,
                    scale: Some(0.7),
                    dropout_p: p,
                    mask: Some(mask),
                    softcap: None,
                },
            )
        });
    }
}
