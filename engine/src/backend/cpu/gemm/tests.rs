use super::*;

/// splitmix64: a tiny deterministic generator, so tests need no `rand`.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| self.f32()).collect()
    }
}

/// Relative tolerance against the reference, scaled by the magnitude of each output:
/// |got - want| <= TOL * (|alpha|·Σ_p |a_ip||b_pj| + |beta|·|c_ij|). f32 accumulation over
/// K <= 80 errs by ~K·6e-8 of that sum; an indexing bug errs by O(1) of it.
const TOL: f64 = 1e-4;

const SIZES: [(usize, usize, usize); 7] =
    [(1, 1, 1), (3, 5, 7), (7, 1, 3), (1, 9, 4), (17, 33, 65), (128, 96, 80), (64, 64, 1)];
const SCALARS: [(f32, f32); 3] = [(1.0, 0.0), (0.75, -1.25), (-2.0, 0.5)];
const TRANSPOSES: [(Transpose, Transpose); 4] = [
    (Transpose::No, Transpose::No),
    (Transpose::No, Transpose::Yes),
    (Transpose::Yes, Transpose::No),
    (Transpose::Yes, Transpose::Yes),
];
const SENTINEL: f32 = 12345.0;

/// One random problem, stored with `pad` extra elements at the end of every row.
struct Case {
    ta: Transpose,
    tb: Transpose,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
    a: Vec<f32>, // A: (M, K) or (K, M), rows `lda` apart
    lda: usize,
    b: Vec<f32>, // B: (K, N) or (N, K), rows `ldb` apart
    ldb: usize,
    c: Vec<f32>, // C: (M, N), rows `ldc` apart; padding holds SENTINEL
    ldc: usize,
}

impl Case {
    #[allow(clippy::too_many_arguments, reason = "one GEMM case: cblas_sgemm's arguments")]
    fn new(
        rng: &mut Rng,
        (ta, tb): (Transpose, Transpose),
        (m, n, k): (usize, usize, usize),
        (alpha, beta): (f32, f32),
        pad: usize,
    ) -> Case {
        let call = Call { ta, tb, m, n, k, alpha, lda: 0, ldb: 0, beta, ldc: 0 };
        let ((ar, ac), (br, bc)) = (call.a_stored(), call.b_stored());
        let (lda, ldb, ldc) = (ac + pad, bc + pad, n + pad);
        let a = rng.vec(ar * lda);
        let b = rng.vec(br * ldb);
        let mut c = rng.vec(m * ldc);
        for i in 0..m {
            c[i * ldc + n..(i + 1) * ldc].fill(SENTINEL);
        }
        Case { ta, tb, m, n, k, alpha, beta, a, lda, b, ldb, c, ldc }
    }

    fn run(&self, p: Provider) -> Vec<f32> {
        let mut c = self.c.clone();
        p.sgemm(
            self.ta, self.tb, self.m, self.n, self.k, self.alpha, &self.a, self.lda, &self.b,
            self.ldb, self.beta, &mut c, self.ldc,
        )
        .unwrap();
        c
    }

    /// Σ_p |a_ip||b_pj| scaled as in TOL's doc, for output (i, j).
    fn magnitude(&self, i: usize, j: usize) -> f64 {
        let a_at = |p: usize| match self.ta {
            Transpose::No => self.a[i * self.lda + p],
            Transpose::Yes => self.a[p * self.lda + i],
        };
        let b_at = |p: usize| match self.tb {
            Transpose::No => self.b[p * self.ldb + j],
            Transpose::Yes => self.b[j * self.ldb + p],
        };
        let ab: f64 = (0..self.k).map(|p| (a_at(p) as f64 * b_at(p) as f64).abs()).sum();
        self.alpha.abs() as f64 * ab
            + self.beta.abs() as f64 * self.c[i * self.ldc + j].abs() as f64
    }

    fn check(&self, p: Provider) {
        let got = self.run(p);
        let want = self.run(Provider::Reference);
        let what = format!(
            "{p}: {:?}{:?} m={} n={} k={} alpha={} beta={} ld=({}, {}, {})",
            self.ta,
            self.tb,
            self.m,
            self.n,
            self.k,
            self.alpha,
            self.beta,
            self.lda,
            self.ldb,
            self.ldc
        );
        for i in 0..self.m {
            for j in 0..self.ldc {
                let (g, w) = (got[i * self.ldc + j], want[i * self.ldc + j]);
                if j >= self.n {
                    assert_eq!(g, SENTINEL, "{what}: wrote into the row padding at ({i}, {j})");
                    continue;
                }
                let tol = TOL * self.magnitude(i, j) + f64::from(f32::MIN_POSITIVE);
                let err = (g as f64 - w as f64).abs();
                assert!(err <= tol, "{what}: C[{i},{j}] = {g}, reference {w}, |err| {err} > {tol}");
            }
        }
    }
}

