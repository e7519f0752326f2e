//! The compile gate: every GPU kernel file compiles with NVRTC (the torch wheel's libnvrtc and
//! CUDA headers) for sm_80 (A100) and sm_90 (H100/H200), no GPU needed; and the kernels NVRTC
//! finds are exactly the ones the host SIMT harness registered (so none escapes its tests).
//!
//! Each file is compiled once per architecture, always by NVRTC (no cache is read: the gate
//! compiles), and the PTX is written to the kernel cache (`kernel_cache::cache_dir`), so a GPU
//! opened afterwards in the same cache (scripts/gpu-validate's) loads it instead of compiling
//! the sm_90 files again.
//!
//! It needs NVRTC, so it is `#[ignore]`d: a plain `cargo test` lists it as ignored with the
//! reason instead of passing without compiling anything. scripts/test (which installs the wheel)
//! and scripts/gpu-validate run it with `--ignored`, and then a missing NVRTC is a failure.
#![cfg(feature = "cuda")]

use std::collections::BTreeSet;

use ortbench_engine::backend::cuda::{kernel_cache, libs};
use ortbench_engine::backend::gpu_sources;

const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

#[test]
#[ignore = "needs NVRTC (the torch wheel's); scripts/test runs it with --ignored"]
fn every_kernel_compiles_for_sm80_and_sm90_and_matches_the_simt_registry() {
    if let Err(e) = libs::load(libs::CudaLib::Nvrtc) {
        panic!("this test needs NVRTC (scripts/setup installs the torch wheel with it): {e}");
    }
    let mut entries = BTreeSet::new();
    for arch in ARCHS {
        // The files compile side by side (gpu_sources::map_files), each on one thread.
        let per_file = gpu_sources::map_files(|file| {
            let t = std::time::Instant::now();
            let ptx = kernel_cache::compile_ptx(file, arch).unwrap_or_else(|e| panic!("{e}"));
            let key = kernel_cache::key(file, arch).unwrap_or_else(|e| panic!("{e}"));
            kernel_cache::store_ptx(file, arch, key, &ptx);
            let names = gpu_sources::ptx_entries(&ptx);
            assert!(!names.is_empty(), "{file} for {arch}: no kernel entry in the PTX");
            eprintln!(
                "{file:>18} {arch}: {:>3} kernels, {:.1} s",
                names.len(),
                t.elapsed().as_secs_f64()
            );
            names
        });
        let this_arch: BTreeSet<String> = per_file.into_iter().flatten().collect();
        if !entries.is_empty() {
            assert_eq!(entries, this_arch, "{arch} compiled a different set of kernels");
        }
        entries = this_arch;
    }
    let simt: BTreeSet<String> =
        ortbench_simt::kernel_names().into_iter().filter(|n| !n.starts_with("selftest_")).collect();
    let only_gpu: Vec<_> = entries.difference(&simt).collect();
    let only_host: Vec<_> = simt.difference(&entries).collect();
    assert!(only_gpu.is_empty() && only_host.is_empty(), "kernels NVRTC built but the SIMT harness did not register (ORT_REGISTER missing?): {only_gpu:?}; registered on the host only (not in gpu_sources::SOURCES?): {only_host:?}");
    eprintln!(
        "{} kernels in {} files compiled for {ARCHS:?}",
        entries.len(),
        gpu_sources::SOURCES.len()
    );
}

#[test]
fn opening_a_gpu_is_an_error_or_a_device_never_a_panic() {
    match ortbench_engine::backend::cuda::open(0) {
        Ok(d) => {
            eprintln!("GPU 0: {} ({})", d.name(), d.arch());
            // scripts/gpu-validate's preflight reads these lines: did the pack's cubins load?
            for (file, origin) in d.kernel_origins() {
                eprintln!("kernels {file}: {origin}");
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("libcuda") || msg.contains("CUDA driver"), "{msg}");
            eprintln!("no GPU here, as expected: {msg}");
        }
    }
}
