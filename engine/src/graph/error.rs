//! Build-time errors of the graph: what the engine cannot handle is reported here, naming the op
//! and the shapes, never silently worked around.

use super::TensorId;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GraphError {
    /// Inconsistent shapes; `shapes` lists every operand, e.g. `a=(2,3,4) b=(5,6)`.
    #[error("{op}: {msg}; shapes: {shapes}")]
    Shape { op: &'static str, msg: String, shapes: String },
    /// An operand of the wrong element type (e.g. float token ids).
    #[error("{op}: {arg} must be {expected}, got {got}")]
    Type { op: &'static str, arg: &'static str, expected: &'static str, got: String },
    /// An invalid attribute (dropout p outside [0, 1], a permutation that is not one, …).
    #[error("{op}: {msg}")]
    Attr { op: &'static str, msg: String },
    #[error("tensor {0} does not belong to this graph")]
    UnknownTensor(TensorId),
    #[error("{kind} '{name}' is declared twice: declare it once and reuse its tensor (that is also how parameters are tied)")]
    Duplicate { kind: &'static str, name: String },
    /// The graph cannot be differentiated as asked (no gradient rule, a non-scalar loss, …).
    #[error("autodiff: {0}")]
    Autodiff(String),
}

/// `(2,3,4)`: how shapes appear in errors and in printed graphs.
pub fn fmt_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("({})", dims.join(","))
}

/// `a=(2,3) b=(4,5)`
pub(crate) fn fmt_shapes(named: &[(&str, &[usize])]) -> String {
    let parts: Vec<String> = named.iter().map(|(n, s)| format!("{n}={}", fmt_shape(s))).collect();
    parts.join(" ")
}
