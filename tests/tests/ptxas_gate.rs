//! The static resource gate: what an H100 (and an A100) would give each kernel, without a GPU.
//!
//! Every kernel file (`engine/kernels/*.cu`) is compiled by NVRTC for sm_90 and sm_80 (the PTX
//! the engine loads on those GPUs; the kernel cache's copy where the NVRTC gate has just stored
//! it under the same key) and assembled by `ptxas -v` (the CUDA 13.0 of the torch
//! wheel's NVRTC, installed by scripts/setup as `nvidia-cuda-nvcc`) for sm_90a and sm_80.
//! ptxas reports per kernel its registers, spill stores and loads, stack frame and static
//! shared memory — what decides occupancy and what no emulator sees. Beside them, the block
//! size and the largest dynamic shared memory the GPU executor launches each kernel with, taken
//! from whole training steps (bert-base, gpt2 and smollm2-135m — the Llama family's RMSNorm,
//! rotary, SwiGLU and grouped-query attention — at head dim 64, fp32 / bf16 / fp16, the LM
//! head fused and not) recorded on a device that runs nothing, with the target's geometry
//! (warp 32, its opt-in shared memory per block). From those, the blocks and warps per SM
//! (CUDA's occupancy calculator: registers allocated per warp in units of 256 of 65 536,
//! 64 warps and 32 blocks per SM, shared memory in units of 128 bytes plus 1 KiB reserved per
//! block, of 228 KiB per SM on an H100 and 164 KiB on an A100).
//!
//! The gate fails on a spill in a kernel the executor launches, on shared memory above the
//! device's per-block limit (227 / 163 KiB) at the largest tile it is launched with, and on
//! fewer than one block per SM. The table is docs/gpu-kernels.md's "Registers, spills and
//! occupancy" section, between its markers: this test fails when the doc's table is not the one
//! it computes, and `scripts/ptxas-table` writes it (`ORTBENCH_UPDATE_DOCS=1`).
//!
//! `ORTBENCH_CUBIN_OUT=dir` also writes the sm_90a cubins there under the kernel cache's keys
//! (`kernel_cache::store_cubin`): `scripts/gpu-validate --pack` packs them, so the GPU machine
//! loads them instead of compiling (they are written before the checks, so a failing gate
//! still leaves them).
//!
//! It needs NVRTC and ptxas, so it is `#[ignore]`d: scripts/test runs it with `--ignored`, and
//! then a missing ptxas fails it in one line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ortbench_engine::backend::cuda::{kernel_cache, libs};
use ortbench_engine::backend::gpu_sources;
use ortbench_engine::backend::simt_device::SimtGpu;
use ortbench_engine::exec::gpu::session::GpuSession;
use ortbench_engine::optim::{AdamWConfig, LossScaler, Segment};
use ortbench_engine::passes::PassConfig;
use ortbench_engine::DType;
use ortbench_models::graph::{build_training_graph, GraphOptions};
use ortbench_models::spec::builtin_config;
use ortbench_models::{DataSource, Weights};
use ortbench_simt::Order;

/// A target: NVRTC's architecture, ptxas's, and the SM's limits (CUDA C Programming Guide,
/// "Compute capabilities" table; the occupancy calculator's allocation units).
struct Target {
    gpu: &'static str,
    nvrtc: &'static str,
    ptxas: &'static str,
    sms: u32,
    smem_per_sm: u32,
    smem_per_block: u32,
}

const TARGETS: [Target; 2] = [
    Target {
        gpu: "H100",
        nvrtc: "sm_90",
        ptxas: "sm_90a",
        sms: 132,
        smem_per_sm: 228 * 1024,
        smem_per_block: 227 * 1024,
    },
    Target {
        gpu: "A100",
        nvrtc: "sm_80",
        ptxas: "sm_80",
        sms: 108,
        smem_per_sm: 164 * 1024,
        smem_per_block: 163 * 1024,
    },
];
const REGS_PER_SM: u32 = 65_536;
const REG_UNIT: u32 = 256;
const WARPS_PER_SM: u32 = 64;
const BLOCKS_PER_SM: u32 = 32;
const SMEM_UNIT: u32 = 128;
const SMEM_RESERVED: u32 = 1024;

/// What ptxas says of one kernel.
#[derive(Debug, Default, Clone, PartialEq)]
struct Resources {
    regs: u32,
    stack: u32,
    spill_stores: u32,
    spill_loads: u32,
    smem: u32,
}

