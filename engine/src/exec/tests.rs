//! End to end: a tiny GPT-2-style block (embedding + positions → LayerNorm → causal attention with
//! a padding mask and dropout → projection → LayerNorm → matmul+bias → GELU → dropout → linear →
//! LayerNorm → tied LM head → cross-entropy with ignored labels), its full gradient against finite
//! differences, SGD on one batch, and the executor's input validation.

use super::*;
use crate::autodiff::backward;
use crate::graph::{AttentionOpts, GeluApprox, Graph, GraphError};
use crate::ops::testutil::{assert_close, fd_grad, Rng, FD_STEP};

const B: usize = 2;
const T: usize = 5;
const C: usize = 8;
const H: usize = 2;
const V: usize = 11;

/// The tiny model's forward graph and its loss.
fn tiny_model(dropout: f32) -> Result<(Graph, TensorId), GraphError> {
    let mut g = Graph::new();
    let ids = g.input_ids("input_ids", &[B, T])?;
    let pos = g.input_ids("position_ids", &[T])?;
    let labels = g.input_ids("labels", &[B, T])?;
    let mask = g.input_float("attention_mask", &[B, 1, 1, T])?;
    let wte = g.param("wte.weight", &[V, C])?;
    let wpe = g.param("wpe.weight", &[T, C])?;
    let ln = |g: &mut Graph, name: &str| -> Result<(TensorId, TensorId), GraphError> {
        Ok((g.param(&format!("{name}.weight"), &[C])?, g.param(&format!("{name}.bias"), &[C])?))
    };
    let (ln1_w, ln1_b) = ln(&mut g, "ln_1")?;
    let c_attn_w = g.param("attn.c_attn.weight", &[C, 3 * C])?; // GPT-2 Conv1D: (in, out)
    let c_attn_b = g.param("attn.c_attn.bias", &[3 * C])?;
    let proj_w = g.param("attn.c_proj.weight", &[C, C])?; // nn.Linear: (out, in)
    let proj_b = g.param("attn.c_proj.bias", &[C])?;
    let (ln2_w, ln2_b) = ln(&mut g, "ln_2")?;
    let fc_w = g.param("mlp.c_fc.weight", &[C, 4 * C])?;
    let fc_b = g.param("mlp.c_fc.bias", &[4 * C])?;
    let out_w = g.param("mlp.c_proj.weight", &[C, 4 * C])?;
    let out_b = g.param("mlp.c_proj.bias", &[C])?;
    let (lnf_w, lnf_b) = ln(&mut g, "ln_f")?;

    let tok = g.embedding(wte, ids)?;
    let pe = g.embedding(wpe, pos)?;
    let x = g.add(tok, pe)?;
    let h = g.layer_norm(x, ln1_w, ln1_b, 1e-5)?;
    let qkv = g.matmul(h, c_attn_w, false, false)?;
    let qkv = g.bias_add(qkv, c_attn_b)?;
    let mut heads = Vec::new();
    for part in g.split(qkv, &[C, C, C])? {
        let r = g.reshape(part, &[B, T, H, C / H])?;
        heads.push(g.permute(r, &[0, 2, 1, 3])?);
    }
    let opts = AttentionOpts {
        causal: true,
        scale: None,
        dropout_p: dropout,
        mask: Some(mask),
        softcap: None,
    };
    let a = g.attention(heads[0], heads[1], heads[2], opts)?;
    let a = g.transpose(a, 1, 2)?;
    let a = g.reshape(a, &[B, T, C])?;
    let a = g.linear(a, proj_w, Some(proj_b))?;
    let x = g.add(x, a)?;
    let h = g.layer_norm(x, ln2_w, ln2_b, 1e-5)?;
    let m = g.matmul(h, fc_w, false, false)?;
    let m = g.bias_add(m, fc_b)?;
    let m = g.gelu(m, GeluApprox::Tanh)?;
    let m = g.dropout(m, dropout)?;
    let m = g.linear(m, out_w, Some(out_b))?;
    let x = g.add(x, m)?;
    let h = g.layer_norm(x, lnf_w, lnf_b, 1e-5)?;
    let logits = g.matmul(h, wte, false, true)?; // tied LM head
    let loss = g.cross_entropy(logits, labels)?;
    g.set_loss(loss)?;
    Ok((g, loss))
}

