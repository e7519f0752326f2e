//! Embeds libtorch's library directory as an rpath of this crate's test binaries, so they
//! find libtorch without LD_LIBRARY_PATH (torch-sys exports it as DEP_TCH_LIBTORCH_LIB), after
//! `$ORIGIN/torch-lib`: a link beside a test binary carried to another machine, to that
//! machine's torch/lib (as bench/build.rs).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/torch-lib");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
