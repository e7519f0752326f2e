//! What every pass test does: print the graph before and after, and check that the loss and
//! every parameter's gradient are unchanged on random (never zero) parameters and inputs —
//! with the reference executor in f64, and with the planned CPU executor in f32 on the
//! rewritten graph against the reference on the original one.

use crate::autodiff::backward;
use crate::exec::planned::PlannedExecutor;
use crate::exec::{Inputs, RefExecutor};
use crate::graph::{Graph, GraphError, Op, TensorId};
use crate::ops::testutil::Rng;
use crate::plan::testgraphs::params;

pub use super::op_counts;

/// Runs `pass` on `g`, prints both graphs and the op counts that changed.
pub fn show(
    name: &str,
    g: &Graph,
    pass: impl Fn(&Graph) -> Result<(Graph, usize), GraphError>,
) -> (Graph, usize) {
    let (after, n) = pass(g).unwrap_or_else(|e| panic!("{name}: {e}"));
    super::validate(&after).unwrap();
    println!(
        "==== {name}: before\n{g}==== {name}: after ({n} rewrites)\n{after}==== op counts\n{}\n",
        super::op_count_diff(g, &after)
    );
    (after, n)
}

/// Owned step inputs for a graph: ids in range of what reads them, floats as a random mask.
pub struct Feed {
    ids: Vec<(String, Vec<i64>)>,
    floats: Vec<(String, Vec<f32>)>,
}

impl Feed {
    pub fn new(g: &Graph, seed: u64) -> Feed {
        let mut rng = Rng::new(seed);
        let (mut ids, mut floats) = (Vec::new(), Vec::new());
        for &t in g.inputs() {
            let name = g.input_name(t).expect("named").to_string();
            let n = g.tensor(t).numel();
            if g.tensor(t).elem.is_float() {
                // An additive mask: mostly 0, some large negatives, never all masked.
                floats.push((
                    name,
                    (0..n)
                        .map(|i| if i % 5 == 3 { -1e4 } else { 0.1 * rng.uniform() as f32 })
                        .collect(),
                ));
            } else {
                let (limit, labels) = id_range(g, t);
                let v = (0..n)
                    .map(|i| if labels && i % 4 == 3 { -100 } else { rng.below(limit) as i64 })
                    .collect();
                ids.push((name, v));
            }
        }
        Feed { ids, floats }
    }

    pub fn inputs(&self) -> Inputs<'_> {
        let mut inp = Inputs::new();
        for (n, v) in &self.ids {
            inp = inp.ids(n, v);
        }
        for (n, v) in &self.floats {
            inp = inp.floats(n, v);
        }
        inp
    }
}

/// (values below, is a label) of an id input, from the first node reading it.
fn id_range(g: &Graph, t: TensorId) -> (usize, bool) {
    for n in g.nodes() {
        match n.op {
            Op::Embedding if n.inputs[1] == t => return (g.shape(n.inputs[0])[0], false),
            Op::CrossEntropy(_) if n.inputs[1] == t => {
                return (*g.shape(n.inputs[0]).last().expect("logits"), true)
            }
            Op::LinearCrossEntropy(_) if n.inputs[2] == t => {
                return (g.shape(n.inputs[1])[0], true)
            }
            Op::LinearCrossEntropyBackward(_) if n.inputs[3] == t => {
                return (g.shape(n.inputs[2])[0], true)
            }
            _ => {}
        }
    }
    (2, false)
}

/// Autodiff of a forward graph with its loss set.
pub fn train(g: &Graph) -> Graph {
    backward(g, g.loss().expect("test graphs set their loss")).unwrap()
}

/// Checks `before` and `after` (forward graphs with their loss set, or training graphs)
/// compute the same loss and gradients. Reference executor in f64: |Δloss| ≤ rtol·|loss|,
/// per parameter max|Δg| ≤ rtol·max|g| + 1e-12. With `planned`, the planned executor (f32)
/// on `after` against the reference (f32) on `before`: loss within 1e-5 relative, gradients
/// within 1e-5·max|g| + 1e-7·G (G the largest gradient; as `exec::planned::tests`).
pub fn assert_same_numbers(before: &Graph, after: &Graph, rtol: f64, planned: bool) {
    let (tb, ta) = if before.is_training() {
        (before.clone(), after.clone())
    } else {
        (train(before), train(after))
    };
    let layout = |g: &Graph| {
        g.params()
            .iter()
            .map(|p| (p.name.clone(), p.shape.clone(), p.offset, p.len))
            .collect::<Vec<_>>()
    };
    assert_eq!(layout(&tb), layout(&ta), "parameters and their layout are unchanged");
    let feed = Feed::new(&tb, 11);
    let inputs = feed.inputs();
    let p32 = params(&tb, 3);
    let p64: Vec<f64> = p32.iter().map(|&v| v as f64).collect();
    let n = tb.num_param_elems();
    let seed = 5;
    let run64 = |g: &Graph| {
        let mut grads = vec![0.0f64; n];
        let l = RefExecutor::new(g).train_step(&p64, &inputs, seed, &mut grads).unwrap();
        (l, grads)
    };
    let ((lb, gb), (la, ga)) = (run64(&tb), run64(&ta));
    assert!((la - lb).abs() <= rtol * lb.abs() + 1e-12, "loss {la} after vs {lb} before");
    compare_grads(&tb, &ga, &gb, rtol, 1e-12, "reference f64");
    println!("reference f64: loss {lb:.9} before, {la:.9} after");
    if planned {
        let mut g_ref = vec![0.0f32; n];
        let l_ref = RefExecutor::new(&tb).train_step(&p32, &inputs, seed, &mut g_ref).unwrap();
        let mut ex = PlannedExecutor::new(&ta).unwrap();
        ex.plan().check(&ta).unwrap();
        let mut g_fast = vec![f32::NAN; n];
        let l_fast = ex.train_step(&p32, &inputs, seed, &mut g_fast).unwrap();
        assert!(
            (l_fast - l_ref).abs() <= 1e-5 * l_ref.abs(),
            "planned loss {l_fast} vs reference {l_ref}"
        );
        let big = g_ref.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let (gf, gr): (Vec<f64>, Vec<f64>) =
            (g_fast.iter().map(|&v| v as f64).collect(), g_ref.iter().map(|&v| v as f64).collect());
        compare_grads(&tb, &gf, &gr, 1e-5, 1e-7 * big, "planned f32");
        println!("planned f32: loss {l_fast:.6} vs reference {l_ref:.6}");
    }
}