struct Batch {
    ids: Vec<i64>,
    pos: Vec<i64>,
    labels: Vec<i64>,
    mask: Vec<f32>,
}

impl Batch {
    fn new(rng: &mut Rng) -> Self {
        let ids: Vec<i64> = (0..B * T).map(|_| rng.below(V) as i64).collect();
        // Next-token labels; the last position and one padded position are ignored (-100).
        let labels =
            (0..B * T).map(|i| if i % T == T - 1 || i == 3 { -100 } else { ids[i + 1] }).collect();
        // Additive padding mask: sequence 1's last key is padding.
        let mut mask = vec![0.0f32; B * T];
        mask[2 * T - 1] = -10000.0;
        Batch { ids, pos: (0..T as i64).collect(), labels, mask }
    }

    fn inputs(&self) -> Inputs<'_> {
        Inputs::new()
            .ids("input_ids", &self.ids)
            .ids("position_ids", &self.pos)
            .ids("labels", &self.labels)
            .floats("attention_mask", &self.mask)
    }
}

#[test]
fn tiny_model_gradient_matches_finite_differences() {
    let (fwd, loss) = tiny_model(0.1).unwrap();
    let train = backward(&fwd, loss).unwrap();
    let mut rng = Rng::new(21);
    let batch = Batch::new(&mut rng);
    let inputs = batch.inputs();
    let params: Vec<f64> = rng.vec(fwd.num_param_elems()).iter().map(|v| 0.5 * v).collect();

    // f64: every coordinate, tolerance 1e-6·(1 + |fd|) (looser than the per-op 1e-7: ~20 ops deep).
    let mut grads = vec![0.0; params.len()];
    let step_seed = 1234;
    RefExecutor::new(&train).train_step(&params, &inputs, step_seed, &mut grads).unwrap();
    let exec = RefExecutor::new(&fwd);
    let fd =
        fd_grad(&params, FD_STEP, |p| exec.run(p, &inputs, step_seed).unwrap().loss().unwrap());
    assert_close(&grads, &fd, 1e-6, "tiny model gradient (f64)");
    for p in fwd.params() {
        assert!(
            grads[p.offset..p.offset + p.len].iter().any(|&g| g != 0.0),
            "{} has a zero gradient",
            p.name
        );
    }

    // f32, as training runs: 40 random coordinates, step 1e-2, tolerance 2e-3 + 2e-2·|fd|.
    let p32: Vec<f32> = params.iter().map(|&v| v as f32).collect();
    let mut g32 = vec![0.0f32; p32.len()];
    RefExecutor::new(&train).train_step(&p32, &inputs, step_seed, &mut g32).unwrap();
    let loss32 = |p: &[f32]| exec.run(p, &inputs, step_seed).unwrap().loss().unwrap() as f64;
    for _ in 0..40 {
        let i = rng.below(p32.len());
        let (mut pp, mut pm) = (p32.clone(), p32.clone());
        pp[i] += 1e-2;
        pm[i] -= 1e-2;
        let fd = (loss32(&pp) - loss32(&pm)) / 2e-2;
        let g = g32[i] as f64;
        assert!(
            (g - fd).abs() <= 2e-3 + 2e-2 * fd.abs(),
            "f32 coordinate {i}: autodiff {g}, fd {fd}"
        );
    }
}

