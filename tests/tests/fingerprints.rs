//! A refactoring tool, not a check: prints a fingerprint of the engine's memory plans (CPU and
//! GPU kernel rules) and of the GPU executor's launches for one training step, for bert-base and
//! gpt2 at b8 × s128 in f32 and bf16 — step and launch counts and a hash of everything but
//! addresses. Run it before and after a change that must not alter what runs, and compare:
//!
//! `cargo test --release -p ortbench-tests --test fingerprints -- --ignored --nocapture`
//!
//! The launches are recorded by a device that runs nothing (`Rec`), so the full-size models
//! take seconds. `ORTBENCH_FINGERPRINT_DIR=dir` also writes each launch sequence there, one
//! launch a line, for a diff.

use ortbench_engine::backend::gpu::{GemmPtrs, GemmShape, GpuDevice, GpuError, KernelArg};
use ortbench_engine::exec::gpu::support::GpuSupport;
use ortbench_engine::exec::gpu::GpuExecutor;
use ortbench_engine::exec::planned::CpuSupport;
use ortbench_engine::plan::{self, KernelSupport};
use ortbench_engine::DType;
use ortbench_models::graph::{build_training_graph, GraphOptions};
use ortbench_models::spec::builtin_config;
use ortbench_models::DataSource;
use std::cell::RefCell;
use std::hash::{Hash, Hasher};

/// An H100-like device that records each launch (kernel, grid, block, shared memory, scalar
/// arguments; pointers as `P`) and GEMM shape, and runs nothing.
struct Rec(RefCell<Vec<String>>);
struct HostBuf(Box<[u128]>);
impl GpuDevice for Rec {
    type Buffer = HostBuf;
    fn describe(&self) -> String {
        "recorder".into()
    }
    fn warp_size(&self) -> u32 {
        32
    }
    fn max_blocks(&self) -> u32 {
        2112
    }
    fn max_shared_bytes(&self) -> u32 {
        227 * 1024
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
    unsafe fn launch(
        &self,
        name: &str,
        grid: u32,
        block: u32,
        smem: u32,
        args: &[KernelArg],
    ) -> Result<(), GpuError> {
        let a: Vec<String> = args
            .iter()
            .map(|a| match a {
                KernelArg::Ptr(_) => "P".to_string(),
                o => format!("{o:?}"),
            })
            .collect();
        self.0.borrow_mut().push(format!("{name} {grid} {block} {smem} {}", a.join(",")));
        Ok(())
    }
    unsafe fn gemm(&self, s: &GemmShape, _p: &GemmPtrs) -> Result<(), GpuError> {
        self.0.borrow_mut().push(format!("gemm {s:?}"));
        Ok(())
    }
    fn synchronize(&self) -> Result<(), GpuError> {
        Ok(())
    }
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
            let mut ex = GpuExecutor::new(g, Rec(RefCell::new(Vec::new()))).unwrap();
            ex.device().0.borrow_mut().clear();
            ex.queue_step(&feed.inputs(), 7).unwrap();
            let t = ex.device().0.borrow().clone();
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
