//! Graph passes: eliminations, fusions and recompute, each a small module with a test that
//! prints the graph before and after and checks the numbers do not change.
//!
//! The model builders write what HF's modeling code writes (eager attention as matmul, scale,
//! softmax, dropout, matmul; `nn.Linear` as matmul + bias add; the activation; the residual
//! add; layer norm; dropout sites even at p = 0), and these passes turn that into the fused
//! graph the fast kernels run. Forward passes run before autodiff ([`run_forward`]), so the
//! fused ops' gradient rules write the backward; training passes run after it
//! ([`run_training`]). In run order:
//!
//! | pass | forward / training | rewrite |
//! |---|---|---|
//! | `eliminate_dropout` | forward | `dropout(x, p = 0)` ⇒ x |
//! | `eliminate_identity` | forward | reshape to the same shape, identity permute ⇒ x (the IR has no cast op, so there are no identity casts to remove) |
//! | `fold_transpose` | forward | permute swapping the last two dims feeding a matmul ⇒ the matmul's `ta`/`tb` flag |
//! | `fuse_softmax` | forward | scale → (mask add) → softmax ⇒ softmax with the scale and additive mask folded in |
//! | `fuse_attention` | forward | matmul(q, kᵀ) → [scale] → [tanh → scale: a soft-cap] → softmax(+mask, causal) → [dropout] → matmul(·, v) ⇒ [`Op::Attention`] |
//! | `fuse_linear_cross_entropy` | forward | matmul(x, wᵀ) → [bias add] → cross-entropy ⇒ [`Op::LinearCrossEntropy`]: the logits are never stored |
//! | `fuse_matmul_bias` | forward | matmul → bias add (→ GELU) ⇒ [`Op::Linear`] |
//! | `fuse_add_layernorm` | forward | add → LayerNorm ⇒ [`Op::AddLayerNorm`] |
//! | `fuse_add_rmsnorm` | forward | add → RMSNorm ⇒ [`Op::AddRmsNorm`] |
//! | `fuse_swiglu` | forward | silu(gate) → mul(·, up) ⇒ [`Op::SwiGlu`]: silu(gate) is never stored |
//! | `fuse_linear_cross_entropy_backward` | training | the loss's `linear_cross_entropy` and its backward ⇒ the backward node alone, moved to the forward's place, giving the loss too (one sweep over the logits chunks) |
//! | `recompute_gelu` | training, off by default | the GELU output the backward reads is recomputed from its input right before that read |
//!
//! Softmax + cross-entropy needs no pass: [`Op::CrossEntropy`] already *is* that fusion (a
//! log-sum-exp forward that stores no probabilities, a backward that recomputes softmax from
//! the logits once and writes softmax − onehot in place); `softmax_cross_entropy` tests the
//! fused kernel against the two-op form. Softmax → dropout has no op of its own: outside
//! attention nothing in BERT or GPT-2 has it, and inside attention `fuse_attention` takes both.
//!
//! Every pass keeps the graph valid ([`rewrite::validate`]): topological order, shapes
//! checked by the builder methods that create the fused nodes, inputs, parameters and their
//! flat layout, the loss, the parameter gradients and the dropout sites' RNG counters (a
//! fused dropout keeps its site's offset, so masks are bit-identical). Nodes a pattern absorbs
//! are removed and unreferenced tensors dropped, so tensor ids are renumbered: read the loss
//! from the returned graph ([`Graph::loss`]).
//!
//! `ORTBENCH_PASSES` switches passes on and off ([`PassConfig::from_env`]) so that their
//! effect can be measured: `none`, `all`, or `-fuse_add_layernorm,+recompute_gelu`.
//!
//! References: ORT's `onnxruntime/core/optimizer` (`MatMulAddFusion`, `BiasGeluFusion`,
//! `SkipLayerNormFusion`, `AttentionFusion`, `TransposeMatMulFusion`, `DropoutElimination`,
//! `EliminateIdentity`) and its memory optimizer's recompute.

pub mod eliminate;
pub mod fold_transpose;
pub mod fuse_add_layernorm;
pub mod fuse_add_rmsnorm;
pub mod fuse_attention;
pub mod fuse_linear_cross_entropy;
pub mod fuse_matmul_bias;
pub mod fuse_softmax;
pub mod fuse_swiglu;
pub mod recompute_gelu;
pub(crate) mod rewrite;
#[cfg(test)]
mod softmax_cross_entropy;
#[cfg(test)]
pub(crate) mod testutil;

pub use rewrite::validate;

