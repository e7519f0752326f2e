//! Training graphs for the planner's and the planned executor's tests, built with the graph
//! builder only (the engine crate cannot depend on `ortbench-models`): a GPT-2-style and a
//! BERT-style transformer, and random-ish graphs that mix every op with views the planner must
//! fold or copy.

use crate::autodiff::backward;
use crate::exec::Inputs;
use crate::graph::{AttentionOpts, GeluApprox, Graph, GraphError, TensorId};
use crate::ops::testutil::Rng;

type R<T> = Result<T, GraphError>;

/// Sizes of a tiny transformer.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub h: usize,
    pub v: usize,
    pub layers: usize,
    pub dropout: f32,
}

/// Step data for a graph: ids, labels (some ignored), positions, an additive padding mask.
pub struct Feed {
    pub ids: Vec<i64>,
    pub labels: Vec<i64>,
    pub positions: Vec<i64>,
    pub mask: Vec<f32>,
    pub cls_labels: Vec<i64>,
}

impl Feed {
    pub fn new(d: &Dims, seed: u64) -> Feed {
        let mut rng = Rng::new(seed);
        let n = d.b * d.t;
        Feed {
            ids: (0..n).map(|_| rng.below(d.v) as i64).collect(),
            labels: (0..n).map(|i| if i % 4 == 3 { -100 } else { rng.below(d.v) as i64 }).collect(),
            positions: (0..d.t as i64).collect(),
            mask: (0..d.b * d.t).map(|i| if i % 7 == 6 { -1e4 } else { 0.0 }).collect(),
            cls_labels: (0..d.b).map(|_| rng.below(3) as i64).collect(),
        }
    }

    /// Only ~15% of the tokens labelled (HF's MLM collator), so that the executor's
    /// row-restricted kernels run (`plan::rows`).
    pub fn mlm(d: &Dims, seed: u64) -> Feed {
        let mut f = Feed::new(d, seed);
        let mut rng = Rng::new(seed ^ 0xA5);
        for l in &mut f.labels {
            if rng.uniform() >= 0.15 {
                *l = -100;
            }
        }
        f
    }

    /// The inputs `g` declares, by name.
    pub fn inputs<'a>(&'a self, g: &Graph) -> Inputs<'a> {
        let mut inp = Inputs::new();
        for &t in g.inputs() {
            inp = match g.input_name(t).expect("named") {
                "input_ids" => inp.ids("input_ids", &self.ids),
                "labels" => inp.ids("labels", &self.labels),
                "cls_labels" => inp.ids("cls_labels", &self.cls_labels),
                "position_ids" => inp.ids("position_ids", &self.positions),
                "attention_mask" => inp.floats("attention_mask", &self.mask),
                other => panic!("no feed for {other}"),
            };
        }
        inp
    }
}

fn ln(g: &mut Graph, x: TensorId, name: &str, c: usize) -> R<TensorId> {
    let w = g.param(&format!("{name}.weight"), &[c])?;
    let b = g.param(&format!("{name}.bias"), &[c])?;
    g.layer_norm(x, w, b, 1e-5)
}

fn linear(g: &mut Graph, x: TensorId, name: &str, cin: usize, cout: usize) -> R<TensorId> {
    let w = g.param(&format!("{name}.weight"), &[cout, cin])?;
    let b = g.param(&format!("{name}.bias"), &[cout])?;
    g.linear(x, w, Some(b))
}

fn heads(g: &mut Graph, x: TensorId, d: &Dims) -> R<TensorId> {
    let r = g.reshape(x, &[d.b, d.t, d.h, d.c / d.h])?;
    g.permute(r, &[0, 2, 1, 3])
}

fn merge(g: &mut Graph, x: TensorId, d: &Dims) -> R<TensorId> {
    let p = g.permute(x, &[0, 2, 1, 3])?;
    g.reshape(p, &[d.b, d.t, d.c])
}

/// GPT-2 style: wte + wpe, pre-LN blocks (c_attn split into q, k, v; causal attention with a
/// padding mask and dropout; GELU-tanh MLP with Conv1D weights), ln_f, tied LM head.
pub fn gpt_like(d: &Dims) -> R<Graph> {
    gpt_like_dtype(d, crate::DType::F32)
}

