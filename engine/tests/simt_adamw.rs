//! engine/kernels/adamw.cu against the CPU optimizer (engine/src/optim/adamw.rs): the global
//! gradient norm, the finite flag and the clip coefficient, then several fused AdamW steps over
//! one flat buffer with decay and no-decay segments and the f16/bf16 compute copy, and a step
//! with an inf gradient that must leave everything untouched.
//!
//! Tolerances: the norm 1e-6 relative (f32 block partials added in f64, against the CPU's
//! f32 chunks added in f64); parameters and the mirror after 3 steps 1e-6 of each value (the
//! GPU contracts β·m + (1−β)·g into FMAs, the CPU does not: a few ulp per step), the mirror
//! plus one unit roundoff of its dtype; parameters with a floor of 1e-9 for one that crosses
//! zero, where what differs is the rounding of the updates (~lr = 1e-3, ulp ~1e-10). Measured
//! worst on the SIMT harness: 0.15 of that bound.

mod kernel_harness;

use kernel_harness::*;
use ortbench_engine::exec::gpu::launch::adamw as launch;
use ortbench_engine::exec::gpu::launch::PerStep;
use ortbench_engine::exec::gpu::StepBlock;
use ortbench_engine::optim::adamw::{AdamW, AdamWConfig, ParamMirror, Segment};
use ortbench_engine::DType;
use ortbench_simt::Buf;

const N: usize = 3 * 1000 + 29;
/// Fewer norm partials than the session's [`launch::sumsq_blocks`] gives for N (12): each
/// block's grid-stride loop turns twice (7 blocks of 256 threads over 3029 elements).
const PARTS: u32 = 7;

fn segments() -> Vec<Segment> {
    // Decaying matrices and non-decaying biases/norms, of uneven lengths, tiling 0..N.
    let cuts = [0usize, 700, 713, 2048, 2111, N];
    cuts.windows(2)
        .enumerate()
        .map(|(i, w)| Segment { start: w[0], len: w[1] - w[0], decay: i % 2 == 0 })
        .collect()
}

/// Launches the three kernels of one step, the per-step scalars given as values or (`block`)
/// in a step block as the session passes them; returns the stats buffer (norm, finite, coef).
#[allow(clippy::too_many_arguments)]
fn gpu_step(
    dev: &Dev,
    cfg: &AdamWConfig,
    t: u64,
    lr: f32,
    inv_scale: f32,
    p: &mut Buf,
    g: &mut Buf,
    m: &mut Buf,
    v: &mut Buf,
    mirror: Option<&mut Buf>,
    (dt, block): (D, bool),
) -> Vec<f32> {
    let segs = segments();
    let mut starts = Buf::from_i64(&segs.iter().map(|s| s.start as i64).collect::<Vec<_>>());
    let mut decay = Buf::from_i32(&segs.iter().map(|s| s.decay as i32).collect::<Vec<_>>());
    let mut partials = Buf::poisoned(PARTS as usize, D::F32);
    let mut stats = Buf::poisoned(3, D::F32);
    let geo = dev.geometry();
    let sc = cfg.step_scalars(t, lr);
    let (step_size, inv_bc2_sqrt, decay_mul) = (sc.step_size, sc.inv_bc2_sqrt, sc.decay_mul);
    let sb = StepBlock { inv_scale, step_size, inv_bc2_sqrt, decay_mul, ..StepBlock::default() };
    let (mut sb1, mut sb2) = (step_block(&sb), step_block(&sb));
    let (partials_, grads) = (&mut partials, &mut *g);
    let inv = if block { PerStep::Block(&mut sb1) } else { PerStep::Value(inv_scale) };
    let l =
        launch::GradSumsqPartial { partials: partials_, parts: PARTS, grads, n: N, inv_scale: inv };
    dev.run(l.launch(geo)).unwrap();
    let (stats_, max_norm) = (&mut stats, cfg.max_grad_norm);
    let l =
        launch::GradStatsFinish { stats: stats_, partials: &mut partials, parts: PARTS, max_norm };
    dev.run(l.launch(geo)).unwrap();
    let l = launch::AdamwStep {
        dtype: dtype(dt),
        params: p,
        grads: g,
        m,
        v,
        mirror,
        n: N,
        seg_start: &mut starts,
        seg_decay: &mut decay,
        nseg: segs.len(),
        stats: &mut stats,
        beta1: cfg.beta1,
        beta2: cfg.beta2,
        eps: cfg.eps,
        step: if block { PerStep::Block(&mut sb2) } else { PerStep::Value((inv_scale, sc)) },
    };
    dev.run(l.launch(geo)).unwrap();
    stats.to_f32()
}

