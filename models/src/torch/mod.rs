//! The `pytorch` baseline: each family's model in libtorch eager through tch (its module is
//! `family/<family>/torch.rs`, over the layers here), written the way HF Transformers writes it
//! (module per HF class, HF parameter names, `sdpa` attention), and trained the way HF Trainer
//! trains it by default (torch's fused AdamW with decay groups, global-norm clipping, dynamic
//! loss scaling for fp16).

mod autocast;
pub(crate) mod heads;
pub(crate) mod layers;
mod optim;
mod trainer;

pub use autocast::{autocast, AutocastDtype};
pub use optim::{probe_ops, FusedAdamW, OpCall, StepOutcome};
pub use trainer::{InjectedError, Precision, StepStats, TorchTrainer, TrainOptions};

use std::collections::HashMap;

use tch::{nn, Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::data::Batch;
use crate::params::param_specs;
use crate::weights::{NamedTensor, Weights};
use crate::ModelError;

/// A model of one of the supported architectures: its family's module for its head.
pub struct TorchModel(Box<dyn TorchLoss>);

/// What the baseline asks of a family's tch model with one head: HF's `outputs.loss`.
pub(crate) trait TorchLoss: Send {
    /// The scalar loss, fp32. input_ids: (B, T); attention_mask: (B, T) 0/1, None when nothing
    /// is padded; labels: the task's (`Batch::labels`), flat; targets: a regression's (B,).
    fn loss(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
        targets: Option<&Tensor>,
        train: bool,
    ) -> Tensor;
}

/// Variables by HF name. Variables live in a VarStore whose group 0 gets weight decay and
/// group 1 not (HF Trainer's `get_decay_parameter_names`).
pub struct Vars(HashMap<String, Tensor>);

impl Vars {
    pub(crate) fn get(&self, name: &str) -> Tensor {
        // Every name comes from `param_specs`, which created the variables: a miss is a bug.
        self.0.get(name).unwrap_or_else(|| panic!("no variable {name}")).shallow_clone()
    }
}

pub const DECAY_GROUP: usize = 0;
pub const NO_DECAY_GROUP: usize = 1;

/// Creates one variable per parameter from `weights` (HF names, HF shapes) in `vs`.
pub fn create_vars(
    vs: &nn::VarStore,
    cfg: &ModelConfig,
    weights: &Weights,
) -> Result<Vars, ModelError> {
    let root = vs.root();
    let mut map = HashMap::new();
    for spec in param_specs(cfg) {
        let w = weights
            .get(&spec.name)
            .ok_or_else(|| ModelError::Weights(format!("weights have no '{}'", spec.name)))?;
        if w.shape != spec.shape {
            return Err(ModelError::Weights(format!(
                "'{}' has shape {:?}, expected {:?}",
                spec.name, w.shape, spec.shape
            )));
        }
        let group = if spec.decay { DECAY_GROUP } else { NO_DECAY_GROUP };
        let mut path = root.set_group(group);
        let parts: Vec<&str> = spec.name.split('.').collect();
        for part in &parts[..parts.len() - 1] {
            path = path.sub(*part);
        }
        let shape: Vec<i64> = w.shape.iter().map(|&d| d as i64).collect();
        let value = Tensor::from_slice(&w.data).reshape(&shape);
        let var = path.var_copy(parts[parts.len() - 1], &value);
        map.insert(spec.name.clone(), var);
    }
    Ok(Vars(map))
}

impl TorchModel {
    pub fn new(cfg: &ModelConfig, vars: &Vars) -> Self {
        TorchModel(cfg.family.model().torch_model(cfg, vars))
    }

    /// The scalar training loss of `batch` (HF's `outputs.loss`), in fp32.
    pub fn loss(&self, batch: &Batch, device: Device, train: bool) -> Tensor {
        let ids = Tensor::from_slice(&batch.input_ids)
            .reshape([batch.batch_size as i64, batch.seq_len as i64])
            .to_device(device);
        let labels = Tensor::from_slice(&batch.labels).to_device(device);
        // HF skips the mask when nothing is padded (sdpa may then take its fastest kernel).
        let mask = batch.attention_mask.as_ref().filter(|_| batch.has_padding()).map(|m| {
            Tensor::from_slice(m)
                .reshape([batch.batch_size as i64, batch.seq_len as i64])
                .to_device(device)
        });
        let mask = mask.as_ref();
        let targets = batch.targets.as_ref().map(|v| Tensor::from_slice(v).to_device(device));
        let targets = targets.as_ref();
        self.0.loss(&ids, mask, &labels, targets, train)
    }
}

/// Reads variables back into `Weights` (HF names), e.g. to compare with the engine.
pub fn export(vars_in_order: &[(String, Tensor)]) -> Weights {
    let tensors = vars_in_order
        .iter()
        .map(|(name, t)| {
            let t = t.detach().to_device(Device::Cpu).to_kind(Kind::Float).contiguous();
            let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
            let data = Vec::<f32>::try_from(t.flatten(0, -1)).expect("float tensor");
            NamedTensor { name: name.clone(), shape, data }
        })
        .collect();
    Weights { tensors }
}

/// Runs `f`, turning a panic inside it into an error that keeps the panic's text. tch's
/// methods without the `f_` prefix unwrap libtorch's errors, so an op that fails in libtorch
/// (a CUDA error, an out-of-memory, mismatched shapes) panics; the baseline returns it as an
/// error instead, with libtorch's message (`what: libtorch: <message>`).
pub fn catch_torch<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(ModelError::Training(format!("{what}: {}", panic_text(&*payload)))),
    }
}