/// [`gpt_like`] storing activations as `dtype`.
pub fn gpt_like_dtype(d: &Dims, dtype: crate::DType) -> R<Graph> {
    let mut g = Graph::with_dtype(dtype);
    let ids = g.input_ids("input_ids", &[d.b, d.t])?;
    let pos = g.input_ids("position_ids", &[d.t])?;
    let labels = g.input_ids("labels", &[d.b, d.t])?;
    let mask = g.input_float("attention_mask", &[d.b, 1, 1, d.t])?;
    let wte = g.param("wte", &[d.v, d.c])?;
    let wpe = g.param("wpe", &[d.t, d.c])?;
    let tok = g.embedding(wte, ids)?;
    let pe = g.embedding(wpe, pos)?;
    let x = g.add(tok, pe)?;
    let mut x = g.dropout(x, d.dropout)?;
    for l in 0..d.layers {
        let h = ln(&mut g, x, &format!("h{l}.ln_1"), d.c)?;
        let w = g.param(&format!("h{l}.c_attn.weight"), &[d.c, 3 * d.c])?;
        let bb = g.param(&format!("h{l}.c_attn.bias"), &[3 * d.c])?;
        let qkv = g.matmul(h, w, false, false)?;
        let qkv = g.bias_add(qkv, bb)?;
        let parts = g.split(qkv, &[d.c, d.c, d.c])?;
        let (q, k, v) =
            (heads(&mut g, parts[0], d)?, heads(&mut g, parts[1], d)?, heads(&mut g, parts[2], d)?);
        let a = g.attention(
            q,
            k,
            v,
            AttentionOpts {
                causal: true,
                scale: None,
                dropout_p: d.dropout,
                mask: Some(mask),
                softcap: None,
            },
        )?;
        let a = merge(&mut g, a, d)?;
        let a = linear(&mut g, a, &format!("h{l}.c_proj"), d.c, d.c)?;
        let a = g.dropout(a, d.dropout)?;
        x = g.add(x, a)?;
        let h = ln(&mut g, x, &format!("h{l}.ln_2"), d.c)?;
        let w1 = g.param(&format!("h{l}.c_fc.weight"), &[d.c, 4 * d.c])?;
        let b1 = g.param(&format!("h{l}.c_fc.bias"), &[4 * d.c])?;
        let m = g.matmul(h, w1, false, false)?;
        let m = g.bias_add(m, b1)?;
        let m = g.gelu(m, GeluApprox::Tanh)?;
        let m = linear(&mut g, m, &format!("h{l}.mlp.c_proj"), 4 * d.c, d.c)?;
        let m = g.dropout(m, d.dropout)?;
        x = g.add(x, m)?;
    }
    let x = ln(&mut g, x, "ln_f", d.c)?;
    let logits = g.matmul(x, wte, false, true)?;
    let loss = g.cross_entropy(logits, labels)?;
    backward(&g, loss)
}

