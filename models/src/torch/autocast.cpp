// torch.autocast(device_type, dtype) for the tch baseline. tch exposes only CUDA autocast
// with its default dtype (fp16); HF Trainer's bf16 runs autocast with dtype=bfloat16, on CPU
// as well as on CUDA, so we set device and dtype ourselves through ATen's C++ API.
#include <ATen/autocast_mode.h>
#include <cstring>
#include <exception>

namespace {
void copy_error(const std::exception& e, char* err, int len) {
  if (err && len > 0) {
    std::strncpy(err, e.what(), len - 1);
    err[len - 1] = '\0';
  }
}
at::DeviceType device_type(int cuda) { return cuda ? at::kCUDA : at::kCPU; }
}  // namespace

// Enters an autocast region: enabled on the device, compute dtype fp16 (0) or bf16 (1).
// Returns 0, or 1 with a message in err.
extern "C" int ortbench_autocast_enter(int cuda, int bf16, char* err, int len) {
  try {
    auto dev = device_type(cuda);
    at::autocast::set_autocast_enabled(dev, true);
    at::autocast::set_autocast_dtype(dev, bf16 ? at::kBFloat16 : at::kHalf);
    at::autocast::increment_nesting();
    return 0;
  } catch (const std::exception& e) {
    copy_error(e, err, len);
    return 1;
  }
}

// Leaves it: as torch.autocast.__exit__, the cast cache is cleared at the outermost exit.
extern "C" int ortbench_autocast_exit(int cuda, char* err, int len) {
  try {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type(cuda), false);
    return 0;
  } catch (const std::exception& e) {
    copy_error(e, err, len);
    return 1;
  }
}
