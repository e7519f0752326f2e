//! Launchers of `engine/kernels/attention.cu`: fused flash-style attention, forward and the
//! backward's two kernels (`attention_backward_dq`, which also writes delta = rowsum(dO ⊙ O),
//! then `attention_backward_dkdv`, which reads it). One block of [`ROW_BLOCK`] threads per
//! (batch·head, query tile) — per key tile for dk/dv —, tiles (bq, bk) fitted to the device's
//! shared memory ([`attention_tiles`]), dynamic shared memory per kernel
//! ([`attention_smem`]). CPU counterparts: `backend/cpu/kernels/attention.rs`.
//!
//! The kernels take ~40 positional arguments; here they are grouped: the sizes ([`Dims`]),
//! what is applied to the scores ([`Scores`]), and every (B, H, T, ·) operand with its three
//! strides ([`Strided`]).

use super::{kernel_name, mask_args, Arg, Device, Launch, Mask, Seed};
use crate::exec::gpu::broadcast_strides4;
use crate::exec::gpu::kernel::{GpuKernel, NodeCx};
use crate::exec::gpu::launch;
use crate::exec::gpu::support::GpuSupport;
use crate::exec::gpu::support::{attention_smem, attention_tiles, ROW_BLOCK};
use crate::exec::gpu::{Call, Resolver};
use crate::graph::op::{Attention, AttentionBackward};
use crate::graph::Op;
use crate::graph::{Graph, Node, TensorId};
use crate::ops::attention::{backward_slot, slot};
use crate::plan::PlanError;
use crate::DType;

/// A (B, H, T, X) operand with unit last stride: its address and the element strides of b, h
/// and t (attention.cu's `AttnStrides`): contiguous, or the heads inside the rows of a
/// (B, T, H·X) tensor, or any other layout the plan gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided<P> {
    pub at: P,
    pub strides: [i64; 3],
}

/// Sizes: batch B, query heads H, K/V heads Hkv (H a multiple of it: grouped-query attention,
/// query head h reading K/V head h / (H / Hkv) as HF's repeat_kv), query and key lengths Tq,
/// Tk, head sizes D (Q, K) and Dv (V).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub b: usize,
    pub h: usize,
    pub hkv: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
    pub dv: usize,
}

/// What the three kernels apply to the scores alike: s = scale·q·k, or cap·tanh(scale·q·k)
/// with a `softcap` (the kernels' `cap`, 0 for none), + mask, the causal cut (key j > query i
/// masked, top-left aligned), dropout of the probabilities with the engine's counter-based
/// mask at `offset`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scores<P> {
    pub scale: f32,
    pub softcap: Option<f32>,
    pub causal: bool,
    pub dropout_p: f32,
    pub seed: Seed<P>,
    pub offset: u64,
}

/// No tile size fits the device's shared memory for these head sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoTiles {
    pub d: usize,
    pub dv: usize,
    pub max_smem: u32,
}

impl std::fmt::Display for NoTiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "head sizes {}/{}: the tiles do not fit {} bytes of shared memory",
            self.d, self.dv, self.max_smem
        )
    }
}

/// The tiles (bq, bk) the three kernels use on `dev` for these sizes: the largest whose
/// shared memory fits ([`attention_tiles`]).
pub fn tiles(dims: Dims, dev: Device) -> Result<(usize, usize), NoTiles> {
    let Dims { d, dv, .. } = dims;
    attention_tiles(d, dv, dev.max_smem).ok_or(NoTiles { d, dv, max_smem: dev.max_smem })
}

/// Head sizes the tensor-core kernels are built for (attention_mma.cu, D = Dv): multiples of
/// the mma's k of 16.
pub const MMA_HEAD_DIMS: [usize; 6] = [16, 32, 64, 80, 96, 128];
/// Threads of a tensor-core block: 4 warps of 32, each owning 16 rows.
const MMA_BLOCK: u32 = 128;
/// Queries per forward and dq block, keys per dkdv block.
const MMA_ROWS: usize = 64;

