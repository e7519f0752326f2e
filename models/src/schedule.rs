//! Learning-rate schedules with HF Trainer's semantics (transformers.optimization).

/// `constant` (HF `get_constant_schedule[_with_warmup]`) or `linear`
/// (`get_linear_schedule_with_warmup`): warm up linearly over `warmup_steps`, then (linear
/// only) decay linearly to 0 at `total_steps`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LrSchedule {
    Constant { warmup_steps: usize },
    Linear { warmup_steps: usize, total_steps: usize },
}

impl LrSchedule {
    /// The multiplier of the base learning rate used by optimizer step `step` (0-based).
    pub fn factor(&self, step: usize) -> f64 {
        match *self {
            LrSchedule::Constant { warmup_steps } => {
                if step < warmup_steps {
                    step as f64 / warmup_steps.max(1) as f64
                } else {
                    1.0
                }
            }
            LrSchedule::Linear { warmup_steps, total_steps } => {
                if step < warmup_steps {
                    step as f64 / warmup_steps.max(1) as f64
                } else {
                    let rest = total_steps.saturating_sub(step) as f64;
                    (rest / total_steps.saturating_sub(warmup_steps).max(1) as f64).max(0.0)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_hf_lambdas() {
        let c = LrSchedule::Constant { warmup_steps: 0 };
        assert_eq!(c.factor(0), 1.0);
        let l = LrSchedule::Linear { warmup_steps: 2, total_steps: 10 };
        assert_eq!(l.factor(0), 0.0);
        assert_eq!(l.factor(1), 0.5);
        assert_eq!(l.factor(2), 1.0);
        assert_eq!(l.factor(6), 0.5);
        assert_eq!(l.factor(10), 0.0);
    }
}