/// BERT style: word + position embeddings, LayerNorm, post-LN layers (separate q/k/v linears,
/// attention with a padding mask and dropout, GELU-erf MLP), an MLM head (dense, GELU, LN,
/// tied decoder + bias) — or, with `classify`, token 0 through a split, a tanh pooler and a
/// 3-way classifier.
pub fn bert_like(d: &Dims, classify: bool) -> R<Graph> {
    let mut g = Graph::new();
    let ids = g.input_ids("input_ids", &[d.b, d.t])?;
    let pos = g.input_ids("position_ids", &[d.t])?;
    let mask = g.input_float("attention_mask", &[d.b, 1, 1, d.t])?;
    let wte = g.param("word", &[d.v, d.c])?;
    let wpe = g.param("pos", &[d.t, d.c])?;
    let tok = g.embedding(wte, ids)?;
    let pe = g.embedding(wpe, pos)?;
    let x = g.add(tok, pe)?;
    let x = ln(&mut g, x, "emb.ln", d.c)?;
    let mut x = g.dropout(x, d.dropout)?;
    for l in 0..d.layers {
        let q = linear(&mut g, x, &format!("l{l}.q"), d.c, d.c)?;
        let k = linear(&mut g, x, &format!("l{l}.k"), d.c, d.c)?;
        let v = linear(&mut g, x, &format!("l{l}.v"), d.c, d.c)?;
        let (q, k, v) = (heads(&mut g, q, d)?, heads(&mut g, k, d)?, heads(&mut g, v, d)?);
        let a = g.attention(
            q,
            k,
            v,
            AttentionOpts {
                causal: false,
                scale: None,
                dropout_p: d.dropout,
                mask: Some(mask),
                softcap: None,
            },
        )?;
        let a = merge(&mut g, a, d)?;
        let a = linear(&mut g, a, &format!("l{l}.o"), d.c, d.c)?;
        let a = g.dropout(a, d.dropout)?;
        let a = g.add(a, x)?;
        let a = ln(&mut g, a, &format!("l{l}.ln1"), d.c)?;
        let m = linear(&mut g, a, &format!("l{l}.fc"), d.c, 4 * d.c)?;
        let m = g.gelu(m, GeluApprox::Erf)?;
        let m = linear(&mut g, m, &format!("l{l}.proj"), 4 * d.c, d.c)?;
        let m = g.dropout(m, d.dropout)?;
        let m = g.add(m, a)?;
        x = ln(&mut g, m, &format!("l{l}.ln2"), d.c)?;
    }
    let loss = if classify {
        let labels = g.input_ids("cls_labels", &[d.b])?;
        let flat = g.reshape(x, &[d.b, d.t * d.c])?;
        let first = g.split(flat, &[d.c, (d.t - 1) * d.c])?[0];
        let p = linear(&mut g, first, "pooler", d.c, d.c)?;
        let p = g.tanh(p)?;
        let p = g.dropout(p, d.dropout)?;
        let logits = linear(&mut g, p, "classifier", d.c, 3)?;
        g.cross_entropy(logits, labels)?
    } else {
        let labels = g.input_ids("labels", &[d.b, d.t])?;
        let h = linear(&mut g, x, "head.dense", d.c, d.c)?;
        let h = g.gelu(h, GeluApprox::Erf)?;
        let h = ln(&mut g, h, "head.ln", d.c)?;
        let logits = g.matmul(h, wte, false, true)?;
        let bias = g.param("head.bias", &[d.v])?;
        let logits = g.bias_add(logits, bias)?;
        g.cross_entropy(logits, labels)?
    };
    backward(&g, loss)
}

