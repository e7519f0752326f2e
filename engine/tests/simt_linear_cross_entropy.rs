//! engine/kernels/linear_cross_entropy.cu (`lce_compact`, `lce_gather`, `lce_rows`,
//! `lce_scatter`, `lce_column_sum`) with cross_entropy.cu's `cross_entropy_mean`, as the GPU
//! executor launches them around its GEMMs (`exec/gpu/mod.rs`, `Op::LinearCrossEntropy[Backward]`),
//! against the reference `ops::linear_cross_entropy` (f64 on the same rounded inputs).
//!
//! The whole device path runs: each graph goes through the GPU executor (planning, workspace
//! layout, launches, GEMM shapes) on the host SIMT harness as a device — the kernels on its
//! fibers at warp 32 and 64, threads in forward, reverse and greedy order, a grid of at most 3
//! blocks (every grid-stride loop takes several turns) — with a host loop GEMM (f32
//! accumulation, f32 C from half A/B, β = 1 for `Epilogue::Accumulate`, as cuBLASLt). With
//! `ORTBENCH_KERNEL_DEVICE=cuda` (scripts/gpu-validate) every test here runs on GPU 0 instead,
//! kernels and cuBLASLt, and fails in one line where there is none.
//!
//! Graphs (R = 37 rows as (B, T) = (1, 37), C = 24, V = 131; none a multiple of a block, warp
//! or chunk), the chunk 5 rows (8 chunks, the last of 2) and one chunk of all rows:
//! - untied, with bias: x = embedding(e, ids = 0..R) (so e's gradient is dx), loss =
//!   linear_cross_entropy(x, w, labels, bias): dx (in x's dtype, then e's f32 gradient), dw and
//!   dbias (parameters' f32 gradients, accumulated chunk after chunk);
//! - tied, no bias: x = embedding(w, ids random < V): dw is a part summed with the embedding's
//!   scatter (stored in x's dtype: the f32 workspace sum cast at the end);
//! - each as autodiff makes it (the forward node and the backward node) and after the training
//!   pass `fuse_linear_cross_entropy_backward` (the backward alone gives the loss);
//! - every 4th label the ignore index (−100), labels 0 and V − 1 included; f32, f16, bf16;
//! - merged, also with the logits soft-capped at 2 (Gemma 2's head: |z| reaches ~6 here, so
//!   tanh bends).
//!
//! Tolerances, per element |got − want| ≤ rel·|want| + of_largest·max|want|:
//! - loss: 2e-6 relative (f32 GEMM sums of C = 24 terms and the block lse in another order than
//!   f64; the mean of ≤ 37 rows), in every dtype (the loss is f32 from f32 logits of the same
//!   rounded inputs).
//! - f32 gradients: rel 1e-5 + 2e-5 of the tensor's largest element: dx and dw are sums over V
//!   = 131 and the labelled rows of terms g·w, g·x of both signs (softmax − onehot), which
//!   cancel, so their error follows the terms, not the result (as the CPU kernel's test).
//! - f16/bf16 gradients: g is rounded to the storage type for the half GEMMs (as under
//!   autocast) and dx is stored in it: each term carries up to u/2 relative, the sums cancel,
//!   so rel u plus 3·u of the largest element (f16 u = 2^-10, bf16 2^-7).
//!
//! Each case prints its worst error against its tolerance; the measured figures and the planted
//! bugs these tests caught are in docs/gpu-kernels.md ("The fused LM head on the GPU").

mod kernel_harness;

use ortbench_engine::backend::gpu::{Epilogue, GpuDevice};
use ortbench_engine::backend::simt_device::SimtGpu;
use ortbench_engine::exec::gpu::support::GpuSupport;
use ortbench_engine::exec::gpu::GpuExecutor;
use ortbench_engine::graph::op::LinearCrossEntropy;
use ortbench_engine::graph::Graph;
use ortbench_engine::ops::linear_cross_entropy::{self as reference, SoftCap};
use ortbench_engine::{DType, Inputs};
use ortbench_simt::Order;

const IGNORE: i64 = -100;
const R: usize = 37;
const C: usize = 24;
const V: usize = 131;

