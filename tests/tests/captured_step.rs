//! A GPU session's captured step (`engine/src/exec/gpu/session.rs`: forward, backward and the
//! optimizer recorded once as a graph, then replayed) against the same session launching every
//! kernel directly — bit for bit — and against the CPU session; and what a replayed step asks of
//! the host: one pinned upload and one replay.
//!
//! What varies from step to step is what a capture would freeze if it were passed by value:
//! the dropout seed (tiny-gpt2 has dropout on), the learning rate (a new one each step), the
//! optimizer's bias corrections (the step count) and, in fp16, the loss scale (a scaler that
//! doubles every other step). Each must be read from the step block for the replays to match.
//!
//! On the SIMT device by default; on the GPU under `ORTBENCH_KERNEL_DEVICE=cuda`
//! (scripts/gpu-validate), where the capture is CUDA's stream capture.

use ortbench_engine::backend::gpu::GpuDevice;
use ortbench_engine::backend::simt_device::SimtGpu;
use ortbench_engine::exec::gpu::session::{GpuSession, Launching};
use ortbench_engine::optim::{AdamWConfig, LossScaler, Segment};
use ortbench_engine::session::{ExecutorKind, StepStats, TrainSession};
use ortbench_engine::DType;
use ortbench_models::graph::{build_training_graph, EngineModel, Feed, GraphOptions};
use ortbench_models::spec::builtin_config;
use ortbench_models::{DataSource, Weights};
use ortbench_simt::Order;

const STEPS: usize = 5;

/// A scaler that grows every other clean step: the scale changes within the run.
fn scaler() -> LossScaler {
    let mut s = LossScaler::resumed(1024.0, 0);
    s.growth_interval = 2;
    s
}

fn lr(step: usize) -> f32 {
    1e-3 * (1.0 + step as f32) / STEPS as f32
}

struct Case {
    model: EngineModel,
    params: Vec<f32>,
    segs: Vec<Segment>,
    opt: AdamWConfig,
    feeds: Vec<Feed>,
}

fn case(dtype: DType) -> Case {
    let cfg = builtin_config("tiny-gpt2").unwrap();
    let (b, t) = (2, 24);
    let model = build_training_graph(&cfg, &GraphOptions::new(b, t).with_dtype(dtype)).unwrap();
    let params = model.flatten(&Weights::init(&cfg, 5)).unwrap();
    let n = params.len();
    let segs = vec![
        Segment { start: 0, len: n / 2, decay: true },
        Segment { start: n / 2, len: n - n / 2, decay: false },
    ];
    let opt =
        AdamWConfig { lr: 1e-3, weight_decay: 0.01, max_grad_norm: 1.0, ..AdamWConfig::default() };
    let data = DataSource::synthetic(&cfg, b, t, 23).unwrap();
    let feeds = (0..STEPS).map(|i| model.feed(&data.batch(i)).unwrap()).collect();
    Case { model, params, segs, opt, feeds }
}

/// What a run of the session gives: per step its stats and how it was launched (after it),
/// and the parameters at the end.
struct Run {
    stats: Vec<StepStats>,
    launching: Vec<Launching>,
    params: Vec<f32>,
}

fn run<D: GpuDevice>(c: &Case, dev: D, capture: bool, after_step: &dyn Fn(usize, &D)) -> Run {
    let dtype = c.model.graph.dtype();
    let g = c.model.graph.clone();
    let mut s = GpuSession::new(g, dev, &c.params, c.segs.clone(), c.opt, dtype).unwrap();
    if dtype == DType::F16 {
        s.set_loss_scaler(Some(scaler()));
    }
    if !capture {
        s.capture_off("the test's reference");
    }
    let (mut stats, mut launching) = (Vec::new(), Vec::new());
    for (i, f) in c.feeds.iter().enumerate() {
        stats.push(s.step(&f.inputs(), lr(i), 100 + i as u64).unwrap());
        launching.push(s.launching());
        after_step(i, s.executor().device());
    }
    Run { stats, launching, params: s.params().unwrap() }
}

fn cpu(c: &Case) -> Vec<StepStats> {
    let g = c.model.graph.clone();
    let dtype = g.dtype();
    let mut s = TrainSession::with_executor(
        g,
        c.params.clone(),
        c.segs.clone(),
        c.opt,
        dtype,
        ExecutorKind::Planned,
    )
    .unwrap();
    if dtype == DType::F16 {
        s.set_loss_scaler(Some(scaler()));
    }
    c.feeds
        .iter()
        .enumerate()
        .map(|(i, f)| s.step(&f.inputs(), lr(i), 100 + i as u64).unwrap())
        .collect()
}

/// A check given the device's label and a way to open a fresh one.
type PerDevice<'a> = dyn Fn(&str, &mut dyn FnMut() -> Box<dyn Session>) + 'a;

