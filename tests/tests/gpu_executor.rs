//! The GPU executor (`engine/src/exec/gpu`) against the CPU engine on the real model graphs:
//! tiny-bert (MLM) and tiny-gpt2 with dropout ON (the counter-based masks must agree element for
//! element), one forward + backward compared loss and gradient by gradient, then a few training
//! steps of the GPU session (fused AdamW in three launches, clipping) against the CPU session.
//!
//! Where it runs: by default on the host SIMT harness (`engine/kernels/simt`: the same kernel
//! sources compiled for the CPU, a block's threads as host threads with real barriers) with a
//! host GEMM — so CI, which has no GPU, executes the whole device path: planning for the GPU
//! kernels, addresses, strides, launch geometry, workspaces, the status block. With
//! `ORTBENCH_KERNEL_DEVICE=cuda` (scripts/gpu-validate) on the GPU, with cuBLASLt.
//!
//! Tolerances (fp32 both sides; the GPU kernels sum in other orders — attention's online
//! softmax by tiles, column sums by chunks of rows, the cross-entropy's block reductions):
//! loss within 1e-5 relative; each parameter's gradient max|Δ| ≤ 1e-5·max|g_cpu| + 1e-7·G, G the
//! largest |g| over all parameters (the floor covers gradients that are zero in exact
//! arithmetic, e.g. attention key biases, where both sides return rounding noise). Training:
//! per-step loss within 1e-4 relative over 3 steps, and the parameters after them within
//! 1e-5 absolute (lr 1e-3: an update moves a weight by ~lr, so a wrong update is ~100× that).

use ortbench_engine::backend::gpu::{Epilogue, GemmPtrs, GemmShape, GpuDevice, GpuError, KernelArg};
use ortbench_engine::backend::cpu::planned::PlannedExecutor;
use ortbench_engine::exec::gpu::session::GpuSession;
use ortbench_engine::exec::gpu::GpuExecutor;
use ortbench_engine::optim::{AdamWConfig, Segment};
use ortbench_engine::session::{ExecutorKind, TrainSession};
use ortbench_engine::DType;
use ortbench_models::graph::{build_training_graph, GraphOptions};
use ortbench_models::spec::builtin_config;
use ortbench_models::{DataSource, Weights};
use ortbench_simt::Order;

/// The host SIMT harness as a GPU: host memory, kernels on host threads, a plain-loop GEMM.
struct Simt {
    warp: u32,
    order: Order,
}

/// Zeroed host memory, 16-byte aligned (as device allocations are at least).
struct HostBuf(Box<[u128]>);