#[test]
fn three_steps_match_the_cpu_optimizer_with_clipping_decay_and_the_mirror() {
    for dt in FLOATS {
        for max_grad_norm in [0.0f32, 1.0, 1e3] {
            let cfg =
                AdamWConfig { lr: 1e-3, weight_decay: 0.01, max_grad_norm, ..Default::default() };
            let mut rng = Rng::new(5);
            let p0 = rng.vec(N, -1.0, 1.0, D::F32);
            let grads: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(N, -1.0, 1.0, D::F32)).collect();
            let inv_scale = 1.0 / 1024.0;
            let scaled: Vec<Vec<f32>> =
                grads.iter().map(|g| g.iter().map(|x| x * 1024.0).collect()).collect();
            // CPU: the reference optimizer.
            let mut cpu = AdamW::new(cfg, segments(), N);
            let mut cp = p0.clone();
            let mut cmirror = vec![0f32; N];
            let mut norms = Vec::new();
            for g in &scaled {
                let mirror = match dt {
                    D::F16 => ParamMirror::Rounded(DType::F16, &mut cmirror),
                    D::BF16 => ParamMirror::Rounded(DType::BF16, &mut cmirror),
                    _ => ParamMirror::None,
                };
                let st = cpu.step(&mut cp, g, inv_scale, cfg.lr, mirror);
                assert!(st.finite);
                norms.push(st.norm);
            }
            // The flat buffers as the executor has them (16-byte aligned: the kernel's 16-byte
            // packs, N mod 4 = 1 element after them, segments starting mid-pack) and with the
            // parameters one element off (one element at a time); and the per-step scalars read
            // from a step block.
            let first = devices()[0];
            let cases = devices().into_iter().map(|d| (d, false, false));
            for (dev, misaligned, block) in
                cases.chain([(first, true, false), (first, false, true)])
            {
                let p = Buf::from_f32(&p0, D::F32);
                let p = if misaligned { p.misaligned() } else { p };
                let (mut p, mut m, mut v) =
                    (p, Buf::from_f32(&vec![0.0; N], D::F32), Buf::from_f32(&vec![0.0; N], D::F32));
                let mut mirror = Buf::poisoned(N, dt);
                for (t, g) in scaled.iter().enumerate() {
                    let mut gb = Buf::from_f32(g, D::F32);
                    let mir = if dt == D::F32 { None } else { Some(&mut mirror) };
                    let stats = gpu_step(
                        &dev,
                        &cfg,
                        t as u64 + 1,
                        cfg.lr,
                        inv_scale,
                        &mut p,
                        &mut gb,
                        &mut m,
                        &mut v,
                        mir,
                        (dt, block),
                    );
                    let what = format!(
                        "adamw {dt:?} clip {max_grad_norm} step {t} on {dev}{}{}",
                        if misaligned { " (params misaligned)" } else { "" },
                        if block { " (scalars from a step block)" } else { "" }
                    );
                    assert!(
                        (stats[0] - norms[t]).abs() <= 1e-6 * norms[t],
                        "{what}: norm {} vs CPU {}",
                        stats[0],
                        norms[t]
                    );
                    assert_eq!(stats[1], 1.0, "{what}: finite flag");
                    assert_eq!(
                        stats[2].to_bits(),
                        cpu.clip_coef(stats[0]).to_bits(),
                        "{what}: clip coefficient"
                    );
                }
                let what = format!(
                    "adamw {dt:?} clip {max_grad_norm} on {dev}{}",
                    if misaligned { " (params misaligned)" } else { "" }
                );
                check(
                    &format!("{what} params"),
                    &p.to_f32(),
                    &cp,
                    D::F32,
                    Tol { rel: 1e-6, abs: 1e-9, of_largest: 0.0 },
                );
                if dt != D::F32 {
                    check(&format!("{what} mirror"), &mirror.to_f32(), &cmirror, dt, tol(dt, 1e-6));
                }
            }
        }
    }
}

#[test]
fn an_inf_gradient_skips_the_step_and_touches_nothing() {
    let cfg = AdamWConfig { lr: 1e-3, weight_decay: 0.01, ..Default::default() };
    let mut rng = Rng::new(9);
    let p0 = rng.vec(N, -1.0, 1.0, D::F32);
    let mut g = rng.vec(N, -1.0, 1.0, D::F32);
    g[2500] = f32::INFINITY;
    let m0 = rng.vec(N, -0.1, 0.1, D::F32);
    let v0: Vec<f32> = rng.vec(N, 0.0, 0.1, D::F32).iter().map(|x| x.abs()).collect();
    for dt in [D::F32, D::BF16] {
        for dev in devices() {
            let (mut p, mut m, mut v, mut gb) = (
                Buf::from_f32(&p0, D::F32),
                Buf::from_f32(&m0, D::F32),
                Buf::from_f32(&v0, D::F32),
                Buf::from_f32(&g, D::F32),
            );
            let mut mirror = Buf::poisoned(N, dt);
            let mir = if dt == D::F32 { None } else { Some(&mut mirror) };
            let stats = gpu_step(
                &dev,
                &cfg,
                1,
                cfg.lr,
                1.0,
                &mut p,
                &mut gb,
                &mut m,
                &mut v,
                mir,
                (dt, false),
            );
            assert_eq!(stats[1], 0.0, "finite flag on {dev}");
            assert_eq!(p.to_f32(), p0, "params on {dev}");
            assert_eq!(m.to_f32(), m0, "exp_avg on {dev}");
            assert_eq!(v.to_f32(), v0, "exp_avg_sq on {dev}");
            if dt != D::F32 {
                assert!(
                    mirror.to_f32().iter().all(|x| x.is_nan()),
                    "the mirror was written on {dev}"
                );
            }
        }
    }
}