/// The host SIMT harness as a GPU: host memory, the kernels on its fibers at `warp` in `order`,
/// a grid of at most 3 blocks, 48 KiB of shared memory, a plain-loop GEMM (β = 1 for
/// `Epilogue::Accumulate`).
fn simt(warp: u32, order: Order) -> SimtGpu {
    SimtGpu::new(warp, order).with_max_blocks(3).with_max_shared_bytes(48 * 1024)
}

/// Runs `$body` with `$dev` bound to each device the executor-level tests use: the SIMT
/// harness at each (warp, order) of `$simt`, or GPU 0 under `ORTBENCH_KERNEL_DEVICE=cuda` (a
/// macro, not a function: the executor is generic over the device type).
macro_rules! on_devices {
    ($simt:expr, |$dev:ident| $body:expr) => {
        if kernel_harness::on_gpu() {
            let $dev = kernel_harness::cuda_gpu();
            $body;
        } else {
            for &(warp, order) in $simt {
                let $dev = simt(warp, order);
                $body;
            }
        }
    };
}

/// A deterministic generator (splitmix64).
struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in ±[0.05, 1)·scale: never zero.
    fn val(&mut self, scale: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        let m = 0.05 + 0.95 * u;
        scale * if self.next_u64() & 1 == 0 { m } else { -m }
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

fn round(d: DType, x: f32) -> f32 {
    match d {
        DType::F32 => x,
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
    }
}

fn unit_roundoff(d: DType) -> f64 {
    match d {
        DType::F32 => 0.0,
        DType::F16 => 1.0 / 1024.0,
        DType::BF16 => 1.0 / 128.0,
    }
}

/// One case's graph: the training graph (optionally with the forward merged into the
/// backward), its parameters, inputs, and the reference's loss and gradients (f64).
struct Case {
    what: String,
    graph: Graph,
    params: Vec<f32>,
    ids: Vec<i64>,
    labels: Vec<i64>,
    loss: f64,
    /// Per parameter name: the reference gradient.
    grads: Vec<(String, Vec<f64>)>,
}

fn case(dtype: DType, tied: bool, merged: bool, seed: u64, softcap: Option<SoftCap>) -> Case {
    let mut rng = Rng(seed);
    let mut g = Graph::with_dtype(dtype);
    let w = g.param("w", &[V, C]).unwrap();
    let (table, rows_of_table) = if tied { (w, V) } else { (g.param("e", &[R, C]).unwrap(), R) };
    let bias = (!tied).then(|| g.param("bias", &[V]).unwrap());
    let ids_t = g.input_ids("ids", &[1, R]).unwrap();
    let labels_t = g.input_ids("labels", &[1, R]).unwrap();
    let x = g.embedding(table, ids_t).unwrap();
    let head = LinearCrossEntropy { ignore_index: IGNORE, softcap };
    let loss = g.linear_cross_entropy(x, w, labels_t, bias, head).unwrap();
    let mut graph = ortbench_engine::autodiff::backward(&g, loss).unwrap();
    if merged {
        let (m, n) =
            ortbench_engine::passes::fuse_linear_cross_entropy::merge_backward(&graph).unwrap();
        assert_eq!(n, 1, "the backward takes the forward's place");
        graph = m;
    }
    let ids: Vec<i64> = (0..R).map(|r| if tied { rng.below(V) as i64 } else { r as i64 }).collect();
    let labels: Vec<i64> = (0..R)
        .map(|r| match r {
            _ if r % 4 == 2 => IGNORE,
            0 => 0,
            1 => V as i64 - 1,
            _ => rng.below(V) as i64,
        })
        .collect();
    // Parameters rounded to the storage dtype: the reference sees what the kernels read.
    let mut params = vec![0f32; graph.num_param_elems()];
    for p in graph.params() {
        let scale = if p.name == "bias" { 0.5 } else { 1.2 };
        for v in &mut params[p.offset..p.offset + p.len] {
            *v = round(dtype, rng.val(scale));
        }
    }
    let get = |name: &str| -> Vec<f64> {
        let p = graph.param_by_name(name).unwrap();
        params[p.offset..p.offset + p.len].iter().map(|&v| v as f64).collect()
    };
    let w64 = get("w");
    let t64 = if tied { w64.clone() } else { get("e") };
    let b64 = bias.map(|_| get("bias"));
    let x64: Vec<f64> =
        ids.iter().flat_map(|&i| t64[i as usize * C..(i as usize + 1) * C].to_vec()).collect();
    let (mut dx, mut dw, mut db) = (vec![0.0; R * C], vec![0.0; V * C], vec![0.0; V]);
    let grads = reference::LceGrads { dloss: 1.0, dx: &mut dx, dw: &mut dw, db: Some(&mut db) };
    let loss =
        reference::linear_cross_entropy(&x64, &w64, &labels, b64.as_deref(), C, head, Some(grads))
            .unwrap();
    // The embedding's gradient: dx's rows added into the table's rows ids[r].
    let mut dtable = vec![0.0; rows_of_table * C];
    for (r, &i) in ids.iter().enumerate() {
        for k in 0..C {
            dtable[i as usize * C + k] += dx[r * C + k];
        }
    }
    let grads = if tied {
        vec![("w".to_string(), dw.iter().zip(&dtable).map(|(a, b)| a + b).collect())]
    } else {
        vec![("w".to_string(), dw), ("bias".to_string(), db), ("e".to_string(), dtable)]
    };
    let what = format!(
        "{dtype:?} {} {}{}",
        if tied { "tied" } else { "untied+bias" },
        if softcap.is_some() { "soft-capped " } else { "" },
        if merged { "merged" } else { "fwd+bwd" }
    );
    Case { what, graph, params, ids, labels, loss, grads }
}

/// Runs one step of `c` on `dev` with chunks of `chunk` rows; checks it against the reference
/// and returns the worst error as a share of its tolerance.
fn check_case<D: GpuDevice>(c: &Case, dev: D, chunk: usize) -> f64 {
    let label = format!("{} chunk {chunk} on {}", c.what, dev.describe());
    let dtype = c.graph.dtype();
    let mut sup = GpuSupport::for_graph(&c.graph);
    sup.lce_chunk = Some(chunk);
    let n = c.graph.num_param_elems();
    let mut ex = GpuExecutor::with_support(&c.graph, dev, n, sup).unwrap();
    ex.plan().check(&c.graph).unwrap();
    // The chunks the executor issued: per chunk one logits GEMM in each linear cross-entropy
    // node and the backward's two more, its dw adding from the second chunk on.
    let chunks = R.div_ceil(chunk);
    let gemms = ex.gemms();
    let nodes = if c.what.ends_with("merged") { 1 } else { 2 };
    assert_eq!(gemms.len(), chunks * (nodes + 2), "{label}: GEMMs");
    let acc = gemms.iter().filter(|(s, _)| s.epilogue == Epilogue::Accumulate).count();
    assert_eq!(acc, chunks - 1, "{label}: accumulating GEMMs");
    ex.upload_params(&c.params).unwrap();
    let inputs = Inputs::new().ids("ids", &c.ids).ids("labels", &c.labels);
    let loss = ex.train_step(&inputs, 1).unwrap() as f64;
    let rel = ((loss - c.loss) / c.loss).abs();
    assert!(rel <= 2e-6, "{label}: loss {loss} vs reference {}", c.loss);
    println!("{label}: loss rel {rel:.1e}");
    let grads = ex.download_grads().unwrap();
    let u = unit_roundoff(dtype);
    let (rel_t, big_t) = if dtype == DType::F32 { (1e-5, 2e-5) } else { (u, 3.0 * u) };
    let mut worst = 0f64;
    for (name, want) in &c.grads {
        let p = c.graph.param_by_name(name).unwrap();
        let got = &grads[p.offset..p.offset + p.len];
        let big = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
            let tol = rel_t * b.abs() + big_t * big;
            let err = (a as f64 - b).abs();
            assert!(
                err <= tol,
                "{label}: gradient of {name}[{i}] = {a}, want {b} (|err| {err:.3e} > {tol:.3e})"
            );
            worst = worst.max(err / tol);
        }
    }
    worst
}

