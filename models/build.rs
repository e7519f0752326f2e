//! With the `torch` feature: gives this crate's binaries the rpath entries `$ORIGIN/torch-lib`
//! (a link beside a carried binary to the machine's torch/lib) and then libtorch's library
//! directory on the build machine (torch-sys exports it as DEP_TCH_LIBTORCH_LIB), so they run
//! without LD_LIBRARY_PATH (as bench/build.rs), and compiles the small ATen shims (autocast,
//! fused AdamW) against libtorch's headers.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-changed=src/torch/autocast.cpp");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else { return };
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/torch-lib");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    let root =
        std::path::Path::new(&lib).parent().expect("libtorch/lib has a parent").to_path_buf();
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        // libtorch's release build: some ATen classes (RecordFunction) have debug-only
        // members, so the shim must see the same layout.
        .define("NDEBUG", None)
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .file("src/torch/autocast.cpp");
    // Worktrees of this repository share one target dir, where cargo keys build scripts by
    // workspace-relative path: this script may run for a checkout without the fused-AdamW
    // shim. Such a checkout does not reference its symbols, so compile it only where present.
    if std::path::Path::new("src/torch/optim.cpp").exists() {
        println!("cargo:rerun-if-changed=src/torch/optim.cpp");
        build.file("src/torch/optim.cpp");
    }
    build.compile("ortbench_autocast");
}