/// Dynamic shared memory of the tensor-core forward, dq and dkdv kernels at head size `d`,
/// bytes: tiles of rows of d + 8 half elements (attention_mma.cu) — forward K and V tiles of
/// 64 keys; dq K and V tiles of 32 keys and its 64 rows' delta; dkdv K and V of 64 keys, Q
/// and dO tiles of 32 queries and their 32 (m, log l) pairs and delta values.
pub fn mma_smem(d: usize) -> [u32; 3] {
    let row = (d + 8) * 2;
    [2 * 64 * row, 2 * 32 * row + 64 * 4, (2 * 64 + 2 * 32) * row + 3 * 32 * 4].map(|b| b as u32)
}

/// The head size whose tensor-core kernels run these sizes on `dev`, if any: f16/bf16
/// operands, D = Dv in [`MMA_HEAD_DIMS`], a device with tensor cores and the shared memory.
/// Otherwise attention.cu's kernels run (f32, AMD, other head sizes).
pub fn mma_head_dim(dims: Dims, dtype: DType, dev: Device) -> Option<usize> {
    let half = matches!(dtype, DType::F16 | DType::BF16);
    let fits = mma_smem(dims.d).iter().all(|&b| b <= dev.max_smem);
    (dev.mma && half && dims.d == dims.dv && MMA_HEAD_DIMS.contains(&dims.d) && fits)
        .then_some(dims.d)
}

/// `attention_mma_<kernel>_<T>_d<D>`.
fn mma_name(kernel: &str, dtype: DType, d: usize) -> String {
    format!("{}_d{d}", kernel_name(&format!("attention_mma_{kernel}"), dtype))
}

/// The arguments between the operands and the strides: h, hkv, tq, tk, [d, dv,] scale, cap,
/// causal, dropout_p, seed, offset, the step block (the tensor-core kernels have the head size
/// in their name).
fn scalars<P>(dims: Dims, s: Scores<P>, head_sizes: bool) -> Vec<Arg<P>> {
    let mut a = vec![
        Arg::I32(dims.h as i32),
        Arg::I32(dims.hkv as i32),
        Arg::I32(dims.tq as i32),
        Arg::I32(dims.tk as i32),
    ];
    if head_sizes {
        a.extend([Arg::I32(dims.d as i32), Arg::I32(dims.dv as i32)]);
    }
    let (seed, step) = s.seed.split();
    a.extend([
        Arg::F32(s.scale),
        Arg::F32(s.softcap.unwrap_or(0.0)),
        Arg::I32(i32::from(s.causal)),
        Arg::F32(s.dropout_p),
        Arg::U64(seed),
        Arg::U64(s.offset),
        step,
    ]);
    a
}

/// Appends the tail every kernel shares after its operands: scalars, the operands' strides in
/// the kernel's order, the mask's strides, and for attention.cu's kernels the tiles (`None`
/// for the tensor-core kernels, whose tiles are fixed).
fn tail<P>(
    args: &mut Vec<Arg<P>>,
    dims: Dims,
    scores: Scores<P>,
    strides: &[[i64; 3]],
    ms: [Arg<P>; 4],
    tiles: Option<(usize, usize)>,
) {
    args.extend(scalars(dims, scores, tiles.is_some()));
    args.extend(strides.iter().flatten().map(|&s| Arg::I64(s)));
    args.extend(ms);
    if let Some((bq, bk)) = tiles {
        args.extend([Arg::I32(bq as i32), Arg::I32(bk as i32)]);
    }
}

/// The three kernels of one attention, each in attention.cu and attention_mma.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Forward,
    Dq,
    Dkdv,
}