fn compare_grads(g: &Graph, got: &[f64], want: &[f64], rtol: f64, floor: f64, what: &str) {
    for p in g.params() {
        let (a, b) = (&got[p.offset..p.offset + p.len], &want[p.offset..p.offset + p.len]);
        let max_g = b.iter().fold(0f64, |m, v| m.max(v.abs()));
        let max_d = a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(a.iter().all(|v| v.is_finite()), "{what}: {} has a non-finite gradient", p.name);
        assert!(
            max_d <= rtol * max_g + floor,
            "{what}: gradient of {} differs by {max_d:e} (max |g| {max_g:e})",
            p.name
        );
    }
}

/// A GPT-2-like forward graph as HF's eager code writes it: wte + wpe, dropout, pre-LN blocks
/// (c_attn split into q, k, v; q·kᵀ through a transpose, scale, causal softmax with an
/// additive (T, T) mask, dropout, ·v; c_proj; dropout; residual; ln_2; c_fc; GELU-tanh;
/// c_proj; dropout; residual), ln_f, tied LM head, cross-entropy. Loss set.
pub fn eager_gpt(
    b: usize,
    t: usize,
    c: usize,
    h: usize,
    v: usize,
    layers: usize,
    dropout: f32,
) -> Graph {
    let r = || -> Result<Graph, GraphError> {
        let mut g = Graph::new();
        let ids = g.input_ids("input_ids", &[b, t])?;
        let pos = g.input_ids("position_ids", &[t])?;
        let labels = g.input_ids("labels", &[b, t])?;
        let mask = g.input_float("attention_mask", &[t, t])?;
        let wte = g.param("wte", &[v, c])?;
        let wpe = g.param("wpe", &[t, c])?;
        let tok = g.embedding(wte, ids)?;
        let pe = g.embedding(wpe, pos)?;
        let x = g.add(tok, pe)?;
        let mut x = g.dropout(x, dropout)?;
        let d = c / h;
        for l in 0..layers {
            let ln = |g: &mut Graph, x, name: &str| -> Result<TensorId, GraphError> {
                let w = g.param(&format!("h{l}.{name}.weight"), &[c])?;
                let bb = g.param(&format!("h{l}.{name}.bias"), &[c])?;
                g.layer_norm(x, w, bb, 1e-5)
            };
            let conv = |g: &mut Graph,
                        x,
                        name: &str,
                        cin: usize,
                        cout: usize|
             -> Result<TensorId, GraphError> {
                let w = g.param(&format!("h{l}.{name}.weight"), &[cin, cout])?;
                let bb = g.param(&format!("h{l}.{name}.bias"), &[cout])?;
                let y = g.matmul(x, w, false, false)?;
                g.bias_add(y, bb)
            };
            let hs = ln(&mut g, x, "ln_1")?;
            let qkv = conv(&mut g, hs, "c_attn", c, 3 * c)?;
            let parts = g.split(qkv, &[c, c, c])?;
            let mut heads = Vec::new();
            for &p in &parts {
                let r = g.reshape(p, &[b, t, h, d])?;
                heads.push(g.permute(r, &[0, 2, 1, 3])?);
            }
            let kt = g.transpose(heads[1], 2, 3)?;
            let s = g.matmul(heads[0], kt, false, false)?;
            let s = g.scale(s, 1.0 / (d as f32).sqrt())?;
            let s = g.add(s, mask)?;
            let p = g.softmax(s, 1.0, true, None)?;
            let p = g.dropout(p, dropout)?;
            let a = g.matmul(p, heads[2], false, false)?;
            let a = g.permute(a, &[0, 2, 1, 3])?;
            let a = g.reshape(a, &[b, t, c])?;
            let a = conv(&mut g, a, "attn.c_proj", c, c)?;
            let a = g.dropout(a, dropout)?;
            x = g.add(x, a)?;
            let hs = ln(&mut g, x, "ln_2")?;
            let m = conv(&mut g, hs, "c_fc", c, 4 * c)?;
            let m = g.gelu(m, crate::graph::GeluApprox::Tanh)?;
            let m = conv(&mut g, m, "mlp.c_proj", 4 * c, c)?;
            let m = g.dropout(m, dropout)?;
            x = g.add(x, m)?;
        }
        let w = g.param("ln_f.weight", &[c])?;
        let bb = g.param("ln_f.bias", &[c])?;
        let x = g.layer_norm(x, w, bb, 1e-5)?;
        let logits = g.matmul(x, wte, false, true)?;
        let loss = g.cross_entropy(logits, labels)?;
        g.set_loss(loss)?;
        Ok(g)
    };
    r().unwrap()
}
