//! Storage dtypes of the engine. Compute is always f32 on the CPU backend; f16/bf16 are storage
//! formats so every mixed-precision path can be tested without a GPU.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// `x` rounded to this dtype and widened back: the value an f16/bf16 tensor would hold
    /// (round to nearest even; overflow to ±inf as the hardware conversion does).
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            DType::F32 => x,
            DType::F16 => half::f16::from_f32(x).to_f32(),
            DType::BF16 => half::bf16::from_f32(x).to_f32(),
        }
    }

    /// [`DType::round`] over a slice, in place. The CPU backend keeps f16/bf16 tensors in f32
    /// slots holding exactly representable values; this is the store half of that storage.
    // xs: (n,)
    pub fn round_slice(self, xs: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        // Through a small stack buffer: half's slice conversions use the F16C / AVX-512
        // conversion instructions when the CPU has them.
        const CHUNK: usize = 256;
        match self {
            DType::F32 => {}
            DType::F16 => {
                let mut buf = [half::f16::ZERO; CHUNK];
                for c in xs.chunks_mut(CHUNK) {
                    let b = &mut buf[..c.len()];
                    b.convert_from_f32_slice(c);
                    b.convert_to_f32_slice(c);
                }
            }
            DType::BF16 => {
                let mut buf = [half::bf16::ZERO; CHUNK];
                for c in xs.chunks_mut(CHUNK) {
                    let b = &mut buf[..c.len()];
                    b.convert_from_f32_slice(c);
                    b.convert_to_f32_slice(c);
                }
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "fp32",
            DType::F16 => "fp16",
            DType::BF16 => "bf16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown precision '{0}': expected one of fp32, fp16, bf16")]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "fp32" | "f32" | "float32" => Ok(DType::F32),
            "fp16" | "f16" | "float16" | "half" => Ok(DType::F16),
            "bf16" | "bfloat16" => Ok(DType::BF16),
            _ => Err(UnknownDType(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_round_trip() {
        for d in [DType::F32, DType::F16, DType::BF16] {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::BF16.size(), 2);
        assert!("int8".parse::<DType>().is_err());
    }

    /// The slice rounding equals the scalar one (random values, never zero), is idempotent,
    /// and keeps each dtype's precision and range: f16 overflows past 65504, bf16 does not.
    #[test]
    fn rounding_matches_the_scalar_conversion() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let xs: Vec<f32> = (0..1000)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 + 1e-3;
                u * 10f32.powi(i % 12 - 6) * if i % 2 == 0 { 1.0 } else { -1.0 }
            })
            .collect();
        for d in [DType::F16, DType::BF16] {
            let mut r = xs.clone();
            d.round_slice(&mut r);
            for (a, b) in xs.iter().zip(&r) {
                assert_eq!(d.round(*a).to_bits(), b.to_bits());
                assert_eq!(d.round(*b).to_bits(), b.to_bits());
                if b.is_finite() && a.abs() > 1e-4 {
                    let eps = if d == DType::F16 { 2f32.powi(-11) } else { 2f32.powi(-8) };
                    assert!(((a - b) / a).abs() <= eps, "{d}: {a} -> {b}");
                }
            }
        }
        assert_eq!(DType::F16.round(70000.0), f32::INFINITY);
        assert_eq!(DType::BF16.round(70000.0), 70144.0);
        assert_eq!(DType::F32.round(0.1), 0.1);
    }
}