/// Runs `f` with fresh devices: the SIMT device, or the GPU under ORTBENCH_KERNEL_DEVICE=cuda.
fn on_device(f: &PerDevice<'_>) {
    match std::env::var("ORTBENCH_KERNEL_DEVICE").as_deref() {
        Ok("cuda") => {
            use ortbench_engine::backend::cuda::gpu::CudaGpu;
            f("cuda", &mut || Box::new(CudaGpu::open(0).unwrap()))
        }
        _ => {
            f("simt warp 32", &mut || Box::new(SimtGpu::new(32, Order::Forward).with_max_blocks(6)))
        }
    }
}

/// The runs a test makes on a device, object-safe.
trait Session {
    fn run(self: Box<Self>, c: &Case, capture: bool) -> Run;
}
impl<D: GpuDevice + 'static> Session for D {
    fn run(self: Box<Self>, c: &Case, capture: bool) -> Run {
        run(c, *self, capture, &|_, _| {})
    }
}

fn captured_matches_direct(dtype: DType) {
    let c = case(dtype);
    let want = cpu(&c);
    on_device(&|dev, make| {
        let label = format!("{dtype:?} on {dev}");
        let direct = make().run(&c, false);
        let captured = make().run(&c, true);
        // The first step runs directly, the second is captured and replayed, and so on.
        assert_eq!(
            captured.launching[0],
            Launching::Direct("the next step is captured".into()),
            "{label}"
        );
        assert!(captured.launching[1..].iter().all(|l| *l == Launching::Captured), "{label}");
        let off = Launching::Direct("the test's reference".into());
        assert!(direct.launching.iter().all(|l| *l == off), "{label}");
        for (i, (a, d)) in captured.stats.iter().zip(&direct.stats).enumerate() {
            assert_eq!(
                (a.loss.to_bits(), a.grad_norm.to_bits(), a.loss_scale, a.skipped),
                (d.loss.to_bits(), d.grad_norm.to_bits(), d.loss_scale, d.skipped),
                "{label}: step {i}: captured {a:?}, direct {d:?}"
            );
        }
        let differ = captured.params.iter().zip(&direct.params).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{label}: parameters differ after {STEPS} steps");
        // And both are the CPU session's step (the gpu_executor tests' tolerance).
        for (i, (a, w)) in captured.stats.iter().zip(&want).enumerate() {
            assert!(
                ((a.loss - w.loss) / w.loss).abs() <= 1e-3 && a.loss_scale == w.loss_scale,
                "{label}: step {i}: {a:?} vs the cpu's {w:?}"
            );
        }
        println!(
            "{label}: {STEPS} steps, captured = direct bit for bit; losses {:?}; loss scales {:?}",
            captured.stats.iter().map(|s| s.loss).collect::<Vec<_>>(),
            captured.stats.iter().map(|s| s.loss_scale).collect::<Vec<_>>()
        );
    });
}

#[test]
fn captured_fp32_steps_equal_direct_launches_bit_for_bit() {
    captured_matches_direct(DType::F32);
}

#[test]
fn captured_fp16_steps_with_a_changing_loss_scale_equal_direct_launches_bit_for_bit() {
    captured_matches_direct(DType::F16);
}

/// After the capture a step asks one pinned upload (the step block and the inputs) and one
/// replay of the host, where a direct step issues every launch and GEMM.
#[test]
fn a_replayed_step_is_one_upload_and_one_replay() {
    let c = case(DType::F32);
    let seen = std::cell::RefCell::new(Vec::new());
    let dev = SimtGpu::new(32, Order::Forward).with_max_blocks(6).recording();
    run(&c, dev, true, &|_, d: &SimtGpu| seen.borrow_mut().push(d.take_trace()));
    let seen = seen.into_inner();
    let direct = &seen[0];
    let launches = direct.iter().filter(|l| !l.starts_with("upload_pinned")).count();
    assert!(direct[0].starts_with("upload_pinned") && launches > 100, "{direct:?}");
    for (i, t) in seen.iter().enumerate().skip(2) {
        assert_eq!(t.len(), 2, "step {i}: {t:?}");
        assert!(t[0].starts_with("upload_pinned ") && t[1].starts_with("replay "), "{t:?}");
        // The replay holds what the direct step launched.
        assert_eq!(t[1], format!("replay {launches}"), "step {i}");
    }
    println!("a direct step: {launches} launches and GEMMs; a replayed one: {:?}", seen[2]);
}

/// A rank of several launches directly (its collectives run between the phases from the host),
/// and says so.
#[test]
fn a_data_parallel_rank_launches_directly_and_says_why() {
    use ortbench_engine::exec::gpu::session::RankLayout;
    use ortbench_engine::parallel::Strategy;
    let c = case(DType::F32);
    let dev = SimtGpu::new(32, Order::Forward);
    let layout = RankLayout { rank: 0, world: 2, strategy: Strategy::Ddp };
    let g = c.model.graph.clone();
    let s =
        GpuSession::ranked(g, dev, &c.params, c.segs.clone(), c.opt, DType::F32, layout).unwrap();
    let why = "several ranks run their collectives between the phases from the host";
    assert_eq!(s.launching(), Launching::Direct(why.into()));
    assert_eq!(s.launching().to_string(), format!("direct launches: {why}"));
}
