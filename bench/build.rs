//! Gives this crate's binaries two rpath (RUNPATH) entries to find libtorch without
//! LD_LIBRARY_PATH: first `$ORIGIN/torch-lib` (literally: the loader expands it to the binary's
//! folder), so that a binary carried to another machine finds that machine's torch through a
//! `torch-lib` link beside it (`ln -sfn .../site-packages/torch/lib torch-lib`), then the build
//! machine's libtorch directory (torch-sys exports it as DEP_TCH_LIBTORCH_LIB). Records that
//! directory and the compiler's version for `ortbench env`.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/torch-lib");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        println!("cargo:rustc-env=ORTBENCH_LIBTORCH_LIB={dir}");
    } else {
        println!("cargo:rustc-env=ORTBENCH_LIBTORCH_LIB=");
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default();
    println!("cargo:rustc-env=ORTBENCH_RUSTC_VERSION={}", version.trim());
}
