//! With the `torch` feature: embeds libtorch's library directory as an rpath of this crate's
//! binaries (torch-sys exports it as DEP_TCH_LIBTORCH_LIB), so they run without
//! LD_LIBRARY_PATH, and compiles the small autocast shim against libtorch's headers.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-changed=src/torch/autocast.cpp");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else { return };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    let root = std::path::Path::new(&lib).parent().expect("libtorch/lib has a parent").to_path_buf();
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .file("src/torch/autocast.cpp")
        .compile("ortbench_autocast");
}
