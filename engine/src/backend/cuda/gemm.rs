//! GEMMs on cuBLASLt: a thin wrapper of ours over cudarc's `cublaslt::result`/`sys` layers.
//!
//! Why not cudarc's safe `Matmul`: it rebuilds every descriptor and re-runs the algorithm
//! heuristic on each call, has no `GELU_AUX_BIAS` (keeping the pre-activation for the backward),
//! `DGELU` or `BGRADB` epilogues, and forces one type for A, B and C. Here a [`GemmShape`] (the
//! planned executor's matmul, its dtype and epilogue) maps to a [`Plan`] — descriptor, layouts
//! and the heuristic's algorithm — built on first use and cached, as llm.c's `matmul_cublaslt`
//! and ORT's cuBLASLt path do; per call only the pointers are set. A plan is keyed by the shape
//! *and* the operands' alignments ([`GemmAlign`]), which it passes to the heuristic as the
//! `MIN_ALIGNMENT_*` preferences: an algorithm chosen for 256-byte-aligned pointers may not run
//! on 16-byte-aligned ones.
//!
//! Precision: bf16/fp16 inputs and outputs with f32 accumulation and f32 α/β
//! (`CUBLAS_COMPUTE_32F`); f32 with TF32 off (`CUBLAS_COMPUTE_32F`) unless the shape asks for
//! TF32 (`CUBLAS_COMPUTE_32F_FAST_TF32`), so fp32 runs compute what the CPU engine computes.
//!
//! Layout: the engine is row-major, cuBLAS column-major. A row-major C = op(A)·op(B) is, read
//! as column-major, Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLAS is called with A and B swapped and m, n swapped,
//! the transposes kept ([`ColMajor::from_row_major`], unit-tested against a plain loop GEMM).
//! The bias of the `BIAS`/`GELU_AUX_BIAS` epilogues then runs along cuBLAS's rows = the
//! engine's columns (the output features), which is what a linear layer needs.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::{result, sys};

use super::device::{CudaDevice, DeviceBuffer};
use super::CudaError;
pub use crate::backend::gpu::{Epilogue, GemmAlign, GemmDtype, GemmPtrs, GemmShape};

/// The same GEMM as cuBLAS (column-major) sees it: D = op(A')·op(B'), A' = the engine's B.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColMajor {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    /// Stored shapes (rows, cols) of A' and B' as cuBLAS lays them out, and their lds.
    pub a_rows: u64,
    pub a_cols: u64,
    pub lda: i64,
    pub b_rows: u64,
    pub b_cols: u64,
    pub ldb: i64,
    pub ldc: i64,
    pub stride_a: i64,
    pub stride_b: i64,
}

impl ColMajor {
    /// Row-major C = op(A)·op(B) as column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: swap the operands and m/n.
    pub fn from_row_major(s: &GemmShape) -> ColMajor {
        // cuBLAS's A' is the engine's B: n×k after op, stored (col-major) as k×n untransposed.
        let (a_rows, a_cols) = if s.tb { (s.k, s.n) } else { (s.n, s.k) };
        let (b_rows, b_cols) = if s.ta { (s.m, s.k) } else { (s.k, s.m) };
        ColMajor {
            trans_a: s.tb,
            trans_b: s.ta,
            m: s.n,
            n: s.m,
            k: s.k,
            a_rows,
            a_cols,
            lda: s.ldb,
            b_rows,
            b_cols,
            ldb: s.lda,
            ldc: s.ldc,
            stride_a: s.stride_b,
            stride_b: s.stride_a,
        }
    }
}

/// Descriptors and the chosen algorithm of one shape. It owns its handles from the moment each
/// is created: a plan given up half-built (an attribute refused, no algorithm found) frees
/// what it holds on drop, as a cached one does when the [`Gemm`] goes.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each non-null handle was created for this plan and is destroyed once.
        unsafe {
            for l in [self.a, self.b, self.c] {
                if !l.is_null() {
                    let _ = result::destroy_matrix_layout(l);
                }
            }
            if !self.desc.is_null() {
                let _ = result::destroy_matmul_desc(self.desc);
            }
        }
    }
}

