//! A refactoring tool, not a check: prints a fingerprint of the engine's memory plans (CPU and
//! GPU kernel rules) and of the GPU executor's launches for one training step, for bert-base and
//! gpt2 at b8 × s128 in f32 and bf16 — step and launch counts and a hash of everything but
//! addresses. Run it before and after a change that must not alter what runs, and compare:
//!
//! `cargo test --release -p ortbench-tests --test fingerprints -- --ignored --nocapture`
//!
//! The launches are recorded by a device that runs nothing (`recorder()`), so the full-size models
//! take seconds. `ORTBENCH_FINGERPRINT_DIR=dir` also writes each launch sequence there, one
//! launch a line, for a diff.

use ortbench_engine::backend::simt_device::SimtGpu;
use ortbench_engine::exec::gpu::support::GpuSupport;
use ortbench_engine::exec::gpu::GpuExecutor;
use ortbench_engine::exec::planned::CpuSupport;
use ortbench_engine::plan::{self, KernelSupport};
use ortbench_engine::DType;
use ortbench_models::graph::{build_training_graph, GraphOptions};
use ortbench_models::spec::builtin_config;
use ortbench_models::DataSource;
use ortbench_simt::Order;
use std::hash::{Hash, Hasher};

/// An H100-like device that records each launch (kernel, grid, block, shared memory, scalar
/// arguments; pointers as `P`) and GEMM shape, and runs nothing: the SIMT device as a recorder.
fn recorder() -> SimtGpu {
    SimtGpu::new(32, Order::Forward)
        .with_max_blocks(2112)
        .with_max_shared_bytes(227 * 1024)
        .recording()
        .dry_run()
}

fn hash_of<T: Hash>(t: &T) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

#[test]
#[ignore = "a tool: prints plan and launch fingerprints to compare across a refactor (module doc)"]
fn print_plan_and_launch_fingerprints() {
    let dir = std::env::var_os("ORTBENCH_FINGERPRINT_DIR");
    for name in ["bert-base-uncased", "gpt2"] {
        let cfg = builtin_config(name).unwrap();
        for dt in [DType::F32, DType::BF16] {
            let opts = GraphOptions::new(8, 128).with_dtype(dt);
            let model = build_training_graph(&cfg, &opts).unwrap();
            let g = &model.graph;
            let rules: [(&str, Box<dyn KernelSupport>); 2] = [
                ("cpu", Box::new(CpuSupport::for_graph(g, 2))),
                ("gpu", Box::new(GpuSupport::for_graph(g))),
            ];
            for (rule, k) in rules {
                let p = plan::build(g, &*k).unwrap();
                let h = hash_of(&format!("{p:?}"));
                println!(
                    "plan {name} {dt:?} {rule}: {} steps, hash {h:016x} | {}",
                    p.steps.len(),
                    p.summary(g)
                );
            }
            let batch = DataSource::synthetic(&cfg, 8, 128, 17).unwrap().batch(0);
            let feed = model.feed(&batch).unwrap();
            let mut ex = GpuExecutor::new(g, recorder()).unwrap();
            ex.device().take_trace();
            ex.queue_step(&feed.inputs(), 7).unwrap();
            // The launches and GEMMs (not the step's one upload of its block and inputs).
            let t: Vec<String> = ex
                .device()
                .take_trace()
                .into_iter()
                .filter(|l| !l.starts_with("upload_pinned"))
                .collect();
            let gemms = t.iter().filter(|l| l.starts_with("gemm")).count();
            println!(
                "launches {name} {dt:?}: {} ({} kernels, {gemms} GEMMs), hash {:016x}",
                t.len(),
                t.len() - gemms,
                hash_of(&t)
            );
            if let Some(d) = &dir {
                let f = std::path::Path::new(d).join(format!("launches-{name}-{dt:?}.txt"));
                std::fs::write(f, t.join("\n")).unwrap();
            }
        }
    }
}
