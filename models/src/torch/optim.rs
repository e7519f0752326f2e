//! torch.optim.AdamW(fused=True) — HF Trainer's default `optim="adamw_torch_fused"` (torch ≥
//! 2.8) — over ATen's `_fused_adamw_` through a C++ shim (optim.cpp): tch binds only the
//! per-tensor AdamW of libtorch's C++ frontend. Also an op probe over ATen's RecordFunction,
//! so that tests can see which kernels a region of code dispatched.

use std::ffi::{c_char, c_int, CStr};

use tch::{Kind, Tensor};
use torch_sys::C_tensor;

use crate::ModelError;

extern "C" {
    fn ortbench_fused_adamw(
        params: *const *mut C_tensor,
        grads: *const *mut C_tensor,
        exp_avgs: *const *mut C_tensor,
        exp_avg_sqs: *const *mut C_tensor,
        state_steps: *const *mut C_tensor,
        n: i64,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        grad_scale: f64,
        found_inf: *mut c_int,
        err: *mut c_char,
        len: c_int,
    ) -> c_int;
    fn ortbench_set_grads_to_none(params: *const *mut C_tensor, n: i64);
    fn ortbench_op_probe_start(err: *mut c_char, len: c_int) -> c_int;
    fn ortbench_op_probe_stop() -> i64;
    fn ortbench_op_probe_get(
        i: i64,
        name: *mut c_char,
        len: c_int,
        max_input_numel: *mut i64,
    ) -> c_int;
}

// The shim takes `torch::Tensor*`, which is what a tch Tensor's C pointer is.
fn ptrs(ts: &[Tensor]) -> Vec<*mut C_tensor> {
    ts.iter().map(|t| t.as_ptr() as *mut C_tensor).collect()
}

fn message(err: &[c_char; 512]) -> String {
    // SAFETY: the shim NUL-terminates whatever it writes into `err`, which starts zeroed.
    unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned()
}

/// One torch param group: its parameters and their AdamW state.
struct ParamGroup {
    params: Vec<Tensor>,
    exp_avgs: Vec<Tensor>,
    exp_avg_sqs: Vec<Tensor>,
    /// torch keeps `state["step"]` as a 0-dim fp32 tensor on the parameter's device when
    /// fused=True (torch/optim/adam.py `_init_group`).
    steps: Vec<Tensor>,
    weight_decay: f64,
}

/// torch.optim.AdamW(param_groups, lr, betas, eps, fused=True).
pub struct FusedAdamW {
    groups: Vec<ParamGroup>,
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
}

/// What `FusedAdamW::step` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    Applied,
    /// The kernel saw inf/NaN in the (scaled) gradients and left everything unchanged.
    FoundInf,
}

impl FusedAdamW {
    /// The implementation, named as HF TrainingArguments names it (`optim=`).
    pub const IMPLEMENTATION: &'static str = "adamw_torch_fused";
    /// The ATen operator each group's step dispatches.
    pub const ATEN_OP: &'static str = "aten::_fused_adamw_";

    /// `groups`: (parameters, weight decay) in param-group order (HF Trainer: decay, then
    /// no-decay). State is zeros, as torch initialises it lazily at the first step.
    pub fn new(groups: Vec<(Vec<Tensor>, f64)>, lr: f64, beta1: f64, beta2: f64, eps: f64) -> Self {
        let groups = groups
            .into_iter()
            .map(|(params, weight_decay)| {
                let zeros = |p: &Tensor| Tensor::zeros_like(p);
                ParamGroup {
                    exp_avgs: params.iter().map(zeros).collect(),
                    exp_avg_sqs: params.iter().map(zeros).collect(),
                    steps: params
                        .iter()
                        .map(|p| Tensor::zeros([], (Kind::Float, p.device())))
                        .collect(),
                    params,
                    weight_decay,
                }
            })
            .collect();
        FusedAdamW { groups, lr, beta1, beta2, eps }
    }

