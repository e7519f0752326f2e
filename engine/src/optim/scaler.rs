//! Dynamic loss scaling, with torch.amp.GradScaler's defaults (and Apex's / DeepSpeed's
//! semantics): start at 2^16, double after 2000 consecutive clean steps, halve and skip the
//! step when a gradient is inf/NaN.

#[derive(Clone, Debug, PartialEq)]
pub struct LossScaler {
    pub scale: f32,
    pub growth_factor: f32,
    pub backoff_factor: f32,
    pub growth_interval: u32,
    clean_steps: u32,
}

impl Default for LossScaler {
    fn default() -> Self {
        LossScaler {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            clean_steps: 0,
        }
    }
}

impl LossScaler {
    /// What the loss is multiplied by before backward; gradients are divided by it.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Clean steps since the scale last changed (what a checkpoint must keep, so that a resumed
    /// run grows the scale at the same step).
    pub fn clean_steps(&self) -> u32 {
        self.clean_steps
    }

    /// A scaler resumed from a checkpoint's `scale` and `clean_steps`, default factors.
    pub fn resumed(scale: f32, clean_steps: u32) -> Self {
        LossScaler { scale, clean_steps, ..LossScaler::default() }
    }

    /// Records a step's outcome; returns true when the step must be skipped.
    pub fn update(&mut self, found_overflow: bool) -> bool {
        if found_overflow {
            self.scale *= self.backoff_factor;
            self.clean_steps = 0;
            return true;
        }
        self.clean_steps += 1;
        if self.clean_steps == self.growth_interval {
            self.scale *= self.growth_factor;
            self.clean_steps = 0;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_on_overflow_and_doubles_after_2000_clean_steps() {
        let mut s = LossScaler::default();
        assert_eq!(s.scale(), 65536.0);
        assert!(s.update(true));
        assert_eq!(s.scale(), 32768.0);
        for _ in 0..1999 {
            assert!(!s.update(false));
        }
        assert_eq!(s.scale(), 32768.0);
        assert!(!s.update(false));
        assert_eq!(s.scale(), 65536.0);
        // An overflow resets the count of clean steps.
        for _ in 0..1000 {
            s.update(false);
        }
        s.update(true);
        for _ in 0..1999 {
            s.update(false);
        }
        assert_eq!(s.scale(), 32768.0);
    }
}