impl GpuDevice for Simt {
    type Buffer = HostBuf;
    fn describe(&self) -> String {
        format!("simt warp {} {:?}", self.warp, self.order)
    }
    fn warp_size(&self) -> u32 {
        self.warp
    }
    fn max_blocks(&self) -> u32 {
        // Few blocks: the harness runs them one after another; grid-stride loops cover the rest.
        6
    }
    fn max_shared_bytes(&self) -> u32 {
        // Small, so attention gets tiles smaller than the sequence (several tiles, a partial one).
        16 * 1024
    }
    fn alloc_zeroed(&self, bytes: usize) -> Result<HostBuf, GpuError> {
        Ok(HostBuf(vec![0u128; bytes.div_ceil(16).max(1)].into_boxed_slice()))
    }
    fn address(&self, b: &HostBuf) -> u64 {
        b.0.as_ptr() as u64
    }
    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len());
        Ok(())
    }
    unsafe fn download(&self, src: u64, dst: &mut [u8]) -> Result<(), GpuError> {
        std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len());
        Ok(())
    }
    unsafe fn launch(&self, name: &str, grid: u32, block: u32, smem: u32, args: &[KernelArg]) -> Result<(), GpuError> {
        let raw: Vec<ortbench_simt::Arg> = args
            .iter()
            .map(|a| match *a {
                KernelArg::Ptr(p) => ortbench_simt::Arg::Ptr(p as *mut std::ffi::c_void),
                KernelArg::I32(v) => ortbench_simt::Arg::I32(v),
                KernelArg::U32(v) => ortbench_simt::Arg::U32(v),
                KernelArg::I64(v) => ortbench_simt::Arg::I64(v),
                KernelArg::U64(v) => ortbench_simt::Arg::U64(v),
                KernelArg::F32(v) => ortbench_simt::Arg::F32(v),
            })
            .collect();
        ortbench_simt::launch(name, (grid, 1, 1), (block, 1, 1), smem, self.warp, self.order, &raw).map_err(|e| GpuError(format!("{name}: {e}")))
    }
    unsafe fn gemm(&self, s: &GemmShape, p: &GemmPtrs) -> Result<(), GpuError> {
        if s.epilogue != Epilogue::None {
            return Err(GpuError(format!("the host GEMM has no {:?} epilogue", s.epilogue)));
        }
        // Row-major C[b] = op(A[b])·op(B[b]), f32 accumulation (cuBLAS's CUBLAS_COMPUTE_32F).
        let (a, b, c) = (p.a as *const f32, p.b as *const f32, p.c as *mut f32);
        for bi in 0..s.batch as i64 {
            let (a, b, c) = (a.offset((bi * s.stride_a) as isize), b.offset((bi * s.stride_b) as isize), c.offset((bi * s.stride_c) as isize));
            for i in 0..s.m as i64 {
                for j in 0..s.n as i64 {
                    let mut acc = 0f32;
                    for k in 0..s.k as i64 {
                        let x = if s.ta { *a.offset((k * s.lda + i) as isize) } else { *a.offset((i * s.lda + k) as isize) };
                        let y = if s.tb { *b.offset((j * s.ldb + k) as isize) } else { *b.offset((k * s.ldb + j) as isize) };
                        acc = x.mul_add(y, acc);
                    }
                    *c.offset((i * s.ldc + j) as isize) = acc;
                }
            }
        }
        Ok(())
    }
    fn synchronize(&self) -> Result<(), GpuError> {
        Ok(())
    }
}

/// Runs `f` on each device the test covers: SIMT at warp 32 (threads forward) and warp 64
/// (threads in reverse), or the GPU under `ORTBENCH_KERNEL_DEVICE=cuda`.
fn on_devices(f: &dyn Fn(&str, &mut dyn FnMut() -> Box<dyn DeviceBox>)) {
    on_simt(&[(32, Order::Forward), (64, Order::Reverse)], f)
}

/// As [`on_devices`] with these SIMT settings.
fn on_simt(simt: &[(u32, Order)], f: &dyn Fn(&str, &mut dyn FnMut() -> Box<dyn DeviceBox>)) {
    match std::env::var("ORTBENCH_KERNEL_DEVICE").as_deref() {
        Ok("cuda") => cuda(f),
        Ok("simt") | Err(_) => {
            for &(warp, order) in simt {
                let label = format!("simt warp {warp} {order:?}");
                f(&label, &mut || Box::new(Simt { warp, order }));
            }
        }
        Ok(other) => panic!("ORTBENCH_KERNEL_DEVICE={other}: expected simt or cuda"),
    }
}

fn cuda(f: &dyn Fn(&str, &mut dyn FnMut() -> Box<dyn DeviceBox>)) {
    use ortbench_engine::backend::cuda::gpu::CudaGpu;
    f("cuda", &mut || Box::new(CudaGpu::open(0).unwrap_or_else(|e| panic!("ORTBENCH_KERNEL_DEVICE=cuda: {e}"))));
}

