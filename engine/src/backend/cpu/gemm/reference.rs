use super::{Call, Transpose};

pub(super) fn sgemm(call: &Call, a: &[f32], b: &[f32], c: &mut [f32]) {
    // A: (M, K) or (K, M); B: (K, N) or (N, K); C: (M, N)
    let a_at = |i: usize, p: usize| match call.ta {
        Transpose::No => a[i * call.lda + p],
        Transpose::Yes => a[p * call.lda + i],
    };
    let b_at = |p: usize, j: usize| match call.tb {
        Transpose::No => b[p * call.ldb + j],
        Transpose::Yes => b[j * call.ldb + p],
    };
    for i in 0..call.m {
        for j in 0..call.n {
            let acc: f64 = (0..call.k).map(|p| a_at(i, p) as f64 * b_at(p, j) as f64).sum();
            let out = &mut c[i * call.ldc + j];
            let prev = if call.beta == 0.0 { 0.0 } else { call.beta as f64 * *out as f64 };
            *out = (call.alpha as f64 * acc + prev) as f32;
        }
    }
}