/// Every dtype, tied and untied, with and without the merge (merged, also soft-capped), chunks
/// of 5 rows (and one of all rows), on every test device: loss and gradients against the
/// reference.
#[test]
fn gpu_executor_linear_cross_entropy_matches_the_reference() {
    let devs = [
        (32, Order::Forward),
        (32, Order::Reverse),
        (32, Order::Greedy),
        (64, Order::Forward),
        (64, Order::Reverse),
        (64, Order::Greedy),
    ];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for tied in [false, true] {
            let cap = Some(SoftCap { inv: 0.5, cap: 2.0 });
            for (merged, softcap) in [(false, None), (true, None), (true, cap)] {
                let c = case(dtype, tied, merged, 7 + tied as u64, softcap);
                let mut worst = 0f64;
                on_devices!(&devs, |dev| worst = worst.max(check_case(&c, dev, 5)));
                on_devices!(&devs[..1], |dev| worst = worst.max(check_case(&c, dev, R)));
                println!("{}: worst error at {:.1}% of tolerance", c.what, 100.0 * worst);
            }
        }
    }
}

/// `c`'s graph on the GPU executor over `dev` with 5-row chunks, its parameters uploaded; and
/// its inputs.
fn executor_in_chunks_of_5<D: GpuDevice>(c: &Case, dev: D) -> (GpuExecutor<D>, Inputs<'_>) {
    let mut sup = GpuSupport::for_graph(&c.graph);
    sup.lce_chunk = Some(5);
    let n = c.graph.num_param_elems();
    let ex = GpuExecutor::with_support(&c.graph, dev, n, sup).unwrap();
    ex.upload_params(&c.params).unwrap();
    (ex, Inputs::new().ids("ids", &c.ids).ids("labels", &c.labels))
}

