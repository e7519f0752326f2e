//! The planned executor allocates nothing on the heap inside a training step after the first:
//! a counting global allocator, armed around steps 2..=4 of a small GPT-style graph big enough
//! for every kernel to split over the thread pool (GEMMs through the active provider, dropout
//! on, tied embedding), must count zero allocations in any thread.
//!
//! (One test in this binary, so that no other test allocates while the counter is armed.)
//!
//! The claim holds with every GEMM provider, the default one included: the pure-Rust `gemm`
//! crate (`ORTBENCH_GEMM=gemm`, the default without MKL) allocates its packing buffers inside
//! every call (gemm-common 0.19 `gemm_basic_generic`) — that is the crate's, not the executor's,
//! so those allocations are counted apart (`blas::in_gemm_crate`) and reported; everything
//! else (our kernels, the pool, the executor) must allocate nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ortbench_engine::autodiff::backward;
use ortbench_engine::exec::planned::PlannedExecutor;
use ortbench_engine::graph::{AttentionOpts, GeluApprox, Graph, TensorId};
use ortbench_engine::passes::{self, PassConfig};
use ortbench_engine::Inputs;

struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Allocations made inside the `gemm` crate's calls (its packing buffers), counted apart.
static GEMM_CRATE_ALLOCS: AtomicUsize = AtomicUsize::new(0);

