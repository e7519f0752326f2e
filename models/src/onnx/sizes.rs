//! The export's sizes as functions of the two dynamic axes: the inference graph built at every
//! probe size ([`PROBES`]), checked to be one graph, and each size it needs fitted as
//! k + b·batch + t·sequence + bt·batch·sequence ([`Dim`]).

use std::fmt;

use ortbench_engine::graph::op::Split;
use ortbench_engine::graph::{Graph, Op, TensorId};

use super::{BATCH, PROBES, SEQUENCE};
use crate::config::ModelConfig;
use crate::graph::{GraphOptions, InferenceModel};
use crate::ModelError;

/// A size as a function of the dynamic axes: k + b·batch + t·sequence + bt·batch·sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Dim {
    pub(super) k: i64,
    pub(super) b: i64,
    pub(super) t: i64,
    pub(super) bt: i64,
}

impl Dim {
    pub(super) const BATCH: Dim = Dim { k: 0, b: 1, t: 0, bt: 0 };
    pub(super) const SEQUENCE: Dim = Dim { k: 0, b: 0, t: 1, bt: 0 };

    pub(super) fn eval(self, b: usize, t: usize) -> i64 {
        let (b, t) = (b as i64, t as i64);
        self.k + self.b * b + self.t * t + self.bt * b * t
    }

    pub(super) fn as_const(self) -> Option<i64> {
        (self.b == 0 && self.t == 0 && self.bt == 0).then_some(self.k)
    }

    /// The size whose values at [`PROBES`] are `v`, if it has the form (integer coefficients).
    pub(super) fn fit(v: &[i64]) -> Option<Dim> {
        let [(b0, t0), (b1, _), (_, t1), ..] = PROBES;
        let (db, dt) = ((b1 - b0) as i64, (t1 - t0) as i64);
        let exact = |num: i64, den: i64| (num % den == 0).then_some(num / den);
        // The batch slope at each sequence length is b + bt·T; its change over T gives bt.
        let (s0, s1) = (exact(v[1] - v[0], db)?, exact(v[3] - v[2], db)?);
        let bt = exact(s1 - s0, dt)?;
        let b = s0 - bt * t0 as i64;
        let t = exact(v[2] - v[0], dt)? - bt * b0 as i64;
        let k = v[0] - b * b0 as i64 - t * t0 as i64 - bt * (b0 * t0) as i64;
        let d = Dim { k, b, t, bt };
        PROBES.iter().zip(v).all(|(&(pb, pt), &x)| d.eval(pb, pt) == x).then_some(d)
    }
}

impl fmt::Display for Dim {
    /// `64·sequence − 64`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let terms =
            [(self.bt, "batch·sequence"), (self.b, BATCH), (self.t, SEQUENCE), (self.k, "")];
        let mut first = true;
        for (c, v) in terms.into_iter().filter(|(c, _)| *c != 0) {
            let sign = match (first, c < 0) {
                (true, true) => "-",
                (true, false) => "",
                (false, true) => " − ",
                (false, false) => " + ",
            };
            let m = c.unsigned_abs();
            match (m, v.is_empty()) {
                (_, true) => write!(f, "{sign}{m}")?,
                (1, false) => write!(f, "{sign}{v}")?,
                (_, false) => write!(f, "{sign}{m}·{v}")?,
            }
            first = false;
        }
        if first {
            f.write_str("0")?;
        }
        Ok(())
    }
}

/// The inference graph at every probe size, and its logits (the same tensor in each).
pub(super) struct Probes {
    pub(super) graphs: Vec<Graph>,
    pub(super) logits: TensorId,
}

impl Probes {
    pub(super) fn build(cfg: &ModelConfig) -> Result<Self, ModelError> {
        let max_t = PROBES.iter().map(|p| p.1).max().unwrap_or(0);
        if cfg.max_positions() < max_t {
            return Err(ModelError::Unsupported(format!(
                "ONNX export of {} builds the graph at sequence lengths up to {max_t} to find its dynamic sizes, beyond the model's {} positions",
                cfg.arch.hf_name(),
                cfg.max_positions()
            )));
        }
        let models = PROBES
            .iter()
            .map(|&(b, t)| {
                InferenceModel::new(cfg, &GraphOptions::new(b, t).with_attention_mask(true))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let logits = models[0].logits;
        if models.iter().any(|m| m.logits != logits) {
            return Err(ModelError::Unsupported(format!(
                "ONNX export of {}: the graphs built at the probe sizes have different logits tensors",
                cfg.arch.hf_name()
            )));
        }
        Ok(Probes { graphs: models.into_iter().map(|m| m.graph).collect(), logits })
    }

    pub(super) fn graph(&self) -> &Graph {
        &self.graphs[0]
    }

    /// The probes' graphs are one graph at different sizes: the same nodes over the same
    /// tensors with the same ranks and ops, only sizes differing.
    pub(super) fn check_structure(&self) -> Result<(), String> {
        let g0 = self.graph();
        for (g, &(b, t)) in self.graphs.iter().zip(&PROBES).skip(1) {
            let at =
                format!("the graphs built at {}×{} and {b}×{t} differ", PROBES[0].0, PROBES[0].1);
            if g.nodes().len() != g0.nodes().len() || g.tensors().len() != g0.tensors().len() {
                return Err(format!("{at} in their node or tensor count"));
            }
            if g.params() != g0.params() || g.inputs() != g0.inputs() {
                return Err(format!("{at} in their parameters or inputs"));
            }
            for (i, (x, y)) in g0.tensors().iter().zip(g.tensors()).enumerate() {
                if x.shape.len() != y.shape.len() || x.elem != y.elem || x.kind != y.kind {
                    return Err(format!("{at} at tensor %{i}"));
                }
            }
            for (i, (x, y)) in g0.nodes().iter().zip(g.nodes()).enumerate() {
                let same_op = match (&x.op, &y.op) {
                    (Op::Split(Split { sizes: s0 }), Op::Split(Split { sizes: s1 })) => {
                        s0.len() == s1.len()
                    }
                    (a, b) => a == b,
                };
                if !same_op || x.inputs != y.inputs || x.outputs != y.outputs {
                    return Err(format!(
                        "{at} at node {i} ({} {} vs {} {})",
                        x.op.name(),
                        x.op.attrs(),
                        y.op.name(),
                        y.op.attrs()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Fits the values `at(graph)` takes at the probes.
    pub(super) fn fit(&self, what: &str, at: impl Fn(&Graph) -> usize) -> Result<Dim, String> {
        let v: Vec<i64> = self.graphs.iter().map(|g| at(g) as i64).collect();
        Dim::fit(&v).ok_or_else(|| {
            let seen: Vec<String> =
                PROBES.iter().zip(&v).map(|((b, t), x)| format!("{x} at {b}×{t}")).collect();
            format!(
                "{what} is not k + b·{BATCH} + t·{SEQUENCE} + bt·{BATCH}·{SEQUENCE} ({})",
                seen.join(", ")
            )
        })
    }

    /// The shape of `t` in terms of the dynamic axes.
    pub(super) fn dims(&self, t: TensorId) -> Result<Vec<Dim>, String> {
        (0..self.graph().shape(t).len())
            .map(|i| self.fit(&format!("axis {i} of {t}"), |g| g.shape(t)[i]))
            .collect()
    }
}
