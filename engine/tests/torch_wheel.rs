//! The torch wheel's folders are found at run time from torch's own location, whatever the
//! Python version (`ortbench_engine::torch_wheel`), in a process that does not link libtorch
//! (this test binary: the engine has no tch), so only `$VIRTUAL_ENV` and the Python on it can
//! say where torch is. The CUDA libraries, NCCL and the CUDA headers follow from there, and no
//! source file names a Python version's folder.
//!
//! Needs the project's venv (`scripts/env.sh` sets VIRTUAL_ENV; scripts/setup installs torch).

use std::path::{Path, PathBuf};

use ortbench_engine::torch_wheel::{self, Source};

fn venv() -> PathBuf {
    PathBuf::from(
        std::env::var_os("VIRTUAL_ENV").expect("VIRTUAL_ENV is set (source scripts/env.sh)"),
    )
}

#[test]
fn python_alone_finds_the_wheel_and_its_cuda_folders() {
    assert_eq!(torch_wheel::from_mapped(), None, "the engine's test binary does not link libtorch");
    let python = venv().join("bin/python3");
    let w =
        torch_wheel::from_python(python.to_str().unwrap()).expect("the venv's python has torch");
    assert_eq!(w.source, Source::Python);
    assert!(w.lib_dir().join(torch_wheel::LIBTORCH_CPU).is_file());
    let site = w.site_packages();
    assert_eq!(site.file_name().unwrap(), "site-packages", "{}", site.display());
    // The same folder through $VIRTUAL_ENV (any python3.* under lib/), and through `find`,
    // which has no libtorch mapped and no torch-lib link beside this binary to go by.
    assert_eq!(
        torch_wheel::from_virtual_env(&venv()).map(|v| v.torch_dir),
        Some(w.torch_dir.clone())
    );
    let found = torch_wheel::find().expect("found");
    assert_eq!((found.source, &found.torch_dir), (Source::VirtualEnv, &w.torch_dir));
    // The torch 2.11 (cu130) wheel's layout: CUDA 13 in nvidia/cu13, NCCL in nvidia/nccl.
    let cu13 = site.join("nvidia/cu13/lib");
    assert_eq!(w.cuda_lib_dirs(), vec![cu13.clone()]);
    for lib in ["libcudart.so.13", "libnvrtc.so.13", "libcublasLt.so.13"] {
        assert!(cu13.join(lib).is_file(), "{lib} in {}", cu13.display());
    }
    assert_eq!(w.nccl_lib_dir(), Some(site.join("nvidia/nccl/lib")));
    assert!(site.join("nvidia/nccl/lib/libnccl.so.2").is_file());
}

#[cfg(feature = "cuda")]
#[test]
fn the_cuda_backend_searches_the_wheel_found_at_run_time() {
    let site = torch_wheel::torch_wheel().expect("found").site_packages();
    let dirs = ortbench_engine::backend::cuda::libs::search_dirs();
    assert!(dirs.contains(&site.join("nvidia/cu13/lib")), "{dirs:?}");
    let nvrtc = ortbench_engine::backend::cuda::libs::candidates(
        ortbench_engine::backend::cuda::libs::CudaLib::Nvrtc,
    );
    assert!(nvrtc.contains(&site.join("nvidia/cu13/lib/libnvrtc.so.13")), "{nvrtc:?}");
    // NVRTC's headers: nvidia/cu13/include beside the library folder.
    if std::env::var_os("ORTBENCH_CUDA_INCLUDE_DIR").is_none() {
        assert_eq!(
            ortbench_engine::backend::gpu_sources::include_dir(&dirs),
            Some(site.join("nvidia/cu13/include"))
        );
    }
}

/// Files under `dir` (no build output, venvs or git internals).
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&p, out),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
}

#[test]
fn no_source_names_a_python_version_folder() {
    // Built here so that this file does not contain what it looks for.
    let needle = format!("python3.{}", 11);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for d in ["bench", "engine", "models", "tests", "report", "scripts"] {
        walk(&root.join(d), &mut files);
    }
    assert!(files.len() > 50, "walked {} files under {}", files.len(), root.display());
    let sources = ["rs", "toml", "sh", "py", "cpp", "h", "cu", "cuh"];
    let offenders: Vec<String> = files
        .iter()
        .filter(|p| p.extension().is_none_or(|e| sources.contains(&e.to_string_lossy().as_ref())))
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains(&needle)))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "{needle} in {offenders:?}: find torch with ortbench_engine::torch_wheel instead"
    );
}