    pub fn implementation(&self) -> &'static str {
        Self::IMPLEMENTATION
    }

    pub fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// `zero_grad(set_to_none=True)`, torch's default and what HF Trainer calls.
    pub fn zero_grad(&self) {
        for g in &self.groups {
            let p = ptrs(&g.params);
            // SAFETY: the pointers are live tch tensors for the duration of the call.
            unsafe { ortbench_set_grads_to_none(p.as_ptr(), p.len() as i64) };
        }
    }

    /// One step over every parameter that has a gradient (as torch skips `p.grad is None`),
    /// one `_fused_adamw_` call per param group. `grad_scale`: `None` when the gradients are
    /// already unscaled (or there is no scaler); `Some(scale)` hands the loss scale to the
    /// kernel, as GradScaler.step does for fused optimizers when `unscale_` was not called.
    pub fn step(&mut self, grad_scale: Option<f64>) -> Result<StepOutcome, ModelError> {
        let mut found_any = false;
        for g in &self.groups {
            let with_grad: Vec<usize> =
                (0..g.params.len()).filter(|&i| g.params[i].grad().defined()).collect();
            if with_grad.is_empty() {
                continue;
            }
            let pick = |ts: &[Tensor]| {
                with_grad.iter().map(|&i| ts[i].shallow_clone()).collect::<Vec<_>>()
            };
            let params = pick(&g.params);
            let grads: Vec<Tensor> = params.iter().map(Tensor::grad).collect();
            let (exp_avgs, exp_avg_sqs, steps) =
                (pick(&g.exp_avgs), pick(&g.exp_avg_sqs), pick(&g.steps));
            let (p, gr, m, v, s) =
                (ptrs(&params), ptrs(&grads), ptrs(&exp_avgs), ptrs(&exp_avg_sqs), ptrs(&steps));
            let mut found_inf: c_int = 0;
            let mut err = [0 as c_char; 512];
            // SAFETY: five arrays of n live tensor pointers; `found_inf` and `err` outlive the
            // call and err's length is passed.
            let rc = unsafe {
                ortbench_fused_adamw(
                    p.as_ptr(),
                    gr.as_ptr(),
                    m.as_ptr(),
                    v.as_ptr(),
                    s.as_ptr(),
                    p.len() as i64,
                    self.lr,
                    self.beta1,
                    self.beta2,
                    g.weight_decay,
                    self.eps,
                    grad_scale.unwrap_or(0.0),
                    &mut found_inf,
                    err.as_mut_ptr(),
                    512,
                )
            };
            if rc != 0 {
                return Err(ModelError::Training(format!(
                    "torch fused AdamW step: {}",
                    message(&err)
                )));
            }
            found_any |= found_inf != 0;
        }
        Ok(if found_any { StepOutcome::FoundInf } else { StepOutcome::Applied })
    }
}

/// One ATen operator dispatched inside `probe_ops`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpCall {
    /// e.g. `aten::_fused_adamw_`.
    pub name: String,
    /// The largest element count among its tensor inputs.
    pub max_input_numel: i64,
}

