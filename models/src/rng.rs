//! A small deterministic RNG shared by weight initialisation and synthetic data.
//!
//! Both the libtorch baseline and the engine must start from identical weights and see
//! identical batches, so neither may draw from its own framework's RNG: everything random
//! comes from here, keyed by a seed and a stream name.

/// SplitMix64 (Steele et al., "Fast splittable pseudorandom number generators", 2014).
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
    spare_normal: Option<f64>,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: seed, spare_normal: None }
    }

    /// A generator for one named stream (e.g. a parameter name), so that a value does not
    /// depend on the order in which streams are drawn.
    pub fn for_stream(seed: u64, stream: &str) -> Self {
        // FNV-1a of the stream name, mixed with the seed.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in stream.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let mut r = Rng::new(seed ^ h.rotate_left(17));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [lo, hi).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        debug_assert!(hi > lo);
        lo + (self.uniform() * (hi - lo) as f64) as i64
    }

    /// Standard normal (Box–Muller, both values used).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare_normal.take() {
            return z;
        }
        let u1 = 1.0 - self.uniform(); // (0, 1]: ln is finite
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (2.0 * std::f64::consts::PI * u2).sin_cos();
        self.spare_normal = Some(r * s);
        r * c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_has_unit_moments() {
        let mut r = Rng::new(7);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "var {var}");
    }

    #[test]
    fn streams_are_independent_of_order_and_distinct() {
        let a1 = Rng::for_stream(1, "a").next_u64();
        let _ = Rng::for_stream(1, "b").next_u64();
        assert_eq!(a1, Rng::for_stream(1, "a").next_u64());
        assert_ne!(a1, Rng::for_stream(1, "b").next_u64());
        assert_ne!(a1, Rng::for_stream(2, "a").next_u64());
    }

    #[test]
    fn range_stays_in_bounds() {
        let mut r = Rng::new(3);
        for _ in 0..10_000 {
            let v = r.range(5, 9);
            assert!((5..9).contains(&v));
        }
    }
}