/// A kernel's launch from its operands (`args`): the tensor-core kernel where
/// [`mma_head_dim`] allows, else attention.cu's at the tiles that fit ([`tiles`]); the tail
/// of scalars and strides appended, the grid over query tiles of every (batch, query head) —
/// key tiles of every (batch, K/V head) for dk/dv.
fn finish<P>(
    kernel: Kernel,
    dtype: DType,
    dims: Dims,
    scores: Scores<P>,
    (strides, ms): (&[[i64; 3]], [Arg<P>; 4]),
    mut args: Vec<Arg<P>>,
    dev: Device,
) -> Result<Launch<P>, NoTiles> {
    let (name, slot) = match kernel {
        Kernel::Forward => ("forward", 0),
        Kernel::Dq => ("backward_dq", 1),
        Kernel::Dkdv => ("backward_dkdv", 2),
    };
    let grid = |tile: usize| match kernel {
        Kernel::Dkdv => (dims.b * dims.hkv * dims.tk.div_ceil(tile)) as u32,
        _ => (dims.b * dims.h * dims.tq.div_ceil(tile)) as u32,
    };
    if let Some(d) = mma_head_dim(dims, dtype, dev) {
        tail(&mut args, dims, scores, strides, ms, None);
        return Ok(Launch {
            name: mma_name(name, dtype, d),
            grid: grid(MMA_ROWS),
            block: MMA_BLOCK,
            smem: mma_smem(d)[slot],
            args,
        });
    }
    let (bq, bk) = tiles(dims, dev)?;
    tail(&mut args, dims, scores, strides, ms, Some((bq, bk)));
    Ok(Launch {
        name: kernel_name(&format!("attention_{name}"), dtype),
        grid: grid(if kernel == Kernel::Dkdv { bk } else { bq }),
        block: ROW_BLOCK,
        smem: attention_smem(bq, bk, dims.d, dims.dv)[slot],
        args,
    })
}

/// `attention_forward_<T>`: out = dropout(softmax(scale·q·kᵀ + mask))·v, and each query row's
/// softmax statistics (m, log l) for the backward (instead of the probabilities; attention.cu
/// says why not their sum, the log-sum-exp).
// out: (B, H, Tq, Dv) T; stats: (B, H, Tq, 2) f32 contiguous; q: (B, H, Tq, D) T;
// k: (B, Hkv, Tk, D) T; v: (B, Hkv, Tk, Dv) T; mask: broadcast to (B, H, Tq, Tk) T, or none
pub struct AttentionForward<P> {
    pub dtype: DType,
    pub out: Strided<P>,
    pub stats: P,
    pub q: Strided<P>,
    pub k: Strided<P>,
    pub v: Strided<P>,
    pub mask: Option<Mask<P>>,
    pub dims: Dims,
    pub scores: Scores<P>,
}

impl<P> AttentionForward<P> {
    pub fn launch(self, dev: Device) -> Result<Launch<P>, NoTiles> {
        let Self { dtype, out, stats, q, k, v, mask, dims, scores } = self;
        let (mask, ms) = mask_args(mask);
        let mut args =
            vec![Arg::Ptr(out.at), Arg::Ptr(stats), Arg::Ptr(q.at), Arg::Ptr(k.at), Arg::Ptr(v.at)];
        args.push(mask);
        let strides = [q.strides, k.strides, v.strides, out.strides];
        finish(Kernel::Forward, dtype, dims, scores, (&strides, ms), args, dev)
    }
}

/// `attention_backward_dq_<T>`: dq, and delta = rowsum(dout ⊙ out) per query row for
/// [`AttentionBackwardDkdv`], which runs after it. `out` and `stats` are the forward's.
// dq: (B, H, Tq, D) T; delta: (B, H, Tq) f32, stats: (B, H, Tq, 2) f32, contiguous; dout, out: (B, H, Tq, Dv) T;
// q, k, v, mask as the forward's
pub struct AttentionBackwardDq<P> {
    pub dtype: DType,
    pub dq: Strided<P>,
    pub delta: P,
    pub dout: Strided<P>,
    pub out: Strided<P>,
    pub q: Strided<P>,
    pub k: Strided<P>,
    pub v: Strided<P>,
    pub mask: Option<Mask<P>>,
    pub stats: P,
    pub dims: Dims,
    pub scores: Scores<P>,
}

