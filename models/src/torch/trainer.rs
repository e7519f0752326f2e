//! One training step as HF Trainer (transformers 5.x, torch ≥ 2.8) takes it by default:
//! forward (under autocast for fp16/bf16), backward, unscale + overflow check (GradScaler),
//! global-norm clipping, torch's fused AdamW (`optim="adamw_torch_fused"`) with HF's decay
//! groups, LR schedule, `zero_grad(set_to_none=True)`.

use tch::{nn, Device, Kind, Tensor};

use super::autocast::{autocast, AutocastDtype};
use super::optim::{FusedAdamW, StepOutcome};
use super::{catch_torch, create_vars, export, TorchModel, Vars};
use crate::config::ModelConfig;
use crate::data::Batch;
use crate::params::param_specs;
use crate::schedule::LrSchedule;
use crate::weights::Weights;
use crate::ModelError;
use ortbench_engine::collective::{
    Collective, CollectiveError, DeviceGroup, ElementKind, LocalGroup, ReduceOp,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Fp32,
    /// CUDA autocast to fp16 with a dynamic loss scale (torch.amp.GradScaler defaults).
    Fp16,
    /// Autocast to bf16 (CPU or CUDA), no loss scaling: HF Trainer's `bf16=True`.
    Bf16,
}

#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub lr: f64,
    pub weight_decay: f64,
    /// Global-norm clipping; 0 disables it (HF: max_grad_norm=0).
    pub max_grad_norm: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub schedule: LrSchedule,
    pub precision: Precision,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            lr: 5e-5,
            weight_decay: 0.01,
            max_grad_norm: 1.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            schedule: LrSchedule::Constant { warmup_steps: 0 },
            precision: Precision::Fp32,
        }
    }
}

/// What one step measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// The loss of this step's forward pass, before its update (unscaled).
    pub loss: f64,
    /// Global L2 norm of the (unscaled) gradients before clipping.
    pub grad_norm: f64,
    /// The loss scale this step used (1 without scaling).
    pub loss_scale: f64,
    /// True when the step was skipped for inf/NaN gradients.
    pub skipped: bool,
}

/// A libtorch error a test makes the baseline's next step raise (the worker's
/// `ORTBENCH_FAULT=torch-error` / `cuda-oom`). Both are raised by libtorch itself, after the
/// forward pass, and reach the caller the way a real one does: a tch op panics on libtorch's
/// error and the step returns it ([`catch_torch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedError {
    /// A real op on mismatched shapes: a (2×3)·(4×5) matmul on the model's device.
    ShapeMismatch,
    /// libtorch raising the message its CUDA caching allocator gives when a GPU is out of
    /// memory (through ATen's `_assert_scalar`, so the text comes from a libtorch exception).
    CudaOom,
}

impl InjectedError {
    /// What libtorch's CUDA caching allocator says when an allocation fails (torch 2.x), with a
    /// note that this one is injected.
    pub const CUDA_OOM_MESSAGE: &'static str = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free. Of the allocated memory 76.50 GiB is allocated by PyTorch, and 0.90 GiB is reserved by PyTorch but unallocated. (injected by ORTBENCH_FAULT=cuda-oom)";

    /// Runs the failing op: tch panics with libtorch's error, as it does on a real one.
    fn raise(self, device: Device) {
        match self {
            InjectedError::ShapeMismatch => {
                let a = Tensor::zeros([2, 3], (Kind::Float, device));
                let _ = a.matmul(&Tensor::zeros([4, 5], (Kind::Float, device)));
            }
            InjectedError::CudaOom => Tensor::internal_assert_scalar(0i64, Self::CUDA_OOM_MESSAGE),
        }
    }
}

/// torch.amp.GradScaler's dynamic loss scale: init 2^16, ×2 after 2000 clean steps, ×0.5
/// and skip on inf/NaN.
struct LossScaler {
    scale: f64,
    clean_steps: usize,
}

