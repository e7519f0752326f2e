//! Launchers of `engine/kernels/embedding.cu`: the gather (one block per output row) and its
//! deterministic scatter-add backward (each thread owns one column of the table rows whose id
//! falls in its residue class; no atomics, the CPU's order, the same bits). An id out of range
//! sets `err` (may be left out) instead of being used as an index. CPU counterparts:
//! `backend/cpu/kernels/embedding.rs`.

use super::{block_rows, kernel_name, opt, Arg, Device, Launch};
use crate::exec::gpu::support::ROW_BLOCK;
use crate::DType;

/// `embedding_forward_<T>`: out[r, :] = table[ids[r], :].
// out: (n, c) T; err: (1) i32 or none; ids: (n) i64; table: (v, c) T
pub struct EmbeddingForward<P> {
    pub dtype: DType,
    pub out: P,
    pub err: Option<P>,
    pub ids: P,
    pub table: P,
    pub n: usize,
    pub c: usize,
    pub v: usize,
}

impl<P> EmbeddingForward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        block_rows(
            kernel_name("embedding_forward", self.dtype),
            self.n,
            dev,
            vec![
                Arg::Ptr(self.out),
                opt(self.err),
                Arg::Ptr(self.ids),
                Arg::Ptr(self.table),
                Arg::I64(self.n as i64),
                Arg::I32(self.c as i32),
                Arg::I64(self.v as i64),
            ],
        )
    }
}

/// `embedding_backward_<T>` (T: dout's dtype): dtable[i, :] = Σ_{r: ids[r] = i} dout[r, :] in
/// row order, f32, every row written (0 where no id names it).
// dtable: (v, c) f32; err: (1) i32 or none; ids: (n) i64; dout: (n, c) T
pub struct EmbeddingBackward<P> {
    pub dtype: DType,
    pub dtable: P,
    pub err: Option<P>,
    pub ids: P,
    pub dout: P,
    pub n: usize,
    pub c: usize,
    pub v: usize,
}

impl<P> EmbeddingBackward<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        let col_blocks = self.c.div_ceil(ROW_BLOCK as usize);
        // Residue classes of ids: enough blocks to fill the device, each walking all ids (at
        // most 64 walks, at most one class per table row).
        let parts = (dev.max_blocks as usize / col_blocks).clamp(1, 64).min(self.v);
        Launch {
            name: kernel_name("embedding_backward", self.dtype),
            grid: (col_blocks * parts) as u32,
            block: ROW_BLOCK,
            smem: 0,
            args: vec![
                Arg::Ptr(self.dtable),
                opt(self.err),
                Arg::Ptr(self.ids),
                Arg::Ptr(self.dout),
                Arg::I64(self.n as i64),
                Arg::I32(self.c as i32),
                Arg::I64(self.v as i64),
            ],
        }
    }
}
