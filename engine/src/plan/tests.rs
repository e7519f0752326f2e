//! The planner's invariants on random-ish graphs and transformer graphs: no two tensors that
//! are live at the same time share memory unless one is a view of the other or an in-place
//! result over a dying input (`Plan::check`), nothing is written to parameters or inputs, views
//! fold where the kernels accept the layouts and are copied where they do not, parameter
//! gradients land in the gradient buffer, and the arena is smaller than the naive sum.

use super::testgraphs::{bert_like, gpt_like, random_graph, Dims};
use super::*;
use crate::exec::planned::CpuSupport;
use crate::graph::GeluApprox;

/// A backend that accepts only dense tensors and computes nothing in place.
struct DenseOnly;
impl KernelSupport for DenseOnly {
    fn name(&self) -> &'static str {
        "dense-only"
    }
    fn check(&self, _: &Graph, _: usize) -> Result<(), PlanError> {
        Ok(())
    }
    fn read_req(&self, _: &Graph, _: usize, _: usize) -> Req {
        Req::Contig
    }
    fn write_req(&self, _: &Graph, _: usize, _: usize) -> Req {
        Req::Contig
    }
    fn inplace(&self, _: &Graph, _: usize) -> Vec<usize> {
        vec![]
    }
    fn workspace(&self, _: &Graph, _: usize) -> usize {
        3
    }
}

fn cpu() -> CpuSupport {
    CpuSupport::new(2)
}

fn tiny() -> Dims {
    Dims { b: 2, t: 9, c: 24, h: 3, v: 37, layers: 2, dropout: 0.1 }
}

#[test]
fn invariants_hold_on_random_graphs_for_two_backends() {
    for seed in 0..60 {
        let (g, _) = random_graph(seed, 12).unwrap();
        for k in [&cpu() as &dyn KernelSupport, &DenseOnly] {
            let p = build(&g, k).unwrap();
            p.check(&g).unwrap_or_else(|e| panic!("graph {seed} on {}: {e}", k.name()));
            assert!(
                p.peak_bytes() <= p.naive_bytes + 64 * p.buffers.len(),
                "graph {seed}: {}",
                p.summary(&g)
            );
            // Every tensor has a place in a buffer that exists.
            assert_eq!(p.places.len(), g.tensors().len());
        }
    }
}