/// A matmul preference, destroyed when it goes out of scope (on every path).
struct Pref(sys::cublasLtMatmulPreference_t);

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by create_matmul_pref and destroyed once, here.
        let _ = unsafe { result::destroy_matmul_pref(self.0) };
    }
}

/// cuBLASLt handle, workspace and the plans of every shape seen so far.
pub struct Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: DeviceBuffer,
    plans: HashMap<(GemmShape, GemmAlign), Plan>,
}

/// cuBLASLt's recommended workspace on Hopper (32 MiB; 4 MiB suffices before it).
const WORKSPACE_BYTES: usize = 32 << 20;

fn lt_err(what: &str, e: result::CublasError) -> CudaError {
    CudaError::Driver(format!("cuBLASLt {what}: {e:?}"))
}

fn data_type(d: GemmDtype) -> sys::cudaDataType {
    match d {
        GemmDtype::F32 { .. } => sys::cudaDataType::CUDA_R_32F,
        GemmDtype::F16 => sys::cudaDataType::CUDA_R_16F,
        GemmDtype::BF16 => sys::cudaDataType::CUDA_R_16BF,
    }
}

fn compute_type(d: GemmDtype) -> sys::cublasComputeType_t {
    match d {
        GemmDtype::F32 { tf32: true } => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        _ => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
    }
}

fn epilogue(e: Epilogue) -> sys::cublasLtEpilogue_t {
    match e {
        Epilogue::None | Epilogue::Accumulate => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
        Epilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
        Epilogue::BiasGeluAux => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        Epilogue::DGelu => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DGELU,
        Epilogue::BGradB => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BGRADB,
    }
}

/// Sets one descriptor attribute from a plain value.
unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<(), CudaError> {
    result::set_matmul_desc_attribute(
        desc,
        attr,
        v as *const T as *const c_void,
        std::mem::size_of::<T>(),
    )
    .map_err(|e| lt_err("set attribute", e))
}

fn layout(
    dt: GemmDtype,
    rows: u64,
    cols: u64,
    ld: i64,
    batch: i32,
    stride: i64,
) -> Result<sys::cublasLtMatrixLayout_t, CudaError> {
    let l = result::create_matrix_layout(data_type(dt), rows, cols, ld)
        .map_err(|e| lt_err("layout", e))?;
    if batch > 1 {
        // SAFETY: `l` was just created; the values are plain integers of the documented types.
        unsafe {
            result::set_matrix_layout_attribute(
                l,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                &batch as *const i32 as *const c_void,
                4,
            )
            .map_err(|e| lt_err("batch count", e))?;
            result::set_matrix_layout_attribute(
                l,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                &stride as *const i64 as *const c_void,
                8,
            )
            .map_err(|e| lt_err("batch stride", e))?;
        }
    }
    Ok(l)
}

impl Gemm {
    pub fn new(dev: &CudaDevice) -> Result<Gemm, CudaError> {
        super::libs::load(super::libs::CudaLib::CublasLt)?;
        let handle = result::create_handle().map_err(|e| lt_err("create handle", e))?;
        let workspace = dev.alloc(WORKSPACE_BYTES)?;
        Ok(Gemm { handle, workspace, plans: HashMap::new() })
    }

    fn plan(&mut self, s: &GemmShape, al: GemmAlign) -> Result<&Plan, CudaError> {
        let key = (*s, al);
        if !self.plans.contains_key(&key) {
            let plan = self.new_plan(s, al)?;
            self.plans.insert(key, plan);
        }
        Ok(&self.plans[&key])
    }