/// Runs `f` and returns the ATen operators it dispatched on this thread (as torch.profiler
/// sees them, through RecordFunction), in order. For tests: recording costs per op.
pub fn probe_ops<T>(f: impl FnOnce() -> T) -> Result<(T, Vec<OpCall>), ModelError> {
    let mut err = [0 as c_char; 512];
    // SAFETY: plain C call; `err` outlives it and its length is passed.
    if unsafe { ortbench_op_probe_start(err.as_mut_ptr(), 512) } != 0 {
        return Err(ModelError::Training(format!("op probe: {}", message(&err))));
    }
    let out = f();
    // SAFETY: plain C calls; `name` outlives each and its length is passed.
    let n = unsafe { ortbench_op_probe_stop() };
    let calls = (0..n)
        .map(|i| {
            let mut name = [0 as c_char; 512];
            let mut numel = 0i64;
            unsafe { ortbench_op_probe_get(i, name.as_mut_ptr(), 512, &mut numel) };
            OpCall { name: message(&name), max_input_numel: numel }
        })
        .collect();
    Ok((out, calls))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// AdamW (Loshchilov & Hutter; torch.optim.AdamW's documented algorithm) written out in
    /// f64 for one parameter tensor, `steps` updates with the given gradients.
    fn reference(
        p: &[f64],
        grads: &[Vec<f64>],
        lr: f64,
        wd: f64,
        (b1, b2, eps): (f64, f64, f64),
    ) -> Vec<f64> {
        let mut p = p.to_vec();
        let (mut m, mut v) = (vec![0.0; p.len()], vec![0.0; p.len()]);
        for (t, g) in grads.iter().enumerate() {
            let t = (t + 1) as i32;
            for i in 0..p.len() {
                p[i] -= lr * wd * p[i];
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                let m_hat = m[i] / (1.0 - b1.powi(t));
                let v_hat = v[i] / (1.0 - b2.powi(t));
                p[i] -= lr * m_hat / (v_hat.sqrt() + eps);
            }
        }
        p
    }

    fn to_f64(t: &Tensor) -> Vec<f64> {
        Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).unwrap()
    }

    /// Random parameters and gradients (never zeros), two groups with and without decay,
    /// three steps: the fused kernel runs (the probe sees `aten::_fused_adamw_`, once per
    /// group per step) and matches the f64 formula within 1e-6 relative to the update size.
    #[test]
    fn fused_adamw_matches_the_adamw_formula_and_is_the_kernel_that_runs() {
        tch::manual_seed(7);
        let (lr, wd, hp) = (1e-2, 0.1, (0.9, 0.999, 1e-8));
        let shapes: [&[i64]; 3] = [&[17, 5], &[33], &[4, 3, 2]];
        let params: Vec<Tensor> = shapes
            .iter()
            .map(|s| Tensor::randn(*s, (Kind::Float, Device::Cpu)).set_requires_grad(true))
            .collect();
        let init: Vec<Vec<f64>> = params.iter().map(to_f64).collect();
        let groups = vec![
            (vec![params[0].shallow_clone(), params[2].shallow_clone()], wd),
            (vec![params[1].shallow_clone()], 0.0),
        ];
        let mut opt = FusedAdamW::new(groups, lr, hp.0, hp.1, hp.2);
        assert_eq!(opt.implementation(), "adamw_torch_fused");
        let mut grads: Vec<Vec<Vec<f64>>> = vec![vec![]; params.len()];
        for _ in 0..3 {
            opt.zero_grad();
            assert!(params.iter().all(|p| !p.grad().defined()), "zero_grad sets gradients to None");
            // loss = Σ_i Σ p_i · r_i: the gradient of p_i is the random r_i.
            let r: Vec<Tensor> = params.iter().map(Tensor::randn_like).collect();
            let loss = params
                .iter()
                .zip(&r)
                .map(|(p, r)| (p * r).sum(Kind::Float))
                .reduce(|a, b| a + b)
                .unwrap();
            loss.backward();
            for (k, r) in r.iter().enumerate() {
                grads[k].push(to_f64(r));
            }
            let (outcome, ops) = probe_ops(|| tch::no_grad(|| opt.step(None))).unwrap();
            assert_eq!(outcome.unwrap(), StepOutcome::Applied);
            let fused = ops.iter().filter(|o| o.name == FusedAdamW::ATEN_OP).count();
            assert_eq!(
                fused,
                2,
                "one _fused_adamw_ per param group: {:?}",
                ops.iter().map(|o| &o.name).collect::<Vec<_>>()
            );
        }
        for (k, p) in params.iter().enumerate() {
            let wd = if k == 1 { 0.0 } else { wd };
            let want = reference(&init[k], &grads[k], lr, wd, hp);
            let got = to_f64(p);
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            // Parameters are N(0, 1) (|p| < 5, fp32 ulp ≤ 4.8e-7) and move by about lr per
            // step: the fp32 kernel agrees with the f64 formula to a few ulp (measured ≤ 2.4e-7).
            println!("param {k}: max |fused - formula| = {worst:.2e}");
            assert!(worst < 1e-6, "param {k}: max |fused - formula| = {worst:.2e}");
            assert!(
                got.iter().zip(&init[k]).any(|(a, b)| (a - b).abs() > 1e-3),
                "param {k} did not move"
            );
        }
    }

    /// GradScaler's fused path: with the loss scale handed to the kernel, scaled gradients
    /// give the same update as unscaled ones (the scale is a power of two), and an inf
    /// gradient leaves parameters, moments and the step counter unchanged.
    #[test]
    fn fused_adamw_unscales_in_the_kernel_and_skips_on_inf() {
        tch::manual_seed(11);
        let p0 = Tensor::randn([64], (Kind::Float, Device::Cpu));
        let g = Tensor::randn([64], (Kind::Float, Device::Cpu));
        let run = |scale: Option<f64>, grad: &Tensor| {
            let p = p0.copy().set_requires_grad(true);
            let mut opt =
                FusedAdamW::new(vec![(vec![p.shallow_clone()], 0.01)], 1e-3, 0.9, 0.999, 1e-8);
            (&p * grad).sum(Kind::Float).backward();
            let out = tch::no_grad(|| opt.step(scale)).unwrap();
            (p.detach(), out, opt.groups[0].steps[0].double_value(&[]))
        };
        let (plain, o1, s1) = run(None, &g);
        let (scaled, o2, s2) = run(Some(65536.0), &(&g * 65536.0));
        assert_eq!((o1, o2, s1, s2), (StepOutcome::Applied, StepOutcome::Applied, 1.0, 1.0));
        assert!(plain.equal(&scaled), "unscaling by a power of two in the kernel is exact");
        let bad = g.copy();
        let _ = bad.get(3).fill_(f64::INFINITY);
        let (after, o3, s3) = run(Some(65536.0), &bad);
        assert_eq!((o3, s3), (StepOutcome::FoundInf, 0.0));
        assert!(after.equal(&p0), "a step with inf gradients changes nothing");
    }
}