#[test]
fn invariants_hold_and_memory_shrinks_on_transformer_graphs() {
    for (name, g) in [
        ("gpt", gpt_like(&tiny()).unwrap()),
        ("bert", bert_like(&tiny(), false).unwrap()),
        ("bert-cls", bert_like(&tiny(), true).unwrap()),
    ] {
        let p = build(&g, &cpu()).unwrap();
        p.check(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(p.peak_bytes() * 2 < p.naive_bytes, "{name}: {}", p.summary(&g));
        println!("{name}: {}", p.summary(&g));
    }
}

#[test]
fn liveness_covers_every_use_and_views_extend_their_source() {
    let g = gpt_like(&tiny()).unwrap();
    let p = build(&g, &cpu()).unwrap();
    for (i, n) in g.nodes().iter().enumerate() {
        if p.folded[i] {
            continue;
        }
        for &x in &n.inputs {
            if let Some((d, l)) = p.live[x.index()] {
                assert!(d <= i && i <= l, "%{} used at {i} outside its life {d}..={l}", x.0);
            }
        }
        for &o in &n.outputs {
            assert_eq!(p.live[o.index()].map(|l| l.0), Some(i), "%{} defined at {i}", o.0);
        }
    }
    // Folded views' sources live as long as the views.
    for (i, n) in g.nodes().iter().enumerate() {
        if p.folded[i] {
            let out_last =
                n.outputs.iter().filter_map(|o| p.live[o.index()]).map(|l| l.1).max().unwrap();
            for x in &n.inputs {
                if let Some((_, l)) = p.live[x.index()] {
                    assert!(
                        l >= out_last,
                        "view source %{} dies at {l} before its view at {out_last}",
                        x.0
                    );
                }
            }
        }
    }
    assert_eq!(p.live[p.loss.index()].unwrap().1, g.nodes().len());
}

#[test]
fn parameter_gradients_land_in_the_gradient_buffer_and_tied_ones_sum_in_place() {
    let g = gpt_like(&tiny()).unwrap();
    let p = build(&g, &cpu()).unwrap();
    assert!(p.grad_copies.is_empty() && p.grad_zeros.is_empty());
    for (i, prm) in g.params().iter().enumerate() {
        let t = g.param_grad(i).unwrap();
        let pl = &p.places[t.index()];
        assert_eq!((pl.root, pl.offset), (Root::Grad, prm.offset), "{}", prm.name);
    }
    // The tied wte: its gradient is add(head dW, embedding scatter), computed in place, so the
    // head's dW GEMM writes into the gradient buffer too.
    let wte = g.param_by_name("wte").unwrap();
    let total = g.param_grad(0).unwrap();
    let node = g.nodes().iter().position(|n| n.outputs.contains(&total)).unwrap();
    assert!(matches!(g.nodes()[node].op, Op::Add));
    let step = p.steps.iter().find(|s| s.node == node).unwrap();
    let slot = step.inplace.expect("the tied gradient sum is in place");
    let part = g.nodes()[node].inputs[slot];
    assert_eq!(p.places[part.index()].root, Root::Grad);
    assert_eq!(p.places[part.index()].offset, wte.offset);
    // Parameters are read where they are.
    for prm in g.params() {
        assert_eq!(
            p.places[prm.tensor.index()],
            Place {
                root: Root::Param,
                offset: prm.offset,
                strides: layout::contiguous_strides(&prm.shape)
                    .iter()
                    .map(|&s| s as usize)
                    .collect()
            }
        );
    }
}

#[test]
fn views_fold_when_kernels_accept_strides_and_are_copied_otherwise() {
    let g = gpt_like(&tiny()).unwrap();
    let cpu_plan = build(&g, &cpu()).unwrap();
    let dense = build(&g, &DenseOnly).unwrap();
    let (f_cpu, c_cpu) = cpu_plan.view_counts(&g);
    let (f_dense, c_dense) = dense.view_counts(&g);
    assert_eq!(c_cpu, 0, "{}", cpu_plan.summary(&g));
    assert!(
        c_dense > 0 && f_dense > 0,
        "dense-only must copy the head permutes and still alias reshapes"
    );
    assert_eq!(f_cpu + c_cpu, f_dense + c_dense);
    dense.check(&g).unwrap();
    // Workspaces exist and are live for their node only.
    assert!(dense.buffers.iter().any(|b| b.workspace && b.first == b.last));
}

#[test]
fn a_reshape_aliases_and_an_unfoldable_permute_copies() {
    // x (2,3,4) -reshape-> (6,4) -gelu; x -permute(2,0,1)-> gelu (needs a dense input).
    let mut g = Graph::new();
    let x = g.param("x", &[2, 3, 4]).unwrap();
    let y = g.gelu(x, GeluApprox::Erf).unwrap();
    let r = g.reshape(y, &[6, 4]).unwrap();
    let a = g.gelu(r, GeluApprox::Erf).unwrap();
    let pm = g.permute(y, &[2, 0, 1]).unwrap();
    let b = g.gelu(pm, GeluApprox::Erf).unwrap();
    let b = g.reshape(b, &[4, 6]).unwrap();
    let a = g.reshape(a, &[4, 6]).unwrap();
    let s = g.add(a, b).unwrap();
    let labels = g.input_ids("labels", &[4]).unwrap();
    let loss = g.cross_entropy(s, labels).unwrap();
    let g = crate::autodiff::backward(&g, loss).unwrap();
    let p = build(&g, &cpu()).unwrap();
    p.check(&g).unwrap();
    let node_of = |t: TensorId| g.nodes().iter().position(|n| n.outputs.contains(&t)).unwrap();
    assert!(p.folded[node_of(r)], "reshape of a dense tensor is a view");
    assert_eq!(p.places[r.index()].offset, p.places[y.index()].offset);
    assert!(!p.folded[node_of(pm)], "a permute read by an elementwise kernel is copied");
}

#[test]
fn allocator_reuses_memory_of_disjoint_lifetimes_best_fit() {
    // (len, first, last)
    let items = [(64, 0, 1), (32, 2, 3), (32, 2, 5), (16, 4, 6), (64, 6, 7)];
    let off = allocate(&items);
    // Check no live overlap and that reuse happened (total < sum).
    for i in 0..items.len() {
        for j in i + 1..items.len() {
            let (a, b) = (items[i], items[j]);
            if a.1 <= b.2 && b.1 <= a.2 {
                assert!(off[i] + a.0 <= off[j] || off[j] + b.0 <= off[i], "{i} and {j} overlap");
            }
        }
    }
    let peak = items.iter().zip(&off).map(|(it, &o)| o + it.0).max().unwrap();
    assert!(peak <= 64 + 32, "peak {peak}: {off:?}");
    assert!(off.iter().all(|o| o % ALIGN_ELEMS == 0));
}

#[test]
fn a_missing_kernel_is_a_plan_error_naming_the_op() {
    struct NoGelu;
    impl KernelSupport for NoGelu {
        fn name(&self) -> &'static str {
            "test"
        }
        fn check(&self, g: &Graph, node: usize) -> Result<(), PlanError> {
            match g.nodes()[node].op {
                Op::Gelu(_) => Err(PlanError::NoKernel {
                    node,
                    op: "gelu",
                    backend: "test",
                    why: String::new(),
                }),
                _ => Ok(()),
            }
        }
        fn read_req(&self, _: &Graph, _: usize, _: usize) -> Req {
            Req::Contig
        }
        fn write_req(&self, _: &Graph, _: usize, _: usize) -> Req {
            Req::Contig
        }
        fn inplace(&self, _: &Graph, _: usize) -> Vec<usize> {
            vec![]
        }
        fn workspace(&self, _: &Graph, _: usize) -> usize {
            0
        }
    }
    let g = bert_like(&tiny(), false).unwrap();
    let e = build(&g, &NoGelu).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("gelu") && msg.contains("no kernel") && msg.contains("ORTBENCH_EXECUTOR=ref"),
        "{msg}"
    );
}