pub struct TorchTrainer {
    vs: nn::VarStore,
    /// Variables in `param_specs` order, for export.
    ordered: Vec<(String, Tensor)>,
    model: TorchModel,
    opt: FusedAdamW,
    scaler: Option<LossScaler>,
    device: Device,
    opts: TrainOptions,
    steps_taken: usize,
    /// DDP's gradient bucket, reused every step, and its capacity in bytes
    /// ([`DDP_BUCKET_BYTES`] unless a test sets another).
    bucket: Vec<f32>,
    bucket_bytes: usize,
    /// Raised by the next step (tests).
    inject: Option<InjectedError>,
    /// Set when a step failed: the parameters, gradients and optimizer state may be half
    /// updated, so no later step runs.
    failed: Option<String>,
}

/// torch DDP's default `bucket_cap_mb` = 25.
pub const DDP_BUCKET_BYTES: usize = 25 << 20;

impl TorchTrainer {
    /// Builds the model on `device`. A libtorch error (a device out of memory, a CUDA error)
    /// is returned, not a panic.
    pub fn new(
        cfg: &ModelConfig,
        weights: &Weights,
        device: Device,
        opts: TrainOptions,
    ) -> Result<Self, ModelError> {
        catch_torch("building the pytorch model", || Self::build(cfg, weights, device, opts))
    }

    fn build(
        cfg: &ModelConfig,
        weights: &Weights,
        device: Device,
        opts: TrainOptions,
    ) -> Result<Self, ModelError> {
        match (opts.precision, device) {
            (Precision::Fp32, _) => {}
            (Precision::Fp16, Device::Cuda(_)) => {}
            (Precision::Fp16, _) => {
                // As HF Trainer: fp16 mixed precision (with its GradScaler) is a CUDA feature.
                return Err(ModelError::Training(
                    "--precision fp16 for the pytorch config needs --device cuda; use bf16 or fp32 on the CPU".into(),
                ));
            }
            (Precision::Bf16, _) => {}
        }
        // Variables are made on the CPU from our weights, then moved as a whole.
        let mut vs = nn::VarStore::new(Device::Cpu);
        create_vars(&vs, cfg, weights)?;
        vs.set_device(device);
        let mut all = vs.variables();
        let specs = param_specs(cfg);
        let (mut decay, mut no_decay) = (Vec::new(), Vec::new());
        let ordered = specs
            .into_iter()
            .map(|s| {
                let t = all.remove(&s.name).expect("every spec has a variable");
                if s.decay { &mut decay } else { &mut no_decay }.push(t.shallow_clone());
                (s.name, t)
            })
            .collect();
        let vars = Vars(vs.variables());
        let model = TorchModel::new(cfg, &vars);
        // HF Trainer.create_optimizer's two param groups, in its order: decay, then no decay.
        let groups = vec![(decay, opts.weight_decay), (no_decay, 0.0)];
        let opt = FusedAdamW::new(
            groups,
            opts.lr * opts.schedule.factor(0),
            opts.beta1,
            opts.beta2,
            opts.eps,
        );
        let scaler = (opts.precision == Precision::Fp16)
            .then_some(LossScaler { scale: 65536.0, clean_steps: 0 });
        Ok(TorchTrainer {
            vs,
            ordered,
            model,
            opt,
            scaler,
            device,
            opts,
            steps_taken: 0,
            bucket: Vec::new(),
            bucket_bytes: DDP_BUCKET_BYTES,
            inject: None,
            failed: None,
        })
    }

    /// The loss of `batch` without updating anything (dropout off).
    pub fn eval_loss(&self, batch: &Batch) -> f64 {
        tch::no_grad(|| self.model.loss(batch, self.device, false).double_value(&[]))
    }

    /// The forward pass of a training step, under autocast for fp16/bf16.
    fn forward(&self, batch: &Batch) -> Result<Tensor, ModelError> {
        let run = || self.model.loss(batch, self.device, true);
        match self.opts.precision {
            Precision::Fp32 => Ok(run()),
            Precision::Fp16 => autocast(self.device, AutocastDtype::F16, run),
            Precision::Bf16 => autocast(self.device, AutocastDtype::Bf16, run),
        }
    }

