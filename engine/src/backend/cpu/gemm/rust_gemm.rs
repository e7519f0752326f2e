use super::{num_threads, Call, Transpose};

pub(super) fn sgemm(call: &Call, a: &[f32], b: &[f32], c: &mut [f32]) {
    // Row-major with transposes expressed as (row stride, column stride) pairs.
    let (a_rs, a_cs) = match call.ta {
        Transpose::No => (call.lda as isize, 1),  // A: (M, K)
        Transpose::Yes => (1, call.lda as isize), // A: (K, M)
    };
    let (b_rs, b_cs) = match call.tb {
        Transpose::No => (call.ldb as isize, 1),  // B: (K, N)
        Transpose::Yes => (1, call.ldb as isize), // B: (N, K)
    };
    let threads = num_threads();
    let parallelism =
        if threads <= 1 { gemm::Parallelism::None } else { gemm::Parallelism::Rayon(threads) };
    // SAFETY: `Call::validate` checked that every element the kernel reads (op(A): M x K,
    // op(B): K x N at the strides above) and writes (C: M x N, rows `ldc` apart) lies inside
    // `a`, `b` and `c`; `c` is a unique borrow, so it aliases neither input. The crate's
    // convention is `dst = alpha·dst + beta·lhs·rhs`, hence our beta/alpha in that order;
    // with `read_dst = false` (our beta = 0) C is not read.
    unsafe {
        gemm::gemm(
            call.m,
            call.n,
            call.k,
            c.as_mut_ptr(),
            1,
            call.ldc as isize,
            call.beta != 0.0,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            call.beta,
            call.alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
}