use crate::graph::{Graph, GraphError};
use std::collections::BTreeMap;
use std::fmt;

/// A pass: the graph in, the rewritten graph and the number of rewrites out.
type PassFn = fn(&Graph) -> Result<(Graph, usize), GraphError>;

struct PassDef {
    name: &'static str,
    training: bool,
    default_on: bool,
    run: PassFn,
}

/// Every pass, in run order.
const PASSES: &[PassDef] = &[
    PassDef {
        name: "eliminate_dropout",
        training: false,
        default_on: true,
        run: eliminate::eliminate_dropout,
    },
    PassDef {
        name: "eliminate_identity",
        training: false,
        default_on: true,
        run: eliminate::eliminate_identity,
    },
    PassDef { name: "fold_transpose", training: false, default_on: true, run: fold_transpose::run },
    PassDef { name: "fuse_softmax", training: false, default_on: true, run: fuse_softmax::run },
    PassDef { name: "fuse_attention", training: false, default_on: true, run: fuse_attention::run },
    PassDef {
        name: "fuse_linear_cross_entropy",
        training: false,
        default_on: true,
        run: fuse_linear_cross_entropy::run,
    },
    PassDef {
        name: "fuse_matmul_bias",
        training: false,
        default_on: true,
        run: fuse_matmul_bias::run,
    },
    PassDef {
        name: "fuse_add_layernorm",
        training: false,
        default_on: true,
        run: fuse_add_layernorm::run,
    },
    PassDef {
        name: "fuse_add_rmsnorm",
        training: false,
        default_on: true,
        run: fuse_add_rmsnorm::run,
    },
    PassDef { name: "fuse_swiglu", training: false, default_on: true, run: fuse_swiglu::run },
    PassDef {
        name: "fuse_linear_cross_entropy_backward",
        training: true,
        default_on: true,
        run: fuse_linear_cross_entropy::merge_backward,
    },
    PassDef { name: "recompute_gelu", training: true, default_on: false, run: recompute_gelu::run },
];

/// The environment variable [`PassConfig::from_env`] reads.
pub const ENV_VAR: &str = "ORTBENCH_PASSES";

/// A bad pass name or `ORTBENCH_PASSES` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PassConfigError(String);

/// Which passes run: one bit per entry of [`PassConfig::names`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PassConfig {
    bits: u32,
}

impl Default for PassConfig {
    fn default() -> Self {
        PassConfig::all()
    }
}

impl PassConfig {
    /// Every pass that is on by default (all but `recompute_gelu`, which trades compute for
    /// memory and is asked for with `+recompute_gelu`).
    pub fn all() -> Self {
        let bits =
            PASSES.iter().enumerate().filter(|(_, p)| p.default_on).fold(0, |b, (i, _)| b | 1 << i);
        PassConfig { bits }
    }

    /// No pass: the graph as the builder wrote it.
    pub fn none() -> Self {
        PassConfig { bits: 0 }
    }

    /// Every pass's name, in run order.
    pub fn names() -> Vec<&'static str> {
        PASSES.iter().map(|p| p.name).collect()
    }

    /// Whether pass `name` is on (false for an unknown name).
    pub fn enabled(&self, name: &str) -> bool {
        PASSES.iter().position(|p| p.name == name).is_some_and(|i| self.bits & 1 << i != 0)
    }

    /// This config with pass `name` switched on or off.
    ///
    /// # Panics
    /// On a name not in [`PassConfig::names`] (a typo in code); for names a user typed, use
    /// [`PassConfig::try_with`] or [`PassConfig::parse`].
    pub fn with(self, name: &str, on: bool) -> Self {
        self.try_with(name, on).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`PassConfig::with`], an error naming the known passes for an unknown name.
    pub fn try_with(self, name: &str, on: bool) -> Result<Self, PassConfigError> {
        let i = PASSES.iter().position(|p| p.name == name).ok_or_else(|| {
            PassConfigError(format!(
                "unknown pass '{name}'; the passes are {} (and `all`, `none`)",
                Self::names().join(", ")
            ))
        })?;
        let bits = if on { self.bits | 1 << i } else { self.bits & !(1 << i) };
        Ok(PassConfig { bits })
    }

    /// Parses an `ORTBENCH_PASSES` value: empty or `all` = [`PassConfig::all`], `none` =
    /// [`PassConfig::none`], or a comma list of `+name` / `name` (on) and `-name` (off)
    /// applied to `all`, or to `none` when the list starts with `none`
    /// (`none,+fuse_attention`).
    pub fn parse(s: &str) -> Result<Self, PassConfigError> {
        let mut cfg = PassConfig::all();
        for (i, item) in s.split(',').map(str::trim).enumerate() {
            match item {
                "" | "all" if i == 0 => cfg = PassConfig::all(),
                "none" if i == 0 => cfg = PassConfig::none(),
                "" => {}
                _ => {
                    let (name, on) = match item.strip_prefix('-') {
                        Some(n) => (n, false),
                        None => (item.strip_prefix('+').unwrap_or(item), true),
                    };
                    cfg = cfg
                        .try_with(name, on)
                        .map_err(|e| PassConfigError(format!("{ENV_VAR}='{s}': {e}")))?;
                }
            }
        }
        Ok(cfg)
    }

    /// The passes `ORTBENCH_PASSES` asks for (see [`PassConfig::parse`]); unset = all.
    pub fn from_env() -> Result<Self, PassConfigError> {
        match std::env::var(ENV_VAR) {
            Ok(v) => Self::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(PassConfig::all()),
            Err(e) => Err(PassConfigError(format!("{ENV_VAR}: {e}"))),
        }
    }
}