/// The text of a panic's payload; for a tch `unwrap()` of a libtorch error
/// (``called `Result::unwrap()` on an `Err` value: Torch("…")``) libtorch's message itself,
/// as `libtorch: <message>` (see [`libtorch_message`]).
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    let raw = match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => return "a panic without a message".into(),
    };
    match libtorch_message(&raw) {
        Some(m) => format!("libtorch: {m}"),
        None => raw,
    }
}

/// libtorch's message inside a tch panic (`… Torch("<Debug-escaped message>")`), unescaped and
/// cut before the C++ backtrace libtorch appends (`Exception raised from …`), on one line.
pub fn libtorch_message(panic: &str) -> Option<String> {
    const OPEN: &str = "Torch(\"";
    let start = panic.find(OPEN)? + OPEN.len();
    let end = panic.rfind("\")").filter(|&e| e >= start)?;
    let text = unescape_debug(&panic[start..end]);
    let text = text.split("Exception raised from").next().unwrap_or(&text);
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(one_line).filter(|s| !s.is_empty())
}

/// Undoes `str`'s `Debug` escapes (`\n`, `\"`, `\\`, `\u{…}`, …).
fn unescape_debug(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('0') => out.push('\0'),
            Some('u') => {
                let code: String =
                    chars.by_ref().skip_while(|&c| c == '{').take_while(|&c| c != '}').collect();
                out.extend(u32::from_str_radix(&code, 16).ok().and_then(char::from_u32));
            }
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::unnecessary_literal_unwrap, reason = "the test makes tch's panic on purpose")]
    fn a_tch_panic_gives_libtorch_s_message() {
        let e: Result<(), tch::TchError> = Err(tch::TchError::Torch(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has \"80\" GiB\nException raised from malloc at c10/cuda/CUDACachingAllocator.cpp:1\nframe #0: x".into(),
        ));
        let payload =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.unwrap())).unwrap_err();
        assert_eq!(
            panic_text(&*payload),
            "libtorch: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has \"80\" GiB"
        );
        let payload = std::panic::catch_unwind(|| panic!("plain {}", 1)).unwrap_err();
        assert_eq!(panic_text(&*payload), "plain 1");
        assert_eq!(unescape_debug(r"a\u{e9}b\\c\'"), "a\u{e9}b\\c'");
    }

    #[test]
    fn a_failing_op_is_an_error_with_its_text() {
        let r = catch_torch("step", || {
            let a = tch::Tensor::zeros([2, 3], (tch::Kind::Float, tch::Device::Cpu));
            let _ = a.matmul(&tch::Tensor::zeros([4, 5], (tch::Kind::Float, tch::Device::Cpu)));
            Ok(())
        });
        let e = r.unwrap_err().to_string();
        assert!(
            e.starts_with("step: libtorch: ")
                && e.contains("2x3")
                && e.contains("4x5")
                && !e.contains('\n'),
            "{e}"
        );
    }
}