    /// The descriptors of shape `s` at alignments `al` and the heuristic's algorithm for them.
    fn new_plan(&self, s: &GemmShape, al: GemmAlign) -> Result<Plan, CudaError> {
        let cm = ColMajor::from_row_major(s);
        use std::ptr::null_mut as null;
        // SAFETY: cublasLtMatmulAlgo_t is plain data (its fields are opaque u64 words), set by
        // the heuristic below before the plan is used.
        let algo = unsafe { std::mem::zeroed() };
        let mut plan = Plan { desc: null(), a: null(), b: null(), c: null(), algo };
        plan.desc =
            result::create_matmul_desc(compute_type(s.dtype), sys::cudaDataType::CUDA_R_32F)
                .map_err(|e| lt_err("matmul desc", e))?;
        // cublasOperation_t as its i32 value: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        let op = |t: bool| t as i32;
        use sys::cublasLtMatmulDescAttributes_t as D;
        // SAFETY: `plan.desc` was just created; each value has the attribute's documented type.
        unsafe {
            set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &op(cm.trans_a))?;
            set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &op(cm.trans_b))?;
            set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue(s.epilogue))?;
            if matches!(s.epilogue, Epilogue::BiasGeluAux | Epilogue::DGelu) {
                // The aux (pre-activation) buffer has C's layout.
                set_desc(plan.desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &s.ldc)?;
            }
        }
        plan.a = layout(s.dtype, cm.a_rows, cm.a_cols, cm.lda, s.batch, cm.stride_a)?;
        plan.b = layout(s.dtype, cm.b_rows, cm.b_cols, cm.ldb, s.batch, cm.stride_b)?;
        let c_dt = if s.c_f32 { GemmDtype::F32 { tf32: false } } else { s.dtype };
        plan.c = layout(c_dt, cm.m, cm.n, cm.ldc, s.batch, s.stride_c)?;
        let pref = Pref(result::create_matmul_pref().map_err(|e| lt_err("preference", e))?);
        // SAFETY: every handle was created above and is alive; the heuristic only reads them.
        let heur = unsafe {
            let ws = WORKSPACE_BYTES;
            result::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const usize as *const c_void,
                8,
            )
            .map_err(|e| lt_err("workspace preference", e))?;
            // Swapped operands (module comment): cuBLAS's A is the engine's B.
            use sys::cublasLtMatmulPreferenceAttributes_t as P;
            for (attr, bytes) in [
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al.b),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al.a),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al.c),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al.c),
            ] {
                result::set_matmul_pref_attribute(
                    pref.0,
                    attr,
                    &bytes as *const u32 as *const c_void,
                    4,
                )
                .map_err(|e| lt_err("alignment preference", e))?;
            }
            let (a, b, c) = (plan.a, plan.b, plan.c);
            result::get_matmul_algo_heuristic(self.handle, plan.desc, a, b, c, c, pref.0)
                .map_err(|e| lt_err(&format!("no algorithm for {s:?} {al:?}"), e))?
        };
        plan.algo = heur.algo;
        Ok(plan)
    }

    /// Enqueues C = α·op(A)·op(B) + β·C (+ the shape's epilogue) on `stream`.
    ///
    /// # Safety
    /// The pointers must be device buffers large enough for `s` (and bias/aux when the epilogue
    /// uses them), alive until the stream reaches this GEMM.
    pub unsafe fn run(
        &mut self,
        stream: sys::cudaStream_t,
        s: &GemmShape,
        p: &GemmPtrs,
        alpha: f32,
        beta: f32,
    ) -> Result<(), CudaError> {
        let handle = self.handle;
        let (ws, ws_bytes) = (self.workspace.ptr(), self.workspace.bytes());
        let plan = self.plan(s, GemmAlign::of(s, p))?;
        match s.epilogue {
            Epilogue::Bias | Epilogue::BiasGeluAux | Epilogue::BGradB => {
                set_desc(
                    plan.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &p.bias,
                )?;
            }
            Epilogue::None | Epilogue::DGelu | Epilogue::Accumulate => {}
        }
        if matches!(s.epilogue, Epilogue::BiasGeluAux | Epilogue::DGelu) {
            set_desc(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                &p.aux,
            )?;
        }
        // Swapped operands: cuBLAS's A is the engine's B (see the module comment).
        result::matmul(
            handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            p.b as *const c_void,
            plan.a,
            p.a as *const c_void,
            plan.b,
            p.c as *const c_void,
            plan.c,
            p.c as *mut c_void,
            plan.c,
            &plan.algo,
            ws as *mut c_void,
            ws_bytes,
            stream,
        )
        .map_err(|e| lt_err(&format!("matmul {s:?}"), e))
    }
}