/// What the tests do with a device, object-safe (the executor is generic over it).
trait DeviceBox {
    /// One forward + backward on the GPU executor: (loss, gradients).
    fn step(self: Box<Self>, g: &ortbench_engine::Graph, params: &[f32], inputs: &ortbench_engine::Inputs<'_>, seed: u64) -> (f32, Vec<f32>, String);
    /// `steps` training steps of the GPU session: (losses, final parameters).
    fn train(self: Box<Self>, g: ortbench_engine::Graph, params: &[f32], segs: Vec<Segment>, cfg: AdamWConfig, feeds: &[ortbench_engine::Inputs<'_>]) -> (Vec<f32>, Vec<f32>);
}

impl<D: GpuDevice + 'static> DeviceBox for D {
    fn step(self: Box<Self>, g: &ortbench_engine::Graph, params: &[f32], inputs: &ortbench_engine::Inputs<'_>, seed: u64) -> (f32, Vec<f32>, String) {
        let mut ex = GpuExecutor::new(g, *self).unwrap();
        ex.plan().check(g).unwrap();
        ex.upload_params(params).unwrap();
        let loss = ex.train_step(inputs, seed).unwrap();
        (loss, ex.download_grads().unwrap(), ex.plan().summary(g))
    }
    fn train(self: Box<Self>, g: ortbench_engine::Graph, params: &[f32], segs: Vec<Segment>, cfg: AdamWConfig, feeds: &[ortbench_engine::Inputs<'_>]) -> (Vec<f32>, Vec<f32>) {
        let mut s = GpuSession::new(g, *self, params, segs, cfg, DType::F32).unwrap();
        let losses = feeds.iter().enumerate().map(|(i, f)| s.step(f, cfg.lr, 100 + i as u64).unwrap().loss).collect();
        (losses, s.params().unwrap())
    }
}

/// Sequence 40: two attention tiles of 32 (the SIMT device's 16 KiB of shared memory), the
/// second partial. tiny-bert at batch 1: its padding-aware word embedding has a LayerNorm over
/// B·T·C rows of one element, the SIMT harness's slowest launch.
const MODELS: [(&str, usize, usize); 2] = [("tiny-bert", 1, 40), ("tiny-gpt2", 2, 40)];

#[test]
fn one_step_matches_the_cpu_engine_with_dropout() {
    for (name, b, t) in MODELS {
        let cfg = builtin_config(name).unwrap();
        let model = build_training_graph(&cfg, &GraphOptions::new(b, t)).unwrap();
        let params = model.flatten(&Weights::init(&cfg, 3)).unwrap();
        let batch = DataSource::synthetic(&cfg, b, t, 17).unwrap().batch(0);
        let feed = model.feed(&batch).unwrap();
        let inputs = feed.inputs();
        let mut g_cpu = vec![f32::NAN; params.len()];
        let l_cpu = PlannedExecutor::new(&model.graph).unwrap().train_step(&params, &inputs, 5, &mut g_cpu).unwrap();
        let big = g_cpu.iter().fold(0f32, |m, v| m.max(v.abs()));
        on_devices(&|dev, make| {
            let label = format!("{name} on {dev}");
            let t0 = std::time::Instant::now();
            let (l, g, summary) = make().step(&model.graph, &params, &inputs, 5);
            let rel = ((l - l_cpu) / l_cpu).abs();
            println!("{label}: loss gpu {l:.7} cpu {l_cpu:.7} (rel {rel:.1e}) in {:.1} s; {summary}", t0.elapsed().as_secs_f64());
            assert!(rel <= 1e-5, "{label}: loss {l} vs cpu {l_cpu}");
            let mut worst = (String::new(), 0f32);
            for p in &model.params {
                let (a, r) = (&g[p.offset..p.offset + p.len], &g_cpu[p.offset..p.offset + p.len]);
                let max_g = r.iter().fold(0f32, |m, v| m.max(v.abs()));
                let max_d = a.iter().zip(r).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                let tol = 1e-5 * max_g + 1e-7 * big;
                assert!(max_d <= tol, "{label}: gradient of {} differs by {max_d:e} (max |g| {max_g:e})", p.name);
                if max_d / tol > worst.1 {
                    worst = (p.name.clone(), max_d / tol);
                }
            }
            println!("{label}: {} gradients match; worst {} at {:.1}% of tolerance", model.params.len(), worst.0, 100.0 * worst.1);
        });
    }
}

#[test]
fn training_steps_match_the_cpu_session() {
    let (name, b, t) = MODELS[1];
    let cfg = builtin_config(name).unwrap();
    let model = build_training_graph(&cfg, &GraphOptions::new(b, t)).unwrap();
    let params = model.flatten(&Weights::init(&cfg, 3)).unwrap();
    let n = params.len();
    // Decay on the first half only: the kernel's segment lookup is exercised.
    let segs = vec![Segment { start: 0, len: n / 2, decay: true }, Segment { start: n / 2, len: n - n / 2, decay: false }];
    // Clipping on (max norm 0.5 < the gradient norm): the coefficient computed on the device.
    let opt = AdamWConfig { lr: 1e-3, weight_decay: 0.01, max_grad_norm: 0.5, ..AdamWConfig::default() };
    let data = DataSource::synthetic(&cfg, b, t, 17).unwrap();
    let batches: Vec<_> = (0..3).map(|i| data.batch(i)).collect();
    let feeds: Vec<_> = batches.iter().map(|b| model.feed(b).unwrap()).collect();
    let inputs: Vec<_> = feeds.iter().map(|f| f.inputs()).collect();
    let mut cpu = TrainSession::with_executor(model.graph.clone(), params.clone(), segs.clone(), opt, DType::F32, ExecutorKind::Planned).unwrap();
    let cpu_losses: Vec<f32> = inputs.iter().enumerate().map(|(i, f)| cpu.step(f, opt.lr, 100 + i as u64).unwrap().loss).collect();
    // Warp 32 only: the step's kernels ran at both warp sizes above; this checks the optimizer.
    on_simt(&[(32, Order::Forward)], &|dev, make| {
        let (losses, p) = make().train(model.graph.clone(), &params, segs.clone(), opt, &inputs);
        println!("{name} on {dev}: losses gpu {losses:?} cpu {cpu_losses:?}");
        for (s, (a, c)) in losses.iter().zip(&cpu_losses).enumerate() {
            assert!(((a - c) / c).abs() <= 1e-4, "{name} on {dev}: step {s} loss {a} vs cpu {c}");
        }
        let worst = p.iter().zip(&cpu.params).fold(0f32, |m, (a, c)| m.max((a - c).abs()));
        let moved = params.iter().zip(&cpu.params).fold(0f32, |m, (a, c)| m.max((a - c).abs()));
        println!("{name} on {dev}: parameters after 3 steps within {worst:.1e} of the cpu's (the steps moved them by up to {moved:.1e})");
        assert!(worst <= 1e-5, "{name} on {dev}: parameters differ by {worst:e} after 3 steps");
    });
}

#[test]
fn half_precision_graphs_are_refused_with_a_reason() {
    let cfg = builtin_config("tiny-bert").unwrap();
    let model = build_training_graph(&cfg, &GraphOptions::new(2, 8).with_dtype(DType::BF16)).unwrap();
    let e = GpuExecutor::new(&model.graph, Simt { warp: 32, order: Order::Forward }).unwrap_err().to_string();
    assert!(e.contains("fp32"), "{e}");
}

#[test]
fn an_out_of_range_id_is_named() {
    let cfg = builtin_config("tiny-gpt2").unwrap();
    let model = build_training_graph(&cfg, &GraphOptions::new(1, 8)).unwrap();
    let params = model.flatten(&Weights::init(&cfg, 3)).unwrap();
    let batch = DataSource::synthetic(&cfg, 1, 8, 17).unwrap().batch(0);
    let feed = model.feed(&batch).unwrap();
    // Past the feed's own check: the kernels must flag it and the executor name it.
    let mut ids = batch.input_ids.clone();
    ids[3] = 5000;
    let good = feed.inputs();
    let mut inputs = ortbench_engine::Inputs::new();
    for name in good.names() {
        inputs = match good.get(name).unwrap() {
            ortbench_engine::exec::InputData::Ids(d) if d == &batch.input_ids[..] => inputs.ids(name, &ids),
            ortbench_engine::exec::InputData::Ids(d) => inputs.ids(name, d),
            ortbench_engine::exec::InputData::Floats(d) => inputs.floats(name, d),
        };
    }
    let mut ex = GpuExecutor::new(&model.graph, Simt { warp: 32, order: Order::Forward }).unwrap();
    ex.upload_params(&params).unwrap();
    let e = ex.train_step(&inputs, 0).unwrap_err().to_string();
    assert!(e.contains("5000") && e.contains("embedding"), "{e}");
}