    /// One optimizer step on `batch`.
    pub fn step(&mut self, batch: &Batch) -> Result<StepStats, ModelError> {
        self.step_ddp::<LocalGroup>(batch, None)
    }

    /// DDP's bucket capacity in bytes (torch's `bucket_cap_mb`; 25 MiB by default).
    pub fn set_ddp_bucket_bytes(&mut self, bytes: usize) {
        self.bucket_bytes = bytes;
    }

    /// One step as one rank of PyTorch DDP: after backward, gradients are weighted by this
    /// rank's share `weight` of the global batch's labelled tokens and summed across `group`
    /// in buckets (as DDP's gradient buckets), so every rank applies the gradient of the
    /// global batch (HF Trainer's `average_tokens_across_devices`). The buckets go through
    /// host memory: the CPU's transports.
    pub fn step_ddp<G: Collective>(
        &mut self,
        batch: &Batch,
        ddp: Option<(&G, f32)>,
    ) -> Result<StepStats, ModelError> {
        self.step_with(batch, ddp.map(|(g, w)| (Reducer::Host(g), w)))
    }

    /// As [`TorchTrainer::step_ddp`] on a GPU, the buckets all-reduced in device memory by NCCL
    /// (torch DDP's ProcessGroupNCCL): each bucket is one flat device tensor of its gradients,
    /// reduced in place through its device pointer on libtorch's stream (the legacy default
    /// stream, which the NCCL call is queued on), and copied back into the gradients.
    pub fn step_ddp_nccl(
        &mut self,
        batch: &Batch,
        group: &DeviceGroup,
        weight: f32,
    ) -> Result<StepStats, ModelError> {
        if !matches!(self.device, Device::Cuda(_)) {
            return Err(ModelError::Training(format!(
                "NCCL DDP needs the model on a GPU, not {:?}",
                self.device
            )));
        }
        self.step_with::<LocalGroup>(batch, Some((Reducer::Nccl(group), weight)))
    }

    /// Makes the next step raise `e` inside libtorch (tests).
    pub fn inject_error(&mut self, e: InjectedError) {
        self.inject = Some(e);
    }

