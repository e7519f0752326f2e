// torch.optim.AdamW(fused=True) for the tch baseline — HF Trainer's default optimizer
// (`optim="adamw_torch_fused"` for torch >= 2.8). tch has no binding for ATen's
// `_fused_adamw_`, so this shim calls it through ATen's C++ API, with the step-counter
// handling of torch/optim/adam.py `_fused_adam` and the GradScaler protocol of
// torch/amp/grad_scaler.py for optimizers with `_step_supports_amp_scaling`.
//
// Tensors cross the FFI as tch's C_tensor pointers, which are `torch::Tensor*`
// (torch-sys libtch/torch_api.h: `typedef torch::Tensor *tensor;`).
#include <ATen/core/Tensor.h>
#include <ATen/Functions.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {
void copy_error(const char* what, char* err, int len) {
  if (err && len > 0) {
    std::strncpy(err, what, len - 1);
    err[len - 1] = '\0';
  }
}

std::vector<at::Tensor> list(at::Tensor* const* ts, int64_t n) {
  std::vector<at::Tensor> v;
  v.reserve(n);
  for (int64_t i = 0; i < n; ++i) v.push_back(*ts[i]);
  return v;
}
}  // namespace

// One param group's step of torch.optim.AdamW(fused=True): `_foreach_add_(state_steps, 1)`,
// `_fused_adamw_(…)`, and with a loss scale, GradScaler.step's fused path.
//
// grad_scale <= 0: the gradients are already unscaled (GradScaler.unscale_ ran, as HF does
// before clipping) or there is no scaler: the kernel runs with grad_scale = found_inf = None.
// grad_scale > 0: GradScaler.step for a fused optimizer whose gradients are still scaled:
// found_inf from `_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, 1.0)`
// (GradScaler._check_inf_per_device), then the kernel divides the gradients by grad_scale
// itself and leaves everything unchanged when found_inf is set; the step counters are
// decremented by found_inf afterwards, as `_fused_adam` does. *found_inf_out gets 0 or 1.
//
// All tensors of one call share a device and dtype (fp32 parameters, gradients and moments;
// state_steps are 0-dim fp32 tensors on the parameters' device, as torch keeps them for
// fused=True). Returns 0, or 1 with a message in err.
extern "C" int ortbench_fused_adamw(at::Tensor* const* params, at::Tensor* const* grads, at::Tensor* const* exp_avgs,
                                    at::Tensor* const* exp_avg_sqs, at::Tensor* const* state_steps, int64_t n, double lr,
                                    double beta1, double beta2, double weight_decay, double eps, double grad_scale,
                                    int* found_inf_out, char* err, int len) {
  try {
    if (found_inf_out) *found_inf_out = 0;
    if (n == 0) return 0;
    at::AutoGradMode no_grad(false);  // torch.optim steps under torch.no_grad()
    auto p = list(params, n), g = list(grads, n), m = list(exp_avgs, n), v = list(exp_avg_sqs, n),
         s = list(state_steps, n);
    std::optional<at::Tensor> scale, found_inf;
    if (grad_scale > 0) {
      auto opts = p[0].options().dtype(at::kFloat);
      scale = at::full({}, grad_scale, opts);
      found_inf = at::zeros({}, opts);
      at::_amp_foreach_non_finite_check_and_unscale_(g, *found_inf, at::ones({}, opts));
    }
    for (auto& t : s) t.add_(1);
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, s, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false, scale, found_inf);
    if (found_inf) {
      for (auto& t : s) t.sub_(*found_inf);
      if (found_inf_out) *found_inf_out = found_inf->item<float>() != 0.0f;
    }
    return 0;
  } catch (const std::exception& e) {
    copy_error(e.what(), err, len);
    return 1;
  }
}

// optimizer.zero_grad(set_to_none=True) — what HF Trainer's `model.zero_grad()` does: the
// next backward allocates fresh gradients (or steals the incoming ones) instead of
// accumulating into zeroed buffers.
extern "C" void ortbench_set_grads_to_none(at::Tensor* const* params, int64_t n) {
  for (int64_t i = 0; i < n; ++i) params[i]->mutable_grad().reset();
}

// A probe of the ATen operators a region of code dispatches on this thread, through
// RecordFunction (what torch.profiler observes): each op's name and the largest element
// count among its tensor inputs. One probe per thread at a time.
namespace {
struct OpRecord {
  std::string name;
  int64_t max_input_numel;
};
thread_local std::vector<OpRecord> t_ops;
thread_local bool t_probing = false;
thread_local at::CallbackHandle t_handle = 0;

std::unique_ptr<at::ObserverContext> on_op(const at::RecordFunction& fn) {
  int64_t numel = 0;
  for (const auto& input : fn.inputs()) {
    if (input.isTensor()) {
      const auto& t = input.toTensor();
      if (t.defined()) numel = std::max<int64_t>(numel, t.numel());
    } else if (input.isTensorList()) {
      for (const auto& t : input.toTensorVector())
        if (t.defined()) numel = std::max<int64_t>(numel, t.numel());
    }
  }
  t_ops.push_back({fn.name(), numel});
  return nullptr;
}
}  // namespace

extern "C" int ortbench_op_probe_start(char* err, int len) {
  try {
    if (t_probing) {
      copy_error("an op probe is already running on this thread", err, len);
      return 1;
    }
    t_ops.clear();
    t_handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_op).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
    t_probing = true;
    return 0;
  } catch (const std::exception& e) {
    copy_error(e.what(), err, len);
    return 1;
  }
}

// Stops the probe; returns the number of ops recorded (read them with ortbench_op_probe_get).
extern "C" int64_t ortbench_op_probe_stop() {
  if (t_probing) {
    at::removeCallback(t_handle);
    t_probing = false;
  }
  return static_cast<int64_t>(t_ops.size());
}

// The i-th recorded op: its name into name (NUL-terminated, truncated to len) and its
// largest input's element count. Returns 0, or 1 when i is out of range.
extern "C" int ortbench_op_probe_get(int64_t i, char* name, int len, int64_t* max_input_numel) {
  if (i < 0 || i >= static_cast<int64_t>(t_ops.size())) return 1;
  copy_error(t_ops[i].name.c_str(), name, len);
  *max_input_numel = t_ops[i].max_input_numel;
  return 0;
}
