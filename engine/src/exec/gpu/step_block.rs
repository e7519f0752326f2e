//! What a step reads from the host, in one device buffer uploaded once per step: the step block
//! (the values that change from step to step) followed by the graph's inputs.
//!
//! Why in device memory and not in launch arguments: a captured step (a CUDA graph) replays its
//! launches with the arguments they were captured with, so the kernels of a step read the
//! dropout seed, the loss scale and the optimizer's per-step scalars from the block
//! (`engine/kernels/port.cuh` `StepBlock`, the same layout) — as PyTorch's graph-safe Philox
//! state and its `capturable` Adam read theirs from device tensors. The direct launches read the
//! same block, so both ways of issuing a step run the same kernels with the same arguments.
//!
//! Why pinned: a copy from pageable memory is synchronous for the host and cannot be captured;
//! from page-locked memory it is queued on the stream like a kernel. Two host images are used
//! in turn, so the host writes step n + 1's while step n's copy may still be queued; the host
//! waits for each step's status before the step after next, so an image is never rewritten
//! before its copy has run.

use crate::backend::gpu::{GpuDevice, GpuError};

/// The per-step values the kernels read (`port.cuh` `StepBlock`: 32 bytes, little-endian).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepBlock {
    /// The step's dropout seed.
    pub seed: u64,
    /// The backward's seed d(loss)/d(loss): the loss scale times the rank's weight.
    pub loss_scale: f32,
    /// 1 / the loss scale: the optimizer unscales the gradients by it.
    pub inv_scale: f32,
    /// AdamW: lr / (1 − β1^t).
    pub step_size: f32,
    /// AdamW: 1 / sqrt(1 − β2^t).
    pub inv_bc2_sqrt: f32,
    /// AdamW: 1 − lr·weight_decay.
    pub decay_mul: f32,
}

impl StepBlock {
    /// Bytes of the block (inputs start after it, 16-byte aligned).
    pub const BYTES: usize = 32;

    /// The block's bytes, as the kernels read them.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.seed.to_le_bytes());
        let words = [self.loss_scale, self.inv_scale, self.step_size, self.inv_bc2_sqrt];
        for (k, w) in words.into_iter().chain([self.decay_mul, 0.0]).enumerate() {
            out[8 + 4 * k..12 + 4 * k].copy_from_slice(&w.to_le_bytes());
        }
    }
}

/// The device buffer of a step's block and inputs, and the two pinned images it is uploaded
/// from.
pub struct StepInputs<D: GpuDevice> {
    buf: D::Buffer,
    /// Per graph input: its byte offset in the buffer and its size.
    slots: Vec<(usize, usize)>,
    images: [D::Pinned; 2],
    /// The image the next step writes.
    next: usize,
}

impl<D: GpuDevice> StepInputs<D> {
    /// Room for the block and inputs of `sizes` bytes each, 16-byte aligned.
    pub fn new(dev: &D, sizes: &[usize]) -> Result<Self, GpuError> {
        let mut at = StepBlock::BYTES;
        let mut slots = Vec::with_capacity(sizes.len());
        for &n in sizes {
            slots.push((at, n));
            at = (at + n).next_multiple_of(16);
        }
        let buf = dev.alloc_zeroed(at)?;
        let images = [dev.alloc_pinned(at)?, dev.alloc_pinned(at)?];
        Ok(StepInputs { buf, slots, images, next: 0 })
    }

    /// Device address of the step block.
    pub fn block_address(&self, dev: &D) -> u64 {
        dev.address(&self.buf)
    }

    /// Device address of input `k`.
    pub fn input_address(&self, dev: &D, k: usize) -> u64 {
        dev.address(&self.buf) + self.slots[k].0 as u64
    }

    /// Byte size of input `k`.
    pub fn input_bytes(&self, k: usize) -> usize {
        self.slots[k].1
    }

    /// The next image's bytes of input `k`, to be written before [`StepInputs::upload`].
    pub fn input_mut(&mut self, k: usize) -> &mut [u8] {
        let (at, n) = self.slots[k];
        &mut self.images[self.next][at..at + n]
    }

    /// Writes `block` into the next image and queues its upload; the image after it is next.
    pub fn upload(&mut self, dev: &D, block: &StepBlock) -> Result<(), GpuError> {
        let image = &mut self.images[self.next];
        block.write(&mut image[..StepBlock::BYTES]);
        // SAFETY: the image is exactly the buffer's size; it is rewritten only two steps later,
        // after the host has waited for the step in between (module comment).
        unsafe { dev.upload_pinned(dev.address(&self.buf), image) }?;
        self.next = 1 - self.next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_is_laid_out_as_port_cuh_declares_it() {
        let b = StepBlock {
            seed: 0x0102_0304_0506_0708,
            loss_scale: 2.0,
            inv_scale: 0.5,
            step_size: 3.0,
            inv_bc2_sqrt: 4.0,
            decay_mul: 5.0,
        };
        let mut out = [0xffu8; StepBlock::BYTES];
        b.write(&mut out);
        assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), b.seed);
        let f = |at: usize| f32::from_le_bytes(out[at..at + 4].try_into().unwrap());
        assert_eq!([f(8), f(12), f(16), f(20), f(24), f(28)], [2.0, 0.5, 3.0, 4.0, 5.0, 0.0]);
    }
}