impl<P> AttentionBackwardDq<P> {
    pub fn launch(self, dev: Device) -> Result<Launch<P>, NoTiles> {
        let Self { dtype, dq, delta, dout, out, q, k, v, mask, stats, dims, scores } = self;
        let (mask, ms) = mask_args(mask);
        let args = vec![
            Arg::Ptr(dq.at),
            Arg::Ptr(delta),
            Arg::Ptr(dout.at),
            Arg::Ptr(out.at),
            Arg::Ptr(q.at),
            Arg::Ptr(k.at),
            Arg::Ptr(v.at),
            mask,
            Arg::Ptr(stats),
        ];
        let strides = [q.strides, k.strides, v.strides, dout.strides, out.strides, dq.strides];
        finish(Kernel::Dq, dtype, dims, scores, (&strides, ms), args, dev)
    }
}

/// `attention_backward_dkdv_<T>`: dk and dv, one block per (K/V head, key tile) walking the
/// query tiles of the head's query heads; reads the delta [`AttentionBackwardDq`] wrote.
// dk: (B, Hkv, Tk, D) T; dv: (B, Hkv, Tk, Dv) T; the rest as AttentionBackwardDq's
pub struct AttentionBackwardDkdv<P> {
    pub dtype: DType,
    pub dk: Strided<P>,
    pub dv: Strided<P>,
    pub dout: Strided<P>,
    pub q: Strided<P>,
    pub k: Strided<P>,
    pub v: Strided<P>,
    pub mask: Option<Mask<P>>,
    pub stats: P,
    pub delta: P,
    pub dims: Dims,
    pub scores: Scores<P>,
}

impl<P> AttentionBackwardDkdv<P> {
    pub fn launch(self, dev: Device) -> Result<Launch<P>, NoTiles> {
        let Self { dtype, dk, dv, dout, q, k, v, mask, stats, delta, dims, scores } = self;
        let (mask, ms) = mask_args(mask);
        let args = vec![
            Arg::Ptr(dk.at),
            Arg::Ptr(dv.at),
            Arg::Ptr(dout.at),
            Arg::Ptr(q.at),
            Arg::Ptr(k.at),
            Arg::Ptr(v.at),
            mask,
            Arg::Ptr(stats),
            Arg::Ptr(delta),
        ];
        let strides = [q.strides, k.strides, v.strides, dout.strides, dk.strides, dv.strides];
        finish(Kernel::Dkdv, dtype, dims, scores, (&strides, ms), args, dev)
    }
}

impl GpuKernel for Attention {
    // The second output is the rows' softmax statistics (m, log l), (B, H, Tq, 2) in f32, not
    // the probabilities.
    fn stored_dtype(&self, _g: &Graph, _node: &Node, slot: usize) -> Option<DType> {
        (slot == 1).then_some(DType::F32)
    }

    fn stored_elems(&self, g: &Graph, node: &Node, slot: usize) -> Option<usize> {
        let q = g.shape(node.inputs[slot::Q]);
        (slot == 1).then(|| q[0] * q[1] * q[2] * 2)
    }