#[test]
fn sgd_on_one_batch_lowers_the_loss() {
    let (fwd, loss) = tiny_model(0.0).unwrap();
    let train = backward(&fwd, loss).unwrap();
    let mut rng = Rng::new(22);
    let batch = Batch::new(&mut rng);
    let inputs = batch.inputs();
    let mut params: Vec<f32> = rng.vec_f32(fwd.num_param_elems()).iter().map(|v| 0.3 * v).collect();
    let mut grads = vec![0.0f32; params.len()];
    let exec = RefExecutor::new(&train);
    let mut losses = Vec::new();
    for step in 0..30 {
        losses.push(exec.train_step(&params, &inputs, step, &mut grads).unwrap());
        for (p, g) in params.iter_mut().zip(&grads) {
            *p -= 0.3 * g;
        }
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(last < 0.5 * first, "loss {first} -> {last}: {losses:?}");
    assert!(losses.windows(2).take(10).all(|w| w[1] < w[0]), "early steps descend: {losses:?}");
}

#[test]
fn dropout_seed_changes_the_loss_and_is_reproducible() {
    let (fwd, _) = tiny_model(0.3).unwrap();
    let mut rng = Rng::new(23);
    let batch = Batch::new(&mut rng);
    let params = rng.vec_f32(fwd.num_param_elems());
    let exec = RefExecutor::new(&fwd);
    let loss = |seed| exec.run(&params, &batch.inputs(), seed).unwrap().loss().unwrap();
    assert_eq!(loss(1), loss(1));
    assert_ne!(loss(1), loss(2));
}

#[test]
fn bad_inputs_are_clear_errors() {
    let (fwd, loss) = tiny_model(0.0).unwrap();
    let train = backward(&fwd, loss).unwrap();
    let mut rng = Rng::new(24);
    let batch = Batch::new(&mut rng);
    let params = rng.vec_f32(fwd.num_param_elems());
    let exec = RefExecutor::new(&train);
    let mut grads = vec![0.0f32; params.len()];

    let missing = Inputs::new().ids("input_ids", &batch.ids);
    let err = exec.train_step(&params, &missing, 0, &mut grads).unwrap_err();
    assert_eq!(err, ExecError::MissingInput("position_ids".into()));

    let typo = batch.inputs().ids("input_idz", &batch.ids);
    assert!(matches!(
        exec.train_step(&params, &typo, 0, &mut grads),
        Err(ExecError::UnknownInput { .. })
    ));

    let short = Inputs::new()
        .ids("input_ids", &batch.ids[1..])
        .ids("position_ids", &batch.pos)
        .ids("labels", &batch.labels)
        .floats("attention_mask", &batch.mask);
    let err = exec.train_step(&params, &short, 0, &mut grads).unwrap_err().to_string();
    assert!(err.contains("input_ids") && err.contains("(2,5) i64"), "{err}");

    let mut bad_ids = batch.ids.clone();
    bad_ids[4] = V as i64;
    let oob = Inputs::new()
        .ids("input_ids", &bad_ids)
        .ids("position_ids", &batch.pos)
        .ids("labels", &batch.labels)
        .floats("attention_mask", &batch.mask);
    let err = exec.train_step(&params, &oob, 0, &mut grads).unwrap_err();
    assert!(matches!(err, ExecError::Op { op: "embedding", .. }), "{err}");

    let err = exec.train_step(&params[1..], &batch.inputs(), 0, &mut grads).unwrap_err();
    assert!(matches!(err, ExecError::ParamLen { .. }));
    let err = exec.train_step(&params, &batch.inputs(), 0, &mut grads[1..]).unwrap_err();
    assert!(matches!(err, ExecError::GradLen { .. }));
    let err =
        RefExecutor::new(&fwd).train_step(&params, &batch.inputs(), 0, &mut grads).unwrap_err();
    assert_eq!(err, ExecError::NotTraining);
}

#[test]
fn forward_values_are_readable() {
    let (fwd, loss) = tiny_model(0.0).unwrap();
    let mut rng = Rng::new(25);
    let batch = Batch::new(&mut rng);
    let params = rng.vec_f32(fwd.num_param_elems());
    let values = RefExecutor::new(&fwd).run(&params, &batch.inputs(), 0).unwrap();
    let wte = fwd.param_by_name("wte.weight").unwrap();
    assert_eq!(values.get(wte.tensor).unwrap(), &params[..V * C]);
    let l = values.get(loss).unwrap();
    assert_eq!((l.len(), Some(l[0])), (1, values.loss()));
    assert!(l[0].is_finite() && l[0] > 0.0);
}

#[test]
fn an_out_of_order_graph_is_an_error_not_a_panic() {
    let mut g = Graph::new();
    let x = g.param("x", &[2, 3]).unwrap();
    let y = g.tanh(x).unwrap();
    let _ = g.scale(y, 2.0).unwrap();
    g.nodes.swap(0, 1);
    let err = RefExecutor::new(&g).run(&[0.5f32; 6], &Inputs::new(), 0).unwrap_err();
    assert_eq!(err, ExecError::NotComputed { node: 0, op: "scale", tensor: y });
}