/// A label out of range (V, or negative and not the ignore index) is not read as an index: the
/// kernels set the error flag and the step fails naming the op, as on the CPU.
#[test]
fn gpu_executor_linear_cross_entropy_names_a_bad_label() {
    for bad in [V as i64, -3] {
        let mut c = case(DType::F32, false, true, 3, None);
        c.labels[5] = bad;
        on_devices!(&[(32, Order::Forward)], |dev| {
            let (mut ex, inputs) = executor_in_chunks_of_5(&c, dev);
            let e = ex.train_step(&inputs, 1).unwrap_err().to_string();
            assert!(e.contains("linear_cross_entropy") && e.contains(&format!("{bad}")), "{e}");
        });
    }
}

/// Every label ignored: the loss is NaN (the reference's 0/0) and every gradient zero, with
/// the chunks still issued over rows the host cannot know are empty.
#[test]
fn gpu_executor_linear_cross_entropy_with_every_label_ignored_gives_nan_and_zero_gradients() {
    for dtype in [DType::F32, DType::BF16] {
        let mut c = case(dtype, false, true, 5, None);
        c.labels.fill(IGNORE);
        on_devices!(&[(64, Order::Greedy)], |dev| {
            let (mut ex, inputs) = executor_in_chunks_of_5(&c, dev);
            let loss = ex.train_step(&inputs, 1).unwrap();
            assert!(loss.is_nan(), "{dtype:?}: loss {loss}");
            let grads = ex.download_grads().unwrap();
            assert!(grads.iter().all(|&g| g == 0.0), "{dtype:?}: a nonzero gradient");
        });
    }
}

/// Asked for the GPU (`ORTBENCH_KERNEL_DEVICE=cuda`), a test of this file runs there or fails
/// saying in one line why it cannot — never passes on the SIMT harness instead. Checked by
/// running this binary again on one test: where no GPU opens (here, CI) it must fail with the
/// open error; where one does (scripts/gpu-validate) it must pass.
#[test]
fn asked_for_cuda_a_fused_head_test_runs_there_or_fails_in_one_line() {
    if kernel_harness::on_gpu() {
        return; // the child run below; its parent checks it
    }
    let test = "gpu_executor_linear_cross_entropy_names_a_bad_label";
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads=1"])
        .env("ORTBENCH_KERNEL_DEVICE", "cuda")
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("running 1 test"), "{text}");
    match ortbench_engine::backend::cuda::open(0) {
        Ok(_) => assert!(out.status.success(), "a GPU opens, yet:\n{text}"),
        Err(e) => {
            assert!(!out.status.success(), "no GPU ({e}), yet the test passed:\n{text}");
            let line = text
                .lines()
                .find(|l| l.contains("ORTBENCH_KERNEL_DEVICE=cuda: "))
                .unwrap_or_else(|| panic!("no one-line reason:\n{text}"));
            assert!(line.contains(&e.to_string()), "{line}\nvs the open error: {e}");
            println!("without a GPU, as it should: {line}");
        }
    }
}