fn check_provider(p: Provider) {
    let mut rng = Rng(0x5EED);
    let mut cases = 0;
    for t in TRANSPOSES {
        for size in SIZES {
            for scalars in SCALARS {
                for pad in [0, 3] {
                    Case::new(&mut rng, t, size, scalars, pad).check(p);
                    cases += 1;
                }
            }
        }
    }
    eprintln!("{p}: {cases} cases match the reference");
}

/// MKL when it loads; otherwise a printed note and `None` (the suite must pass without it).
fn mkl_or_skip() -> Option<Provider> {
    match Provider::load(ProviderKind::Mkl) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("note: skipping the MKL test, MKL is not available here:\n{e}");
            None
        }
    }
}

#[test]
fn gemm_crate_matches_reference() {
    check_provider(Provider::Gemm);
}

#[test]
fn mkl_matches_reference() {
    if let Some(p) = mkl_or_skip() {
        check_provider(p);
    }
}

#[test]
fn active_provider_matches_reference() {
    let p = provider().expect("the active GEMM provider should load");
    eprintln!("active GEMM provider: {p}");
    let mut rng = Rng(7);
    let case = Case::new(&mut rng, TRANSPOSES[3], (17, 33, 65), SCALARS[1], 2);
    let mut c = case.c.clone();
    sgemm(
        case.ta, case.tb, case.m, case.n, case.k, case.alpha, &case.a, case.lda, &case.b, case.ldb,
        case.beta, &mut c, case.ldc,
    )
    .unwrap();
    case.check(p);
}

fn all_providers() -> Vec<Provider> {
    let mut ps = vec![Provider::Gemm, Provider::Reference];
    ps.extend(mkl_or_skip());
    ps
}

#[test]
fn beta_zero_overwrites_nan_and_k_zero_scales() {
    for p in all_providers() {
        let (m, n, k) = (5, 6, 4);
        let mut rng = Rng(11);
        let (a, b) = (rng.vec(m * k), rng.vec(k * n));
        let mut c = vec![f32::NAN; m * n];
        p.sgemm(Transpose::No, Transpose::No, m, n, k, 1.5, &a, k, &b, n, 0.0, &mut c, n).unwrap();
        assert!(c.iter().all(|x| x.is_finite()), "{p}: beta = 0 must not read C");

        let c0 = rng.vec(m * n);
        let mut c = c0.clone();
        p.sgemm(Transpose::No, Transpose::No, m, n, 0, 1.0, &[], 1, &[], n, -0.5, &mut c, n)
            .unwrap();
        assert!(c.iter().zip(&c0).all(|(x, y)| *x == -0.5 * y), "{p}: k = 0 is C = beta·C");

        let mut c = c0.clone();
        p.sgemm(Transpose::No, Transpose::No, 0, n, k, 1.0, &[], k, &b, n, 2.0, &mut c, n).unwrap();
        assert_eq!(c, c0, "{p}: m = 0 leaves C alone");
    }
}

/// Batched results against one reference call per matrix, with gaps between matrices,
/// a broadcast operand (stride 0) and interleaved C matrices.
#[test]
fn batched_matches_reference_per_matrix() {
    for p in all_providers() {
        for (ta, tb) in TRANSPOSES {
            let (m, n, k, batch) = (9, 13, 11, 4);
            let call = Call { ta, tb, m, n, k, alpha: 0.5, lda: 0, ldb: 0, beta: -1.5, ldc: 0 };
            let ((ar, ac), (br, bc)) = (call.a_stored(), call.b_stored());
            let (lda, ldb) = (ac + 1, bc + 2);
            // (stride_a, stride_b, stride_c, ldc): gaps; broadcast B; interleaved C.
            let layouts = [
                (ar * lda + 5, br * ldb + 3, m * (n + 1) + 7, n + 1),
                (ar * lda, 0, m * n, n),
                (ar * lda, br * ldb, n, batch * n),
            ];
            for (sa, sb, sc, ldc) in layouts {
                let mut rng = Rng(sa as u64 * 31 + sb as u64);
                let a = rng.vec((batch - 1) * sa + ar * lda);
                let b = rng.vec((batch - 1) * sb + br * ldb);
                let c_len = ((batch - 1) * sc + (m - 1) * ldc + n).max(m * ldc);
                let c0 = rng.vec(c_len);
                let mut got = c0.clone();
                p.sgemm_batched(
                    ta, tb, m, n, k, 0.5, &a, lda, &b, ldb, -1.5, &mut got, ldc, batch, sa, sb, sc,
                )
                .unwrap();
                let mut want = c0.clone();
                for i in 0..batch {
                    sgemm_reference(
                        ta,
                        tb,
                        m,
                        n,
                        k,
                        0.5,
                        &a[i * sa..],
                        lda,
                        &b[i * sb..],
                        ldb,
                        -1.5,
                        &mut want[i * sc..],
                        ldc,
                    )
                    .unwrap();
                }
                for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
                    // Each output sums K=11 products of |x| < 1 plus 1.5·|c|: bound by 13.
                    let tol = TOL * 13.0;
                    assert!(
                        ((g - w) as f64).abs() <= tol,
                        "{p}: {ta:?}{tb:?} strides ({sa}, {sb}, {sc}) ldc {ldc}: \
                         c[{idx}] = {g}, reference {w}"
                    );
                }
            }
        }
    }
}