/// A random-ish graph on (B, T, C) activations: a chain of `steps` ops drawn from matmuls with
/// every flag, hand-written attention through folded transposes, permutes consumed by
/// elementwise ops (which need a copy), split/concat in swapped order, reshapes, residuals,
/// broadcasts, tied weights, LayerNorm, softmax with a mask, dropout, tanh, GELU and the
/// attention op, then a head and cross-entropy.
pub fn random_graph(seed: u64, steps: usize) -> R<(Graph, Dims)> {
    let mut rng = Rng::new(seed);
    let (b, t, h) = (1 + rng.below(3), 2 + rng.below(6), 2);
    let c = h * (2 + rng.below(4)) * 3; // divisible by 3 and by H
    let d = Dims {
        b,
        t,
        c,
        h,
        v: 5 + rng.below(20),
        layers: 0,
        dropout: if rng.below(2) == 0 { 0.0 } else { 0.2 },
    };
    let mut g = Graph::new();
    let ids = g.input_ids("input_ids", &[b, t])?;
    let labels = g.input_ids("labels", &[b, t])?;
    let mask = g.input_float("attention_mask", &[b, 1, 1, t])?;
    let table = g.param("table", &[d.v, c])?;
    let mut x = g.embedding(table, ids)?;
    let mut saved = vec![x];
    let mut weights: Vec<TensorId> = Vec::new();
    for s in 0..steps {
        let name = |k: &str| format!("s{s}.{k}");
        x = match rng.below(14) {
            0 => {
                let tb = rng.below(2) == 0;
                let w = g.param(&name("w"), &[c, c])?;
                weights.push(w);
                g.matmul(x, w, false, tb)?
            }
            1 if !weights.is_empty() => {
                // A weight used twice (its gradient sums both uses).
                let w = weights[rng.below(weights.len())];
                g.matmul(x, w, false, rng.below(2) == 0)?
            }
            2 => g.gelu(x, if rng.below(2) == 0 { GeluApprox::Erf } else { GeluApprox::Tanh })?,
            3 => ln(&mut g, x, &name("ln"), c)?,
            4 => {
                let other = saved[rng.below(saved.len())];
                if rng.below(2) == 0 {
                    g.add(x, other)?
                } else {
                    g.add(other, x)?
                }
            }
            5 => {
                let shape = if rng.below(2) == 0 { vec![t, c] } else { vec![c] };
                let p = g.param(&name("bcast"), &shape)?;
                g.add(x, p)?
            }
            6 => {
                // A permute consumed by an elementwise op: needs a copy; and back.
                let p = g.permute(x, &[0, 2, 1])?;
                let p = g.tanh(p)?;
                g.permute(p, &[0, 2, 1])?
            }
            7 => {
                // Attention by hand: transposes fold into GEMM flags.
                let kt = g.permute(x, &[0, 2, 1])?; // (B, C, T)
                let s = g.matmul(x, kt, false, false)?; // (B, T, T)
                let s4 = g.reshape(s, &[b, 1, t, t])?;
                let p = g.softmax(s4, 0.3, rng.below(2) == 0, Some(mask))?;
                let p = g.reshape(p, &[b, t, t])?;
                g.matmul(p, x, false, false)?
            }
            8 => {
                // Split and concat in swapped order: the concat cannot alias the split.
                let c1 = 1 + rng.below(c - 1);
                let parts = g.split(x, &[c1, c - c1])?;
                let y = g.concat(&[parts[1], parts[0]])?;
                g.scale(y, 0.9)?
            }
            9 => {
                let r = g.reshape(x, &[b * t, c])?;
                let r = g.gelu(r, GeluApprox::Erf)?;
                g.reshape(r, &[b, t, c])?
            }
            10 => g.dropout(x, d.dropout)?,
            11 => {
                // The attention op on heads split out of a (B, T, C) row, merged back.
                let parts = g.split(x, &[c / 3, c / 3, c / 3])?;
                let dh = Dims { c: c / 3, ..d };
                let (q, k, v) = (
                    heads(&mut g, parts[0], &dh)?,
                    heads(&mut g, parts[1], &dh)?,
                    heads(&mut g, parts[2], &dh)?,
                );
                let opts = AttentionOpts {
                    causal: rng.below(2) == 0,
                    scale: None,
                    dropout_p: d.dropout,
                    mask: if rng.below(2) == 0 { Some(mask) } else { None },
                    softcap: None,
                };
                let a = g.attention(q, k, v, opts)?;
                let a = merge(&mut g, a, &dh)?;
                let w = g.param(&name("up"), &[c, c / 3])?;
                g.linear(a, w, None)?
            }
            12 => {
                // Batched matmul with a batched b from a folded permute (ta/tb flips).
                let xt = g.permute(x, &[0, 2, 1])?; // (B, C, T)
                let gram = g.matmul(xt, xt, false, true)?; // (B, C, C)
                let gram = g.scale(gram, 0.1)?;
                g.matmul(x, gram, false, rng.below(2) == 0)?
            }
            _ => {
                let u = g.param(&name("up"), &[c, 2 * c])?;
                let y = g.matmul(x, u, false, false)?;
                let y = g.tanh(y)?;
                let dn = g.param(&name("down"), &[2 * c, c])?;
                let y = g.matmul(y, dn, false, false)?;
                let db = g.param(&name("down.b"), &[c])?;
                g.bias_add(y, db)?
            }
        };
        saved.push(x);
    }
    let head = g.param("head", &[d.v, c])?;
    let logits = g.matmul(x, head, false, true)?;
    let loss = g.cross_entropy(logits, labels)?;
    Ok((backward(&g, loss)?, d))
}

/// Parameters for `g`: small random values (never zero), LayerNorm weights near 1.
pub fn params(g: &Graph, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut p: Vec<f32> = rng.vec_f32(g.num_param_elems()).iter().map(|v| 0.3 * v).collect();
    for prm in g.params() {
        if prm.name.contains("ln") && prm.name.ends_with(".weight") {
            for v in &mut p[prm.offset..prm.offset + prm.len] {
                *v += 1.0;
            }
        }
    }
    p
}