    /// A step: libtorch's errors (tch panics on them) come back as errors with libtorch's text,
    /// and a failed step ends the trainer.
    fn step_with<G: Collective>(
        &mut self,
        batch: &Batch,
        ddp: Option<(Reducer<'_, G>, f32)>,
    ) -> Result<StepStats, ModelError> {
        if let Some(e) = &self.failed {
            return Err(ModelError::Training(format!(
                "an earlier step failed ({e}); the trainer's state is undefined"
            )));
        }
        let r = catch_torch(&format!("pytorch step {}", self.steps_taken), || {
            self.step_inner(batch, ddp)
        });
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r
    }

    fn step_inner<G: Collective>(
        &mut self,
        batch: &Batch,
        ddp: Option<(Reducer<'_, G>, f32)>,
    ) -> Result<StepStats, ModelError> {
        self.opt.set_lr(self.opts.lr * self.opts.schedule.factor(self.steps_taken));
        self.opt.zero_grad();
        let mut loss = self.forward(batch)?;
        if let Some(e) = self.inject.take() {
            e.raise(self.device);
        }
        let scale = self.scaler.as_ref().map_or(1.0, |s| s.scale);
        if scale != 1.0 {
            (&loss * scale).backward();
        } else {
            loss.backward();
        }
        let grads: Vec<Tensor> =
            self.ordered.iter().map(|(_, t)| t.grad()).filter(|g| g.defined()).collect();
        if let Some((reducer, weight)) = ddp {
            loss = self.ddp_all_reduce(&loss, &grads, reducer, weight)?;
        }
        // GradScaler with a fused optimizer, as HF Trainer drives it. With clipping (HF's
        // default max_grad_norm=1.0) Accelerate's clip_grad_norm_ first calls
        // scaler.unscale_(): the gradients are unscaled here (× 1/scale, exact for the
        // power-of-two scales GradScaler uses, as its _amp_foreach_non_finite_check_and_unscale_)
        // and the optimizer gets grad_scale=None; on inf/NaN torch's kernel receives
        // found_inf=1 and changes nothing, which is what skipping the call does here. Without
        // clipping nobody calls unscale_, and GradScaler.step hands the scale and found_inf
        // to `_fused_adamw_`, which unscales inside the kernel: so does `kernel_unscales`.
        let kernel_unscales = scale != 1.0 && self.opts.max_grad_norm <= 0.0;
        let grad_norm = tch::no_grad(|| {
            if scale != 1.0 && !kernel_unscales {
                for g in &grads {
                    let _ = g.shallow_clone().g_mul_scalar_(1.0 / scale);
                }
            }
            // torch.nn.utils.clip_grad_norm_: norm of the per-tensor norms.
            let norms: Vec<Tensor> = grads.iter().map(|g| g.to_kind(Kind::Float).norm()).collect();
            let norm = Tensor::stack(&norms, 0).norm().double_value(&[]);
            // The statistic is of the unscaled gradients either way.
            if kernel_unscales {
                norm / scale
            } else {
                norm
            }
        });
        let skipped = if kernel_unscales {
            tch::no_grad(|| self.opt.step(Some(scale)))? == StepOutcome::FoundInf
        } else if grad_norm.is_finite() {
            if self.opts.max_grad_norm > 0.0 {
                let coef = self.opts.max_grad_norm / (grad_norm + 1e-6);
                if coef < 1.0 {
                    tch::no_grad(|| {
                        for g in &grads {
                            let _ = g.shallow_clone().g_mul_scalar_(coef);
                        }
                    });
                }
            }
            tch::no_grad(|| self.opt.step(None))?;
            false
        } else {
            true
        };
        if let Some(s) = self.scaler.as_mut() {
            if skipped {
                s.scale *= 0.5;
                s.clean_steps = 0;
            } else {
                s.clean_steps += 1;
                if s.clean_steps == 2000 {
                    s.scale *= 2.0;
                    s.clean_steps = 0;
                }
            }
        }
        self.steps_taken += 1;
        Ok(StepStats { loss: loss.double_value(&[]), grad_norm, loss_scale: scale, skipped })
    }

    /// DDP: the loss and every gradient summed over ranks, each rank's weighted by `weight`
    /// (its share of the labelled tokens); returns the summed loss.
    fn ddp_all_reduce<G: Collective>(
        &mut self,
        loss: &Tensor,
        grads: &[Tensor],
        reducer: Reducer<'_, G>,
        weight: f32,
    ) -> Result<Tensor, ModelError> {
        let err = |e: CollectiveError| ModelError::Training(format!("DDP all-reduce: {e}"));
        let local = loss.double_value(&[]) as f32;
        // An empty rank (no labelled token) has a NaN mean loss: it contributes nothing.
        let mut l = [if weight == 0.0 { 0.0 } else { local * weight }];
        match reducer {
            Reducer::Host(g) => g.all_reduce(&mut l, ReduceOp::Sum),
            Reducer::Nccl(g) => g.all_reduce(&mut l, ReduceOp::Sum),
        }
        .map_err(err)?;
        let loss = Tensor::from(f64::from(l[0]));
        // As torch DDP: the gradients in buckets of at most 25 MiB, last parameters first (the
        // order the backward produces them), each bucket all-reduced on its own — no
        // full-size copy of the gradients. The reduction is element-wise, so the result is
        // the same bits as one flat all-reduce.
        let cap = (self.bucket_bytes / 4).max(1);
        let mut bucket = std::mem::take(&mut self.bucket);
        let device = self.device;
        let res = tch::no_grad(|| -> Result<(), ModelError> {
            let mut end = grads.len();
            while end > 0 {
                // grads[start..end]: as many as fit the cap (at least one).
                let mut start = end - 1;
                let mut n = grads[start].numel();
                while start > 0 && n + grads[start - 1].numel() <= cap {
                    start -= 1;
                    n += grads[start].numel();
                }
                let part = &grads[start..end];
                match &reducer {
                    Reducer::Host(group) => host_bucket(*group, part, &mut bucket, weight, device)?,
                    Reducer::Nccl(group) => nccl_bucket(group, part, weight)?,
                }
                end = start;
            }
            Ok(())
        });
        self.bucket = bucket;
        res?;
        Ok(loss)
    }

    /// The current parameters under their HF names.
    pub fn weights(&self) -> Weights {
        export(&self.ordered)
    }

    /// The gradients of one forward/backward on `batch` (dropout as configured), without an
    /// update: what the engine's gradients are compared against.
    pub fn gradients_of(&mut self, batch: &Batch) -> Weights {
        self.opt.zero_grad();
        self.model.loss(batch, self.device, true).backward();
        let grads: Vec<(String, Tensor)> =
            self.ordered.iter().map(|(n, t)| (n.clone(), t.grad())).collect();
        export(&grads)
    }

    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// The optimizer implementation, as HF's `optim=` names it (`adamw_torch_fused`).
    pub fn optimizer_implementation(&self) -> &'static str {
        self.opt.implementation()
    }
}

/// One DDP bucket through the host group: the gradients of `part`, flat, f32 and weighted, in
/// a reused host buffer, all-reduced, copied back in their kinds.
fn host_bucket<G: Collective>(
    group: &G,
    part: &[Tensor],
    bucket: &mut Vec<f32>,
    weight: f32,
    device: Device,
) -> Result<(), ModelError> {
    let err = |e: CollectiveError| ModelError::Training(format!("DDP all-reduce: {e}"));
    bucket.clear();
    for g in part {
        let flat = g.flatten(0, -1).to_kind(Kind::Float).to_device(Device::Cpu).contiguous();
        let v = Vec::<f32>::try_from(&flat).map_err(|e| ModelError::Training(e.to_string()))?;
        bucket.extend_from_slice(&v);
    }
    if weight == 0.0 {
        bucket.fill(0.0);
    } else {
        bucket.iter_mut().for_each(|g| *g *= weight);
    }
    group.all_reduce(bucket, ReduceOp::Sum).map_err(err)?;
    let mut at = 0;
    for g in part {
        let k = g.numel();
        let mut g = g.shallow_clone();
        let r = Tensor::from_slice(&bucket[at..at + k]).to_device(device).to_kind(g.kind());
        g.copy_(&r.view_as(&g));
        at += k;
    }
    Ok(())
}

/// One DDP bucket through NCCL: a device tensor of the bucket's gradients, flat, f32 and
/// weighted, all-reduced on the group's stream under its watchdog, copied back.
fn nccl_bucket(group: &DeviceGroup, part: &[Tensor], weight: f32) -> Result<(), ModelError> {
    let err = |e: CollectiveError| ModelError::Training(format!("DDP all-reduce: {e}"));
    let flats: Vec<Tensor> = part.iter().map(|g| g.flatten(0, -1).to_kind(Kind::Float)).collect();
    let mut b = Tensor::cat(&flats, 0);
    if weight == 0.0 {
        let _ = b.zero_();
    } else {
        let _ = b.g_mul_scalar_(f64::from(weight));
    }
    // SAFETY: `b` is a live contiguous f32 device tensor of b.numel()
    // elements, kept alive until the copies below (queued after the
    // collective on the same stream) have read it.
    unsafe {
        group.queue_all_reduce(
            b.data_ptr() as u64,
            b.numel(),
            ElementKind::F32,
            ReduceOp::Sum,
            std::ptr::null_mut(),
        )
    }
    .map_err(err)?;
    // Under the watchdog: a peer that stopped fails the step after the
    // collective timeout instead of blocking the step's synchronise.
    group.watch(Some(std::ptr::null_mut()), "ncclAllReduce").map_err(err)?;
    let mut at = 0i64;
    for g in part {
        let k = g.numel() as i64;
        let mut g = g.shallow_clone();
        g.copy_(&b.narrow(0, at, k).view_as(&g).to_kind(g.kind()));
        at += k;
    }
    Ok(())
}

/// Where DDP's buckets are reduced: in host memory by a host transport, or in device memory by
/// NCCL.
enum Reducer<'a, G: Collective> {
    Host(&'a G),
    Nccl(&'a DeviceGroup),
}