/// The single-call MKL batch path (not the per-matrix loop) is taken and is right,
/// broadcast A (stride 0) included.
#[test]
fn mkl_batch_strided_is_used_and_matches() {
    let Some(Provider::Mkl(lib)) = mkl_or_skip() else {
        return;
    };
    let (m, n, k, batch) = (8, 6, 5, 3);
    let call = Call {
        ta: Transpose::No,
        tb: Transpose::Yes,
        m,
        n,
        k,
        alpha: 1.25,
        lda: k,
        ldb: k,
        beta: 0.5,
        ldc: n,
    };
    let mut rng = Rng(99);
    let a = rng.vec(m * k); // A: (M, K), shared by the batch
    let b = rng.vec(batch * n * k); // B: (batch, N, K)
    let c0 = rng.vec(batch * m * n); // C: (batch, M, N)
    let mut got = c0.clone();
    let strides = [0, n * k, m * n];
    assert!(lib.sgemm_batch_strided(&call, &a, &b, &mut got, batch, strides));
    let mut want = c0;
    for i in 0..batch {
        sgemm_reference(
            call.ta,
            call.tb,
            m,
            n,
            k,
            1.25,
            &a,
            k,
            &b[i * n * k..],
            k,
            0.5,
            &mut want[i * m * n..],
            n,
        )
        .unwrap();
    }
    for (g, w) in got.iter().zip(&want) {
        assert!(((g - w) as f64).abs() <= TOL * 8.0, "{g} vs reference {w}");
    }
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let (a, b) = (vec![1.0f32; 12], vec![1.0f32; 12]);
    let mut c = vec![0.0f32; 9];
    for p in all_providers() {
        // A: (3, 4) needs lda >= 4.
        let e = p.sgemm(Transpose::No, Transpose::No, 3, 3, 4, 1.0, &a, 3, &b, 3, 0.0, &mut c, 3);
        assert!(matches!(e, Err(GemmError::LeadingDim { operand: "A", .. })), "{e:?}");
        // C: (3, 4) needs 12 elements, has 9.
        let e = p.sgemm(Transpose::No, Transpose::No, 3, 4, 3, 1.0, &a, 3, &b, 4, 0.0, &mut c, 4);
        assert!(matches!(e, Err(GemmError::TooShort { operand: "C", need: 12, .. })), "{e:?}");
        // Bᵀ stored (N, K) = (4, 3) with ldb 3 fits 12; a batch of 2, 12 apart, does not.
        let e = p.sgemm_batched(
            Transpose::No,
            Transpose::Yes,
            3,
            4,
            3,
            1.0,
            &a,
            3,
            &b,
            3,
            0.0,
            &mut c,
            4,
            2,
            0,
            12,
            0,
        );
        assert!(matches!(e, Err(GemmError::TooShort { operand: "B", need: 24, .. })), "{e:?}");
        assert!(e.unwrap_err().to_string().contains("2 matrices 12 apart"));
    }
}

#[test]
fn provider_selection() {
    assert_eq!(select(Some("gemm")).unwrap().kind(), ProviderKind::Gemm);
    assert_eq!(select(Some(" Reference ")).unwrap().kind(), ProviderKind::Reference);
    let e = select(Some("openblas")).unwrap_err();
    assert!(e.to_string().contains("use mkl, gemm or reference"), "{e}");
    match select(Some("mkl")) {
        Ok(p) => assert_eq!(p.kind(), ProviderKind::Mkl),
        Err(e) => assert!(matches!(e, GemmError::MklUnavailable { .. }), "{e}"),
    }
}
