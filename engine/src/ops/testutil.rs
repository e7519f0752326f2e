//! Test helpers: a tiny deterministic RNG, central finite differences and a tolerance check.

/// splitmix64: deterministic, no dependency, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Values in ±[0.1, 1): random sign, never zero (zeros hide missing gradient terms).
    pub fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let m = 0.1 + 0.9 * self.uniform();
                if self.next_u64() & 1 == 0 {
                    m
                } else {
                    -m
                }
            })
            .collect()
    }

    pub fn vec_f32(&mut self, n: usize) -> Vec<f32> {
        self.vec(n).into_iter().map(|v| v as f32).collect()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Central finite differences of `f` at `x`, every coordinate, step `h`.
pub fn fd_grad(x: &[f64], h: f64, mut f: impl FnMut(&[f64]) -> f64) -> Vec<f64> {
    let mut x = x.to_vec();
    (0..x.len())
        .map(|i| {
            let x0 = x[i];
            x[i] = x0 + h;
            let fp = f(&x);
            x[i] = x0 - h;
            let fm = f(&x);
            x[i] = x0;
            (fp - fm) / (2.0 * h)
        })
        .collect()
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Asserts |got - want| <= tol * (1 + |want|) element-wise (absolute near 0, relative beyond).
pub fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w} (diff {:.3e}, tol {tol:e})",
            (g - w).abs()
        );
    }
}

/// Tolerance of the f64 finite-difference checks of every backward: step 1e-5 gives truncation
/// error ~1e-10 and rounding error ~1e-11, so 1e-7 leaves a wide margin while catching any
/// missing or wrong term.
pub const FD_STEP: f64 = 1e-5;
pub const FD_TOL: f64 = 1e-7;
