//! BERT (transformers/models/bert): its engine graph (`graph`) and its tch module (`torch`).

pub(crate) mod graph;
#[cfg(feature = "torch")]
pub(crate) mod torch;