    fn check(&self, _sup: &GpuSupport, g: &Graph, n: &Node) -> Result<(), String> {
        // Any K/V head count the graph accepts (one dividing H) runs: query head h reads
        // K/V head h / (H / Hkv).
        if g.shape(n.inputs[slot::Q]).len() != 4 {
            return Err(" for a non-4-D attention".into());
        }
        Ok(())
    }

    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        let Attention { scale, causal, dropout_p, offset, softcap } = *self;
        let g = cx.g;
        let ins = &cx.node.inputs;
        let outs = &cx.node.outputs;
        let calls = {
            use crate::ops::attention::{backward_slot as bs, slot as fs};
            let fwd = matches!(cx.node.op, Op::Attention(_));
            let (q, k, v) = if fwd {
                (ins[fs::Q], ins[fs::K], ins[fs::V])
            } else {
                (ins[bs::Q], ins[bs::K], ins[bs::V])
            };
            let mask = if fwd { ins.get(fs::MASK) } else { ins.get(bs::MASK) }.copied();
            let mut all = vec![q, k, v];
            all.extend(mask);
            if fwd {
                all.push(outs[0]);
            } else {
                all.extend([ins[bs::DOUT], ins[bs::OUT], outs[0], outs[1], outs[2]]);
            }
            cx.same(&all)?;
            let (sq, sk, sv) = (g.shape(q), g.shape(k), g.shape(v));
            let (b, h, hkv, tq, tk, d, dv) = (sq[0], sq[1], sk[1], sq[2], sk[2], sq[3], sv[3]);
            let dims = Dims { b, h, hkv, tq, tk, d, dv };
            let mask = mask.map(|m| launch::Mask {
                mask: r.at(m),
                strides: broadcast_strides4(g.shape(m), [b, h, tq, tk]),
            });
            let seed = launch::Seed::Block(r.step_block());
            let scores = Scores { scale, softcap, causal, dropout_p, seed, offset };
            // The forward's products; the backward's are twice those, plus the recomputed
            // scores.
            let mm = 2.0 * (b * h * tq * tk) as f64 * (d + dv) as f64;
            r.flops += if fwd { mm } else { 2.0 * mm + 2.0 * (b * h * tq * tk * d) as f64 };
            // Tensor t at address `at` with its (b, h, t) strides.
            let st = |t: TensorId, at: u64| Strided { at, strides: r.strides3(t) };
            let (dtype, dev) = (cx.dt(q), r.device());
            let no_tiles = |e: NoTiles| cx.no(&format!(" for {e}"));
            if fwd {
                let l = AttentionForward {
                    dtype,
                    out: st(outs[0], cx.out(0)),
                    stats: cx.out(1),
                    q: st(q, cx.inp(fs::Q)),
                    k: st(k, cx.inp(fs::K)),
                    v: st(v, cx.inp(fs::V)),
                    mask,
                    dims,
                    scores,
                };
                vec![l.launch(dev).map_err(no_tiles)?.into()]
            } else {
                // The backward: dq (and D) first, then dk and dv reading D.
                let (dout, fo) = (ins[bs::DOUT], ins[bs::OUT]);
                let delta = cx.ws_at();
                let (q, k, v, dout) = (
                    st(q, cx.inp(bs::Q)),
                    st(k, cx.inp(bs::K)),
                    st(v, cx.inp(bs::V)),
                    st(dout, cx.inp(bs::DOUT)),
                );
                // The probabilities slot holds the rows' (m, log l) on the GPU.
                let stats = cx.inp(bs::PROBS);
                let dq = AttentionBackwardDq {
                    dtype,
                    dq: st(outs[0], cx.out(0)),
                    delta,
                    dout,
                    out: st(fo, cx.inp(bs::OUT)),
                    q,
                    k,
                    v,
                    mask,
                    stats,
                    dims,
                    scores,
                };
                let dkdv = AttentionBackwardDkdv {
                    dtype,
                    dk: st(outs[1], cx.out(1)),
                    dv: st(outs[2], cx.out(2)),
                    dout,
                    q,
                    k,
                    v,
                    mask,
                    stats,
                    delta,
                    dims,
                    scores,
                };
                vec![
                    dq.launch(dev).map_err(no_tiles)?.into(),
                    dkdv.launch(dev).map_err(no_tiles)?.into(),
                ]
            }
        };
        Ok(calls)
    }
}

impl GpuKernel for AttentionBackward {
    fn check(&self, _sup: &GpuSupport, g: &Graph, n: &Node) -> Result<(), String> {
        use backward_slot as slot;
        // Any K/V head count the graph accepts (one dividing H) runs: query head h reads
        // K/V head h / (H / Hkv).
        if g.shape(n.inputs[slot::Q]).len() != 4 {
            return Err(" for a non-4-D attention".into());
        }
        if n.inputs.len() <= slot::OUT {
            return Err(" without the forward's output among its inputs".into());
        }
        Ok(())
    }

    // D = rowsum(dO ∘ O) per query row: (B, H, Tq).
    fn workspace(&self, _sup: &GpuSupport, g: &Graph, node: usize) -> usize {
        let q = g.shape(g.nodes()[node].inputs[backward_slot::Q]);
        q[0] * q[1] * q[2]
    }

    // One binding for both directions: it reads which from the node.
    fn launches(&self, r: &mut Resolver<'_>, cx: &NodeCx<'_>) -> Result<Vec<Call>, PlanError> {
        self.forward().launches(r, cx)
    }
}