impl fmt::Display for PassConfig {
    /// The enabled passes, comma-separated (`none` when there are none).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on: Vec<&str> = PASSES.iter().map(|p| p.name).filter(|n| self.enabled(n)).collect();
        if on.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&on.join(","))
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassResult {
    pub name: &'static str,
    /// Patterns rewritten (nodes eliminated, fusions made, recomputations inserted).
    pub rewrites: usize,
}

/// What the passes that ran did, in run order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    pub passes: Vec<PassResult>,
}

impl PassReport {
    /// Rewrites of pass `name` (0 when it did not run).
    pub fn rewrites(&self, name: &str) -> usize {
        self.passes.iter().filter(|p| p.name == name).map(|p| p.rewrites).sum()
    }

    /// The passes of `other` appended (a forward and a training report as one).
    pub fn extend(&mut self, other: PassReport) {
        self.passes.extend(other.passes);
    }
}

impl fmt::Display for PassReport {
    /// `eliminate_dropout 4, fuse_attention 2, …` (or `no passes`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.passes.is_empty() {
            return f.write_str("no passes");
        }
        let parts: Vec<String> =
            self.passes.iter().map(|p| format!("{} {}", p.name, p.rewrites)).collect();
        f.write_str(&parts.join(", "))
    }
}

fn run(g: &Graph, cfg: &PassConfig, training: bool) -> Result<(Graph, PassReport), GraphError> {
    let mut g = g.clone();
    let mut report = PassReport::default();
    for p in PASSES.iter().filter(|p| p.training == training && cfg.enabled(p.name)) {
        let (next, rewrites) = (p.run)(&g)?;
        g = next;
        report.passes.push(PassResult { name: p.name, rewrites });
    }
    Ok((g, report))
}

/// Runs the enabled forward passes on a forward graph (before autodiff). Set the loss on it
/// first ([`Graph::set_loss`]) and read it back from the result: ids are renumbered.
pub fn run_forward(g: &Graph, cfg: &PassConfig) -> Result<(Graph, PassReport), GraphError> {
    if g.is_training() {
        return Err(GraphError::Attr { op: "passes", msg: "run_forward needs a forward graph; this one has a backward (run the forward passes before autodiff)".into() });
    }
    run(g, cfg, false)
}

/// Runs the enabled training passes on a training graph (after autodiff).
pub fn run_training(g: &Graph, cfg: &PassConfig) -> Result<(Graph, PassReport), GraphError> {
    if !g.is_training() {
        return Err(GraphError::Attr {
            op: "passes",
            msg: "run_training needs a training graph: run autodiff::backward first".into(),
        });
    }
    run(g, cfg, true)
}

/// Nodes per op name (`matmul` by flags is just `matmul`), to show what passes changed.
pub fn op_counts(g: &Graph) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for n in g.nodes() {
        *m.entry(n.op.name().to_string()).or_insert(0) += 1;
    }
    m
}

/// `before → after` per op whose count changed, one per line (for printing in tests and
/// notebooks).
pub fn op_count_diff(before: &Graph, after: &Graph) -> String {
    let (a, b) = (op_counts(before), op_counts(after));
    let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|n| {
            let (x, y) = (a.get(n).copied().unwrap_or(0), b.get(n).copied().unwrap_or(0));
            (x != y).then(|| format!("{n}: {x} -> {y}"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests;