/// Parses `ptxas -v` output: per entry function its registers, static shared memory, stack
/// frame and spills (lines "Compiling entry function 'k'", "Function properties for k" and the
/// line after it, "Used N registers, … N bytes smem, …").
fn parse_ptxas(log: &str) -> BTreeMap<String, Resources> {
    let mut out: BTreeMap<String, Resources> = BTreeMap::new();
    let (mut entry, mut props): (Option<String>, Option<String>) = (None, None);
    let num = |s: &str, after: &str| -> Option<u32> {
        let i = s.find(after)?;
        s[..i].split(|c: char| !c.is_ascii_digit()).rfind(|w| !w.is_empty())?.parse().ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap().to_string();
            out.entry(name.clone()).or_default();
            entry = Some(name);
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            props = Some(rest.trim().to_string());
        } else if line.contains("bytes stack frame") {
            if let Some(r) = props.take().and_then(|p| out.get_mut(&p)) {
                r.stack = num(line, " bytes stack frame").unwrap_or(0);
                r.spill_stores = num(line, " bytes spill stores").unwrap_or(0);
                r.spill_loads = num(line, " bytes spill loads").unwrap_or(0);
            }
        } else if line.contains("Used ") && line.contains(" registers") {
            if let Some(r) = entry.take().and_then(|e| out.get_mut(&e)) {
                r.regs = num(line, " registers").unwrap_or(0);
                r.smem = num(line, " bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

/// Blocks of `block` threads using `regs` registers a thread and `smem` bytes of shared memory
/// (static + dynamic) that fit one SM of `t`.
fn blocks_per_sm(t: &Target, block: u32, regs: u32, smem: u32) -> u32 {
    let warps = block.div_ceil(32);
    let by_warps = WARPS_PER_SM / warps;
    let per_warp = (regs * 32).div_ceil(REG_UNIT) * REG_UNIT;
    let by_regs = REGS_PER_SM.checked_div(per_warp).map_or(BLOCKS_PER_SM, |w| w / warps);
    let per_block = (smem + SMEM_RESERVED).div_ceil(SMEM_UNIT) * SMEM_UNIT;
    let by_smem = t.smem_per_sm / per_block;
    BLOCKS_PER_SM.min(by_warps).min(by_regs).min(by_smem)
}

/// ptxas of the torch wheel's CUDA: `ORTBENCH_PTXAS`, else `bin/ptxas` beside the folder
/// libnvrtc is found in (`nvidia/cu13/bin`), else on PATH.
fn ptxas() -> PathBuf {
    let mut cands: Vec<PathBuf> =
        std::env::var_os("ORTBENCH_PTXAS").map(PathBuf::from).into_iter().collect();
    cands
        .extend(libs::search_dirs().iter().filter_map(|d| d.parent().map(|p| p.join("bin/ptxas"))));
    if let Some(path) = std::env::var_os("PATH") {
        cands.extend(std::env::split_paths(&path).map(|d| d.join("ptxas")));
    }
    cands.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("ptxas not found (ORTBENCH_PTXAS, nvidia/cu13/bin beside libnvrtc, PATH): scripts/setup installs nvidia-cuda-nvcc")
    })
}

/// `release M.m` of `ptxas --version`, which must be NVRTC's: the pack's cubins are keyed by it.
fn check_versions(ptxas: &Path) {
    let out = Command::new(ptxas).arg("--version").output().expect("ptxas --version");
    let text = String::from_utf8_lossy(&out.stdout);
    let (major, minor) = kernel_cache::nvrtc_version().unwrap_or_else(|e| panic!("{e}"));
    let want = format!("release {major}.{minor},");
    assert!(text.contains(&want), "ptxas is not NVRTC's CUDA {major}.{minor}: {text}");
}

/// nvdisasm, installed beside ptxas (nvidia-cuda-nvdisasm).
fn nvdisasm(ptxas: &Path) -> PathBuf {
    let p = ptxas.with_file_name("nvdisasm");
    assert!(
        p.is_file(),
        "nvdisasm not found beside {}: scripts/setup installs nvidia-cuda-nvdisasm",
        ptxas.display()
    );
    p
}

/// Per kernel of a cubin, how many of its SASS instructions start with each of `ops`
/// (nvdisasm's listing: a `.text.<kernel>:` section per kernel, one instruction a line).
fn sass_counts(nvdisasm: &Path, cubin: &Path, ops: &[&str]) -> BTreeMap<String, Vec<usize>> {
    let out = Command::new(nvdisasm).arg(cubin).output().unwrap();
    assert!(
        out.status.success(),
        "nvdisasm {}: {}",
        cubin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut counts: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut cur: Option<String> = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let l = line.trim();
        if let Some(name) = l.strip_prefix(".text.").and_then(|s| s.strip_suffix(':')) {
            cur = Some(name.to_string());
            counts.insert(name.to_string(), vec![0; ops.len()]);
            continue;
        }
        // An instruction line: `/*0040*/  HMMA.16816.F32.BF16 R4, R8, R12, R4 ;`.
        let (Some(k), Some(op)) = (&cur, l.split("*/").nth(1).map(str::trim)) else { continue };
        for (i, o) in ops.iter().enumerate() {
            if op.split_whitespace().any(|w| w.starts_with(o)) {
                counts.get_mut(k).unwrap()[i] += 1;
            }
        }
    }
    counts
}

/// The static proof that the tensor-core kernels use tensor cores: in the sm_90a cubin of every
/// `*_mma.cu` file, each kernel has HMMA (mma.sync) and LDSM (ldmatrix) instructions.
fn check_tensor_cores(t: &Target, nvdisasm: &Path, dir: &Path) {
    for (file, _) in gpu_sources::SOURCES.iter().filter(|(f, _)| f.ends_with("_mma.cu")) {
        let cubin = dir.join(format!("{}-{}.cubin", file.trim_end_matches(".cu"), t.ptxas));
        let counts = sass_counts(nvdisasm, &cubin, &["HMMA", "LDSM"]);
        assert!(!counts.is_empty(), "{file}: no kernel in the {} cubin", t.ptxas);
        for (k, c) in &counts {
            assert!(
                c[0] > 0 && c[1] > 0,
                "{k} ({}): {} HMMA and {} LDSM instructions in its SASS",
                t.ptxas,
                c[0],
                c[1]
            );
        }
        let (lo, hi) =
            counts.values().fold((usize::MAX, 0), |(a, b), c| (a.min(c[0]), b.max(c[0])));
        println!("{file} {}: {} kernels, {lo}–{hi} HMMA each", t.ptxas, counts.len());
    }
}

/// Every kernel file for `t`: PTX by NVRTC (or the kernel cache), assembled by ptxas -v; the
/// resources per kernel.
/// Under `ORTBENCH_CUBIN_OUT`, sm_90 cubins are stored there for the pack.
fn assemble(t: &Target, ptxas: &Path, dir: &Path) -> BTreeMap<String, Resources> {
    let cubin_out = std::env::var_os("ORTBENCH_CUBIN_OUT").map(PathBuf::from);
    // Side by side (gpu_sources::map_files). The PTX is the kernel cache's under the file's key
    // (NVRTC version, source, options, architecture), which the NVRTC gate has just compiled
    // and stored when scripts/test runs both; NVRTC compiles it here otherwise.
    let per_file = gpu_sources::map_files(|file| {
        let key = kernel_cache::key(file, t.nvrtc).unwrap_or_else(|e| panic!("{e}"));
        let (ptx, _) = kernel_cache::ptx(file, t.nvrtc, key).unwrap_or_else(|e| panic!("{e}"));
        let stem = format!("{}-{}", file.trim_end_matches(".cu"), t.ptxas);
        let (src, bin) = (dir.join(format!("{stem}.ptx")), dir.join(format!("{stem}.cubin")));
        std::fs::write(&src, &ptx).unwrap();
        let out = Command::new(ptxas)
            .args(["-v", &format!("-arch={}", t.ptxas), "-o"])
            .args([&bin, &src])
            .output()
            .unwrap();
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "ptxas -arch={} {file}:\n{log}", t.ptxas);
        let res = parse_ptxas(&log);
        let entries = gpu_sources::ptx_entries(&ptx);
        let mut got: Vec<&String> = res.keys().collect();
        got.sort();
        assert_eq!(got, entries.iter().collect::<Vec<_>>(), "{file}: ptxas's entries vs the PTX's");
        if let (Some(d), "sm_90") = (&cubin_out, t.nvrtc) {
            let cubin = std::fs::read(&bin).unwrap();
            kernel_cache::store_cubin(d, file, t.nvrtc, key, &cubin, &entries).unwrap();
        }
        res
    });
    per_file.into_iter().flatten().collect()
}

/// Per kernel the executor launches on `t`: (block size, largest dynamic shared memory), from
/// whole training steps (module comment) on a recording device that runs nothing.
fn launches(t: &Target) -> BTreeMap<String, (u32, u32)> {
    let mut seen: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    let unfused = PassConfig::all().with("fuse_linear_cross_entropy", false);
    for name in ["bert-base-uncased", "gpt2", "smollm2-135m"] {
        let cfg = builtin_config(name).unwrap();
        let weights = Weights::init(&cfg, 3);
        let runs = [
            (DType::F32, PassConfig::all()),
            (DType::BF16, PassConfig::all()),
            (DType::BF16, unfused),
            (DType::F16, PassConfig::all()),
        ];
        // smollm2: the head's fusion is bert's and gpt2's business; each dtype once (its
        // kernels are named by dtype), to keep the gate short.
        let llama = name == "smollm2-135m";
        for (k, &(dtype, passes)) in runs.iter().enumerate() {
            if llama && k == 2 {
                continue;
            }
            let opts = GraphOptions::new(1, 64).with_dtype(dtype).with_passes(passes);
            let model = build_training_graph(&cfg, &opts).unwrap();
            let params = model.flatten(&weights).unwrap();
            let n = params.len();
            let segs = vec![Segment { start: 0, len: n, decay: true }];
            let adamw = AdamWConfig { max_grad_norm: 1.0, ..AdamWConfig::default() };
            let dev = SimtGpu::new(32, Order::Forward)
                .with_max_blocks(t.sms * 16)
                .with_max_shared_bytes(t.smem_per_block)
                .recording()
                .dry_run();
            let g = model.graph.clone();
            let mut s = GpuSession::new(g, dev, &params, segs, adamw, dtype).unwrap();
            if dtype == DType::F16 {
                s.set_loss_scaler(Some(LossScaler::default()));
            }
            let batch = DataSource::synthetic(&cfg, 1, 64, 17).unwrap().batch(0);
            let feed = model.feed(&batch).unwrap();
            // A device that runs nothing reads back zeros: the step's statistics are
            // meaningless, its launches are the real ones.
            let _ = s.step(&feed.inputs(), 1e-4, 7);
            for line in s.executor().device().take_trace() {
                let f: Vec<&str> = line.split(' ').collect();
                // GEMMs, and the step's upload of its block and inputs, are not kernels.
                if matches!(f[0], "gemm" | "upload_pinned") {
                    continue;
                }
                let (block, smem): (u32, u32) = (f[2].parse().unwrap(), f[3].parse().unwrap());
                let e = seen.entry(f[0].to_string()).or_insert((block, smem));
                assert_eq!(e.0, block, "{} launched with blocks of {} and {block}", f[0], e.0);
                e.1 = e.1.max(smem);
            }
        }
    }
    seen
}

/// One target's rows: its resources per kernel and, per kernel the executor launches, the block
/// size and the largest dynamic shared memory.
type TargetRows<'a> = (&'a Target, BTreeMap<String, Resources>, BTreeMap<String, (u32, u32)>);

