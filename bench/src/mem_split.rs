//! The memory split a worker reports (the `mem_*` columns, the report's memory chart): the
//! engine's from its flat buffers and memory plan (`ortbench_engine::plan::split`), the torch
//! baseline's from parameter counts and tensor shapes, its activations what the measured peak
//! leaves. docs/usage.md ("Output and reports") says how each part is derived.

use ortbench_engine::plan::split::MemorySplit;
use ortbench_report::output::MemSplit;

/// `mem_split_source` of the engine's split.
pub const PLAN: &str = MemSplit::PLAN;
/// `mem_split_source` of the torch configs' split.
pub const ANALYTIC: &str = MemSplit::ANALYTIC;

/// B·T·V-sized fp32 tensors libtorch's cross-entropy holds at once: at its backward the
/// log-probabilities it saved, their gradient and the logits' gradient
/// (`scripts/torch-ce-memory.py` measures it; the figures: docs/measurements.md, "Memory
/// split: torch's cross-entropy").
pub const TORCH_CE_LOGITS_COPIES: u64 = 3;

/// The engine's split as a worker reports it.
pub fn from_plan(s: &MemorySplit) -> MemSplit {
    let b = |v: usize| Some(v as u64);
    MemSplit {
        params_bytes: b(s.params_bytes),
        grads_bytes: b(s.grads_bytes),
        optimizer_bytes: b(s.optimizer_bytes),
        activations_bytes: b(s.activations_bytes),
        logits_bytes: b(s.logits_bytes),
        source: PLAN.into(),
    }
}

/// What the torch split needs to know of a run.
pub struct TorchShapes {
    /// Ψ: parameters (tied weights once), fp32 in every precision (autocast keeps them so).
    pub params: u64,
    /// Bytes of the optimizer state a rank holds (AdamW's two fp32 moments: 8Ψ).
    pub optimizer_bytes: u64,
    /// (rows, classes) of the cross-entropy's logits on one rank — B·T × V for a language
    /// model's head, B·T × labels for a token classifier — when its loss is a cross-entropy
    /// over fp32 logits; None otherwise (sequence heads, fp16/bf16 autocast): not known.
    pub ce_logits: Option<(u64, u64)>,
    /// Ranks that share the worker process (threads): its peak holds all of theirs.
    pub ranks_in_process: usize,
}

/// The torch baseline's split of `peak` (the worker's measured peak): parameters, gradients
/// (fp32, Ψ each) and optimizer state from the counts, logits from their shape, activations
/// what the peak leaves of those four ("activations and the rest"). Activations are unknown
/// when a part is, when ranks share the process (its peak is theirs together) or when the
/// parts exceed the peak.
pub fn torch(s: &TorchShapes, peak: Option<u64>) -> MemSplit {
    let logits = s.ce_logits.map(|(rows, classes)| TORCH_CE_LOGITS_COPIES * rows * classes * 4);
    let (params, grads) = (4 * s.params, 4 * s.params);
    let known = params + grads + s.optimizer_bytes;
    let activations = match (logits, peak) {
        (Some(l), Some(p)) if s.ranks_in_process == 1 => p.checked_sub(known + l),
        _ => None,
    };
    MemSplit {
        params_bytes: Some(params),
        grads_bytes: Some(grads),
        optimizer_bytes: Some(s.optimizer_bytes),
        activations_bytes: activations,
        logits_bytes: logits,
        source: ANALYTIC.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_split_of_gpt2_b8_s512_from_its_shapes() {
        // gpt2: Ψ = 124 439 808, V = 50 257; b8 × s512 = 4096 rows.
        let psi = 124_439_808u64;
        let s = TorchShapes {
            params: psi,
            optimizer_bytes: 8 * psi,
            ce_logits: Some((4096, 50_257)),
            ranks_in_process: 1,
        };
        let peak = 6_000_000_000;
        let m = torch(&s, Some(peak));
        assert_eq!(m.params_bytes, Some(497_759_232));
        assert_eq!(m.grads_bytes, Some(497_759_232));
        assert_eq!(m.optimizer_bytes, Some(995_518_464));
        // Three 4096 × 50 257 fp32 tensors: 3 × 823 410 688 bytes.
        assert_eq!(m.logits_bytes, Some(2_470_232_064));
        assert_eq!(m.activations_bytes, Some(peak - 4_461_268_992));
        assert_eq!(m.known_bytes(), peak, "the parts are the peak, the rest in activations");
        assert_eq!(m.source, ANALYTIC);
    }

    #[test]
    fn torch_split_leaves_unknown_what_it_cannot_say() {
        let s = |ce_logits, ranks_in_process| TorchShapes {
            params: 1000,
            optimizer_bytes: 8000,
            ce_logits,
            ranks_in_process,
        };
        // Parts above the peak: activations unknown, never negative.
        assert_eq!(torch(&s(Some((10, 100)), 1), Some(10_000)).activations_bytes, None);
        // No cross-entropy over fp32 logits: logits and activations unknown.
        let m = torch(&s(None, 1), Some(1 << 30));
        assert_eq!((m.logits_bytes, m.activations_bytes), (None, None));
        assert_eq!(m.params_bytes, Some(4000));
        // Two thread ranks in one process: its peak is theirs together.
        assert_eq!(torch(&s(Some((10, 100)), 2), Some(1 << 30)).activations_bytes, None);
        assert_eq!(torch(&s(Some((10, 100)), 1), None).activations_bytes, None);
    }
}
