//! Launchers of `engine/kernels/linear_cross_entropy.cu`: the steps between the linear
//! cross-entropy's GEMMs — the labelled rows compacted on the device (one block), then per
//! chunk of compacted positions the gather of x's rows, the logits rows' pass (bias, lse, loss,
//! g·softmax − g·onehot in place), the scatter of dx rows and dbias's column sums. The loss is
//! cross_entropy.cu's `cross_entropy_mean` over the per-position losses. Positions at or past
//! the labelled count (which the host never reads) are zero rows. CPU counterpart:
//! `backend/cpu/kernels/linear_cross_entropy.rs`.

use super::{block_rows, grid_stride, kernel_name, one_block, opt, Arg, Device, Launch};
use crate::DType;

/// `lce_compact`: idx[0 .. count) = the rows whose label is not `ignore_index`, in row order,
/// count[0] = how many (f32); a label outside [0, v) sets `err`.
// idx: (rows) i32; count: (1) f32; err: (1) i32 or none; labels: (rows) i64
pub struct LceCompact<P> {
    pub idx: P,
    pub count: P,
    pub err: Option<P>,
    pub labels: P,
    pub rows: usize,
    pub v: usize,
    pub ignore_index: i64,
}

impl<P> LceCompact<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        one_block(
            "lce_compact".into(),
            dev,
            vec![
                Arg::Ptr(self.idx),
                Arg::Ptr(self.count),
                opt(self.err),
                Arg::Ptr(self.labels),
                Arg::I64(self.rows as i64),
                Arg::I32(self.v as i32),
                Arg::I64(self.ignore_index),
            ],
        )
    }
}

/// `lce_gather_<T>`: xs[s] = x[idx[start + s]] for the chunk's k positions, zero rows past the
/// labelled count.
// xs: (k, c) T; x: (rows, c) T; idx: (rows) i32; count: (1) f32
pub struct LceGather<P> {
    pub dtype: DType,
    pub xs: P,
    pub x: P,
    pub idx: P,
    pub count: P,
    pub start: usize,
    pub k: usize,
    pub c: usize,
}

impl<P> LceGather<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("lce_gather", self.dtype),
            self.k * self.c,
            dev,
            vec![
                Arg::Ptr(self.xs),
                Arg::Ptr(self.x),
                Arg::Ptr(self.idx),
                Arg::Ptr(self.count),
                Arg::I64(self.start as i64),
                Arg::I32(self.k as i32),
                Arg::I32(self.c as i32),
            ],
        )
    }
}

/// `lce_rows_<T>`: per chunk row (position start + s): bias added, losses[start + s] =
/// lse − z[label]; with `dloss`, the row overwritten by g·softmax − g·onehot (g = dloss/count),
/// copied to `g16` in T when given. Zero rows and losses past the labelled count.
// logits: (k, v) f32; g16: (k, v) T or none; losses: (rows) f32; err: (1) i32 or none;
// labels: (rows) i64; idx: (rows) i32; count: (1) f32; bias: (v) T or none; dloss: (1) f32 or
// none (the forward)
pub struct LceRows<P> {
    pub dtype: DType,
    pub logits: P,
    pub g16: Option<P>,
    pub losses: P,
    pub err: Option<P>,
    pub labels: P,
    pub idx: P,
    pub count: P,
    pub bias: Option<P>,
    pub dloss: Option<P>,
    pub start: usize,
    pub k: usize,
    pub v: usize,
    pub ignore_index: i64,
}

impl<P> LceRows<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        block_rows(
            kernel_name("lce_rows", self.dtype),
            self.k,
            dev,
            vec![
                Arg::Ptr(self.logits),
                opt(self.g16),
                Arg::Ptr(self.losses),
                opt(self.err),
                Arg::Ptr(self.labels),
                Arg::Ptr(self.idx),
                Arg::Ptr(self.count),
                opt(self.bias),
                opt(self.dloss),
                Arg::I64(self.start as i64),
                Arg::I32(self.k as i32),
                Arg::I32(self.v as i32),
                Arg::I64(self.ignore_index),
            ],
        )
    }
}

/// `lce_scatter_<T>`: dx[idx[start + s]] = dxs[s] for the chunk's positions below the
/// labelled count (dx's other rows are zeroed before the chunks).
// dx: (rows, c) T; dxs: (k, c) f32; idx: (rows) i32; count: (1) f32
pub struct LceScatter<P> {
    pub dtype: DType,
    pub dx: P,
    pub dxs: P,
    pub idx: P,
    pub count: P,
    pub start: usize,
    pub k: usize,
    pub c: usize,
}

impl<P> LceScatter<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            kernel_name("lce_scatter", self.dtype),
            self.k * self.c,
            dev,
            vec![
                Arg::Ptr(self.dx),
                Arg::Ptr(self.dxs),
                Arg::Ptr(self.idx),
                Arg::Ptr(self.count),
                Arg::I64(self.start as i64),
                Arg::I32(self.k as i32),
                Arg::I32(self.c as i32),
            ],
        )
    }
}

/// `lce_column_sum`: db[j] = (db[j] if `accumulate`, else 0) + Σ_s g[s, j], rows in order.
// db: (v) f32; g: (k, v) f32
pub struct LceColumnSum<P> {
    pub db: P,
    pub g: P,
    pub k: usize,
    pub v: usize,
    pub accumulate: bool,
}

impl<P> LceColumnSum<P> {
    pub fn launch(self, dev: Device) -> Launch<P> {
        grid_stride(
            "lce_column_sum".into(),
            self.v,
            dev,
            vec![
                Arg::Ptr(self.db),
                Arg::Ptr(self.g),
                Arg::I32(self.k as i32),
                Arg::I32(self.v as i32),
                Arg::I32(i32::from(self.accumulate)),
            ],
        )
    }
}