impl Drop for Gemm {
    fn drop(&mut self) {
        // The plans first (each frees its descriptors), then the handle they were made with.
        self.plans.clear();
        // SAFETY: the handle was created by this Gemm and is destroyed once.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row-major reference: C = op(A)·op(B) with row strides.
    #[allow(
        clippy::too_many_arguments,
        reason = "cublasLt's column-major operands and their layouts, swapped as the module documents"
    )]
    fn row_major(
        ta: bool,
        tb: bool,
        m: usize,
        n: usize,
        k: usize,
        a: &[f64],
        lda: usize,
        b: &[f64],
        ldb: usize,
    ) -> Vec<f64> {
        let at = |i: usize, p: usize| if ta { a[p * lda + i] } else { a[i * lda + p] };
        let bt = |p: usize, j: usize| if tb { b[j * ldb + p] } else { b[p * ldb + j] };
        (0..m * n).map(|ij| (0..k).map(|p| at(ij / n, p) * bt(p, ij % n)).sum()).collect()
    }

    /// What cuBLAS computes from a ColMajor description (column-major, element (r, c) of a
    /// stored matrix at r + c·ld), written into memory read back row-major with ldc.
    fn col_major(cm: &ColMajor, a: &[f64], b: &[f64], rows_out: usize, ldc: usize) -> Vec<f64> {
        let ga = |r: usize, c: usize| a[r + c * cm.lda as usize];
        let gb = |r: usize, c: usize| b[r + c * cm.ldb as usize];
        let opa = |i: usize, p: usize| if cm.trans_a { ga(p, i) } else { ga(i, p) };
        let opb = |p: usize, j: usize| if cm.trans_b { gb(j, p) } else { gb(p, j) };
        let mut mem = vec![0f64; rows_out * ldc];
        for i in 0..cm.m as usize {
            for j in 0..cm.n as usize {
                // Column-major D(i, j) lives at i + j·ldc.
                mem[i + j * ldc] = (0..cm.k as usize).map(|p| opa(i, p) * opb(p, j)).sum();
            }
        }
        mem
    }

    #[test]
    fn the_operand_swap_computes_the_row_major_product() {
        // Shapes that are not square and leading dimensions wider than the rows.
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let (m, n, k) = (5usize, 7usize, 3usize);
            let (a_r, a_c) = if ta { (k, m) } else { (m, k) };
            let (b_r, b_c) = if tb { (n, k) } else { (k, n) };
            let (lda, ldb, ldc) = (a_c + 2, b_c + 1, n + 3);
            let a: Vec<f64> = (0..a_r * lda).map(|i| (i as f64 * 0.37).sin() + 0.01).collect();
            let b: Vec<f64> = (0..b_r * ldb).map(|i| (i as f64 * 0.73).cos() + 0.01).collect();
            let want = row_major(ta, tb, m, n, k, &a, lda, &b, ldb);
            let s = GemmShape {
                dtype: GemmDtype::F32 { tf32: false },
                ta,
                tb,
                m: m as u64,
                n: n as u64,
                k: k as u64,
                lda: lda as i64,
                ldb: ldb as i64,
                ldc: ldc as i64,
                batch: 1,
                stride_a: 0,
                stride_b: 0,
                stride_c: 0,
                epilogue: Epilogue::None,
                c_f32: false,
            };
            let cm = ColMajor::from_row_major(&s);
            // The stored shapes must cover the buffers cuBLAS will read.
            assert!(cm.lda as u64 >= cm.a_rows && cm.ldb as u64 >= cm.b_rows, "{ta} {tb}: {cm:?}");
            // cuBLAS's A is the engine's B and vice versa.
            let mem = col_major(&cm, &b, &a, m, ldc);
            for i in 0..m {
                for j in 0..n {
                    let got = mem[i * ldc + j];
                    assert!(
                        (got - want[i * n + j]).abs() < 1e-12,
                        "ta {ta} tb {tb} C[{i},{j}] = {got} vs {}",
                        want[i * n + j]
                    );
                }
            }
        }
    }
}