fn count() {
    if ARMED.load(Ordering::Relaxed) {
        if ortbench_engine::backend::cpu::blas::in_gemm_crate() {
            GEMM_CRATE_ALLOCS.fetch_add(1, Ordering::Relaxed);
        } else {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const B: usize = 4;
const T: usize = 64;
const C: usize = 128;
const H: usize = 4;
const V: usize = 500;

/// The training graph as written (unfused head: matmul + cross-entropy, row-restricted), or with
/// `fused_head` its head as `fuse_linear_cross_entropy` + its one-sweep backward make it.
fn gpt(fused_head: bool) -> Graph {
    let mut g = Graph::new();
    let ids = g.input_ids("input_ids", &[B, T]).unwrap();
    let pos = g.input_ids("position_ids", &[T]).unwrap();
    let labels = g.input_ids("labels", &[B, T]).unwrap();
    let wte = g.param("wte", &[V, C]).unwrap();
    let wpe = g.param("wpe", &[T, C]).unwrap();
    let ln = |g: &mut Graph, x: TensorId, n: &str| {
        let w = g.param(&format!("{n}.w"), &[C]).unwrap();
        let b = g.param(&format!("{n}.b"), &[C]).unwrap();
        g.layer_norm(x, w, b, 1e-5).unwrap()
    };
    let tok = g.embedding(wte, ids).unwrap();
    let pe = g.embedding(wpe, pos).unwrap();
    let x = g.add(tok, pe).unwrap();
    let mut x = g.dropout(x, 0.1).unwrap();
    for l in 0..2 {
        let h = ln(&mut g, x, &format!("{l}.ln1"));
        let w = g.param(&format!("{l}.attn.w"), &[C, 3 * C]).unwrap();
        let bb = g.param(&format!("{l}.attn.b"), &[3 * C]).unwrap();
        let qkv = g.matmul(h, w, false, false).unwrap();
        let qkv = g.bias_add(qkv, bb).unwrap();
        let mut hs = Vec::new();
        for part in g.split(qkv, &[C, C, C]).unwrap() {
            let r = g.reshape(part, &[B, T, H, C / H]).unwrap();
            hs.push(g.permute(r, &[0, 2, 1, 3]).unwrap());
        }
        let a = g
            .attention(
                hs[0],
                hs[1],
                hs[2],
                AttentionOpts {
                    causal: true,
                    scale: None,
                    dropout_p: 0.1,
                    mask: None,
                    softcap: None,
                },
            )
            .unwrap();
        let a = g.permute(a, &[0, 2, 1, 3]).unwrap();
        let a = g.reshape(a, &[B, T, C]).unwrap();
        let pw = g.param(&format!("{l}.proj.w"), &[C, C]).unwrap();
        let a = g.linear(a, pw, None).unwrap();
        let a = g.dropout(a, 0.1).unwrap();
        x = g.add(x, a).unwrap();
        let h = ln(&mut g, x, &format!("{l}.ln2"));
        let w1 = g.param(&format!("{l}.fc.w"), &[4 * C, C]).unwrap();
        let b1 = g.param(&format!("{l}.fc.b"), &[4 * C]).unwrap();
        let m = g.linear(h, w1, Some(b1)).unwrap();
        let m = g.gelu(m, GeluApprox::Tanh).unwrap();
        let w2 = g.param(&format!("{l}.out.w"), &[C, 4 * C]).unwrap();
        let m = g.linear(m, w2, None).unwrap();
        x = g.add(x, m).unwrap();
    }
    let x = ln(&mut g, x, "lnf");
    let logits = g.matmul(x, wte, false, true).unwrap();
    let loss = g.cross_entropy(logits, labels).unwrap();
    g.set_loss(loss).unwrap();
    if !fused_head {
        return backward(&g, loss).unwrap();
    }
    let only = |name: &str| PassConfig::none().with(name, true);
    let (g, _) = passes::run_forward(&g, &only("fuse_linear_cross_entropy")).unwrap();
    let t = backward(&g, g.loss().unwrap()).unwrap();
    let (t, report) =
        passes::run_training(&t, &only("fuse_linear_cross_entropy_backward")).unwrap();
    assert_eq!(report.rewrites("fuse_linear_cross_entropy_backward"), 1);
    t
}

/// The unfused head (row-restricted GEMMs), then the fused LM head (its chunks live in the
/// planned workspace) — one after the other in one test: the allocation counter is global.
#[test]
fn no_heap_allocation_inside_a_step_after_the_first() {
    no_heap_allocation_after_the_first_step(false);
    no_heap_allocation_after_the_first_step(true);
}

fn no_heap_allocation_after_the_first_step(fused_head: bool) {
    let g = gpt(fused_head);
    let mut ex = PlannedExecutor::new(&g).unwrap();
    assert_eq!(ex.row_restricted_steps() > 0, !fused_head);
    let n = g.num_param_elems();
    let params: Vec<f32> =
        (0..n).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.1 + 1e-3).collect();
    let mut grads = vec![0.0f32; n];
    let ids: Vec<i64> = (0..B * T).map(|i| (i * 31 % V) as i64).collect();
    // One token in 7 labelled (masked-LM style): the head's row-restricted kernels run too.
    let labels: Vec<i64> =
        (0..B * T).map(|i| if i % 7 != 0 { -100 } else { (i * 17 % V) as i64 }).collect();
    let pos: Vec<i64> = (0..T as i64).collect();
    let inputs =
        Inputs::new().ids("input_ids", &ids).ids("position_ids", &pos).ids("labels", &labels);
    let first = ex.train_step(&params, &inputs, 1, &mut grads).unwrap();
    assert!(first.is_finite());
    ALLOCS.store(0, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
    let mut losses = [0f32; 3];
    for (k, l) in losses.iter_mut().enumerate() {
        *l = ex.train_step(&params, &inputs, 2 + k as u64, &mut grads).unwrap();
    }
    ARMED.store(false, Ordering::SeqCst);
    let count = ALLOCS.load(Ordering::SeqCst);
    assert!(losses.iter().all(|l| l.is_finite()) && grads.iter().all(|g| g.is_finite()));
    let provider = ortbench_engine::backend::cpu::gemm::provider().unwrap();
    let in_crate = GEMM_CRATE_ALLOCS.load(Ordering::SeqCst);
    eprintln!("GEMM provider {provider}: {count} heap allocations in 3 steps outside the GEMM library, {in_crate} inside the gemm crate's calls");
    assert_eq!(
        count, 0,
        "{count} heap allocations in 3 steps outside the GEMM library (GEMM provider {provider})"
    );
    if provider.kind() != ortbench_engine::backend::cpu::gemm::ProviderKind::Gemm {
        assert_eq!(in_crate, 0);
    }
}