/// Each kernel alone through its typed launcher on the harness's guarded buffers (outputs
/// start as NaN: an element a kernel should write and does not shows; a write out of bounds
/// fails the guard check), in f32/f16/bf16 on every test device, against host loops: the
/// compaction (idx, count), a chunk (start 25, k 5) straddling the labelled count (28 of 37
/// rows labelled: 3 positions below it, 2 past) for the gather, the rows' pass (loss, g in
/// place, its T copy) and the scatter, and the column sum with and without accumulation.
/// Tolerances: losses 1e-6 relative, g 4e-6 relative (+ u of a half copy) — the reasons of
/// simt_cross_entropy.rs (lse within an ulp or so of f64's, exp's ulp); the gathered rows,
/// scattered rows, idx and count exact; column sums 1e-6 relative + 1e-6 of the largest
/// (5 signed terms in the same order as the host's f32 loop).
#[test]
fn each_kernel_matches_host_loops_within_its_buffers() {
    use kernel_harness::{check, devices, dtype, tol, Rng as HRng, FLOATS};
    use ortbench_engine::exec::gpu::launch::linear_cross_entropy as l;
    use ortbench_simt::{Buf, Dtype as D};
    let (start, k, dloss) = (25usize, 5usize, 0.7f32);
    let mut rng = HRng::new(11);
    // Labelled rows: all but every 4th from row 1 on (rows 1, 5, 9, …): 28 of 37.
    let labels: Vec<i64> =
        (0..R).map(|r| if r % 4 == 1 { IGNORE } else { rng.below(V as u64) as i64 }).collect();
    let want_idx: Vec<i64> = (0..R as i64).filter(|&r| labels[r as usize] != IGNORE).collect();
    let n = want_idx.len();
    assert_eq!(n, 28);
    for dt in FLOATS {
        let x = rng.vec(R * C, -1.0, 1.0, dt);
        let bias = rng.vec(V, -0.5, 0.5, dt);
        let logits0 = rng.vec(k * V, -6.0, 6.0, D::F32);
        let dxs = rng.vec(k * C, -1.0, 1.0, D::F32);
        let gsum = rng.vec(k * V, -1.0, 1.0, D::F32);
        let db0 = rng.vec(V, -1.0, 1.0, D::F32);
        for dev in devices() {
            let what = format!("{dt:?} on {dev}");
            let geo = dev.geometry();
            // Compaction.
            let (mut idx, mut count, mut err, mut lb) = (
                Buf::poisoned(R, D::I32),
                Buf::poisoned(1, D::F32),
                Buf::from_i32(&[0]),
                Buf::from_i64(&labels),
            );
            let c = l::LceCompact {
                idx: &mut idx,
                count: &mut count,
                err: Some(&mut err),
                labels: &mut lb,
                rows: R,
                v: V,
                ignore_index: IGNORE,
            };
            dev.run(c.launch(geo)).unwrap();
            assert_eq!(idx.to_i64()[..n], want_idx[..], "{what}: idx");
            assert_eq!((count.to_f32()[0], err.to_i64()[0]), (n as f32, 0), "{what}: count");
            // Gather: positions 25..28 are rows, 28..30 zero rows.
            let (mut xs, mut xb) = (Buf::poisoned(k * C, dt), Buf::from_f32(&x, dt));
            let gth = l::LceGather {
                dtype: dtype(dt),
                xs: &mut xs,
                x: &mut xb,
                idx: &mut idx,
                count: &mut count,
                start,
                k,
                c: C,
            };
            dev.run(gth.launch(geo)).unwrap();
            let want_xs: Vec<f32> = (0..k * C)
                .map(|e| {
                    let p = start + e / C;
                    if p < n {
                        x[want_idx[p] as usize * C + e % C]
                    } else {
                        0.0
                    }
                })
                .collect();
            assert_eq!(xs.to_f32(), want_xs, "{what}: gathered rows");
            // The rows' pass with gradients.
            let half = dt != D::F32;
            let (mut lg, mut g16, mut losses, mut bb, mut dl) = (
                Buf::from_f32(&logits0, D::F32),
                Buf::poisoned(k * V, dt),
                Buf::poisoned(R, D::F32),
                Buf::from_f32(&bias, dt),
                Buf::from_f32(&[dloss], D::F32),
            );
            let rows = l::LceRows {
                dtype: dtype(dt),
                logits: &mut lg,
                g16: half.then_some(&mut g16),
                losses: &mut losses,
                err: Some(&mut err),
                labels: &mut lb,
                idx: &mut idx,
                count: &mut count,
                bias: Some(&mut bb),
                dloss: Some(&mut dl),
                start,
                k,
                v: V,
                ignore_index: IGNORE,
                softcap: None, // soft-capped rows: the executor-level test above
            };
            dev.run(rows.launch(geo)).unwrap();
            let g = dloss / n as f32;
            let (mut want_g, mut want_l) = (vec![0f32; k * V], vec![f32::NAN; R]);
            for s in 0..k {
                let p = start + s;
                if p >= n {
                    want_l[p] = 0.0;
                    continue;
                }
                let y = labels[want_idx[p] as usize] as usize;
                let z: Vec<f64> = (0..V).map(|j| (logits0[s * V + j] + bias[j]) as f64).collect();
                let m = z.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                let lse = m + z.iter().map(|&v| (v - m).exp()).sum::<f64>().ln();
                want_l[p] = (lse - z[y]) as f32;
                for j in 0..V {
                    let d = g as f64 * (z[j] - lse).exp() - if j == y { g as f64 } else { 0.0 };
                    want_g[s * V + j] = d as f32;
                }
            }
            let got_l = losses.to_f32();
            assert!(got_l[..start].iter().all(|v| v.is_nan()), "{what}: losses outside the chunk");
            let chunk = start..start + k;
            check(
                &format!("{what} losses"),
                &got_l[chunk.clone()],
                &want_l[chunk],
                D::F32,
                tol(D::F32, 1e-6),
            );
            check(&format!("{what} g"), &lg.to_f32(), &want_g, D::F32, tol(D::F32, 4e-6));
            if half {
                check(&format!("{what} g in T"), &g16.to_f32(), &want_g, dt, tol(dt, 4e-6));
            }
            // Scatter: rows idx[25..28] written, every other row untouched (NaN).
            let (mut dx, mut dxb) = (Buf::poisoned(R * C, dt), Buf::from_f32(&dxs, D::F32));
            let sc = l::LceScatter {
                dtype: dtype(dt),
                dx: &mut dx,
                dxs: &mut dxb,
                idx: &mut idx,
                count: &mut count,
                start,
                k,
                c: C,
            };
            dev.run(sc.launch(geo)).unwrap();
            let got = dx.to_f32();
            for r in 0..R {
                let pos = (start..n).find(|&p| want_idx[p] as usize == r);
                let row = &got[r * C..(r + 1) * C];
                match pos {
                    Some(p) => {
                        let want = &dxs[(p - start) * C..(p - start + 1) * C];
                        check(&format!("{what} dx row {r}"), row, want, dt, tol(dt, 0.0));
                    }
                    None => assert!(row.iter().all(|v| v.is_nan()), "{what}: dx row {r} written"),
                }
            }
            // Column sums, fresh and accumulated.
            for accumulate in [false, true] {
                let (mut db, mut gb) = (Buf::from_f32(&db0, D::F32), Buf::from_f32(&gsum, D::F32));
                let cs = l::LceColumnSum { db: &mut db, g: &mut gb, k, v: V, accumulate };
                dev.run(cs.launch(geo)).unwrap();
                let want: Vec<f32> = (0..V)
                    .map(|j| {
                        let a = if accumulate { db0[j] } else { 0.0 };
                        (0..k).fold(a, |acc, s| acc + gsum[s * V + j])
                    })
                    .collect();
                let t = kernel_harness::Tol { rel: 1e-6, abs: f32::MIN_POSITIVE, of_largest: 1e-6 };
                check(
                    &format!("{what} column sums ({accumulate})"),
                    &db.to_f32(),
                    &want,
                    D::F32,
                    t,
                );
            }
        }
    }
}