/// `a`, or `a / b` when the two targets differ.
fn pair(a: String, b: String) -> String {
    if a == b {
        a
    } else {
        format!("{a} / {b}")
    }
}

/// The table (markdown: a row per kernel, "sm_90a / sm_80" where the targets differ) and the
/// gate's failures.
fn table(rows: &[TargetRows<'_>]) -> (String, Vec<String>) {
    let mut md = String::from(
        "| kernel | regs | spills B | stack B | static smem B | block | dyn smem B (max) | blocks/SM | warps/SM |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut bad = Vec::new();
    let names: std::collections::BTreeSet<&String> = rows.iter().flat_map(|r| r.1.keys()).collect();
    for name in names {
        // Per target: [regs, spills, stack, static smem, block, dynamic smem, blocks, warps].
        let mut cols: Vec<[String; 8]> = Vec::new();
        for (t, res, launched) in rows {
            let r = &res[name];
            let spill = match (r.spill_stores, r.spill_loads) {
                (0, 0) => "0".to_string(),
                (st, ld) => format!("{st} st, {ld} ld"),
            };
            let mut c = [
                r.regs.to_string(),
                spill.clone(),
                r.stack.to_string(),
                r.smem.to_string(),
                "—".into(),
                "—".into(),
                "not launched".into(),
                "".into(),
            ];
            if let Some(&(block, dynamic)) = launched.get(name) {
                let b = blocks_per_sm(t, block, r.regs, r.smem + dynamic);
                if r.spill_stores + r.spill_loads > 0 {
                    bad.push(format!("{name} on {} ({}): spills {spill} bytes", t.ptxas, t.gpu));
                }
                if r.smem + dynamic > t.smem_per_block {
                    bad.push(format!(
                        "{name} on {} ({}): {} bytes of shared memory > {} a block",
                        t.ptxas,
                        t.gpu,
                        r.smem + dynamic,
                        t.smem_per_block
                    ));
                }
                if b == 0 {
                    bad.push(format!(
                        "{name} on {} ({}): no block of {block} threads × {} registers fits an SM",
                        t.ptxas, t.gpu, r.regs
                    ));
                }
                c[4] = block.to_string();
                c[5] = dynamic.to_string();
                c[6] = b.to_string();
                c[7] = (b * block.div_ceil(32)).to_string();
            }
            cols.push(c);
        }
        let cells: Vec<String> =
            (0..8).map(|i| pair(cols[0][i].clone(), cols[1][i].clone())).collect();
        md += &format!("| `{name}` | {} |\n", cells.join(" | "));
    }
    (md, bad)
}

const BEGIN: &str = "<!-- ptxas-table: begin (written by scripts/ptxas-table) -->\n";
const END: &str = "<!-- ptxas-table: end -->";

#[test]
#[ignore = "needs NVRTC and ptxas (scripts/setup installs both); scripts/test runs it with --ignored"]
fn every_kernel_fits_an_sm_without_spills_as_launched_on_sm90a_and_sm80() {
    if let Err(e) = libs::load(libs::CudaLib::Nvrtc) {
        panic!("this test needs NVRTC (scripts/setup installs the torch wheel with it): {e}");
    }
    let ptxas = ptxas();
    check_versions(&ptxas);
    let dir = tempfile::tempdir().unwrap();
    // The two targets side by side: their launches (whole steps on the recording device, most
    // of the gate's time) are independent.
    let rows: Vec<_> = std::thread::scope(|s| {
        let (dir, ptxas) = (dir.path(), &ptxas);
        let per_target: Vec<_> = TARGETS
            .iter()
            .map(|t| s.spawn(move || (t, assemble(t, ptxas, dir), launches(t))))
            .collect();
        per_target
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let nvdisasm = nvdisasm(&ptxas);
    for t in &TARGETS {
        check_tensor_cores(t, &nvdisasm, dir.path());
    }
    for (t, res, launched) in &rows {
        let unknown: Vec<_> = launched.keys().filter(|k| !res.contains_key(*k)).collect();
        assert!(unknown.is_empty(), "{}: launched but not in the PTX: {unknown:?}", t.ptxas);
    }
    let (md, bad) = table(&rows);
    println!("{md}");
    assert!(bad.is_empty(), "the resource gate failed:\n{}", bad.join("\n"));
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/gpu-kernels.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/gpu-kernels.md has no ptxas-table markers")
    };
    let current = &doc[b + BEGIN.len()..e];
    if std::env::var("ORTBENCH_UPDATE_DOCS").as_deref() == Ok("1") {
        let new = format!("{}{BEGIN}{md}{}", &doc[..b], &doc[e..]);
        std::fs::write(&doc_path, new).unwrap();
        println!("wrote the table into {}", doc_path.display());
    } else {
        assert!(current == md, "docs/gpu-kernels.md's ptxas table is not the one computed now: run scripts/ptxas-table");
    }
}

#[test]
fn ptxas_output_is_parsed_per_entry_and_occupancy_follows_the_calculator() {
    let log = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_a' for 'sm_90a'
ptxas info    : Function properties for k_a
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 72 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'k_b' for 'sm_90a'
ptxas info    : Function properties for k_b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, used 0 barriers, 380 bytes cmem[0]
";
    let r = parse_ptxas(log);
    assert_eq!(
        r["k_a"],
        Resources { regs: 72, stack: 8, spill_stores: 4, spill_loads: 12, smem: 2048 }
    );
    assert_eq!(r["k_b"], Resources { regs: 16, ..Resources::default() });
    let h100 = &TARGETS[0];
    // 256 threads × 72 registers: 2304 a warp, 28 warps' worth of registers → 3 blocks of 8.
    assert_eq!(blocks_per_sm(h100, 256, 72, 0), 3);
    // 32 registers: warps limit (64 / 8 = 8 blocks).
    assert_eq!(blocks_per_sm(h100, 256, 32, 0), 8);
    // Small blocks: the 32-block limit.
    assert_eq!(blocks_per_sm(h100, 32, 16, 0), 32);
    // Shared memory: 100 KiB + 1 KiB reserved twice fits 228 KiB, three times not.
    assert_eq!(blocks_per_sm(h100, 128, 32, 100 * 1024), 2);
    // 1024 threads × 255 registers: no block fits.
    assert_eq!(blocks_per_sm(h100, 1024, 255, 0), 0);
}
