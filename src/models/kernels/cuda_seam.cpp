// Finds loom's CUDA kernels in the loaded CUDA support library, and the switch that enables them
// (include/loom/models/kernels/cuda.h).
#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>

#include "loom/core/cuda_support.h"
#include "loom/models/kernels/cuda.h"

// The library's entry point for the kernels (src/models/kernels/cuda/cuda_kernels_library.cpp).
extern "C" {
using LoomCudaKernelsEntry = const loom::models::kernels::CudaKernels* (*)();
}

namespace loom::models::kernels {
namespace {

std::atomic<bool> enabled{false};

}  // namespace

const CudaKernels* cuda_kernels() {
  static const CudaKernels* const kernels = []() -> const CudaKernels* {
    auto entry =
        reinterpret_cast<LoomCudaKernelsEntry>(device::cuda_support_symbol("loom_cuda_kernels"));
    return entry != nullptr ? entry() : nullptr;
  }();
  return kernels;
}

void set_cuda_kernels_enabled(bool on) {
  enabled.store(on);
}

bool cuda_kernels_enabled() {
  return enabled.load();
}

const CudaKernels* enabled_cuda_kernels() {
  return enabled.load() ? cuda_kernels() : nullptr;
}

bool kernels_run_on(int index) {
  // Per device: 0 not asked yet, 1 runs, 2 does not (a build without its architecture).
  static std::array<std::atomic<int>, 64> known{};
  if (cuda_kernels() == nullptr || index < 0) return false;
  if (index >= static_cast<int>(known.size())) return cuda_kernels()->device_support(index).empty();
  int state = known[static_cast<size_t>(index)].load();
  if (state == 0) {
    state = cuda_kernels()->device_support(index).empty() ? 1 : 2;
    known[static_cast<size_t>(index)].store(state);
  }
  return state == 1;
}

bool cuda_kernel_tensor(const at::Tensor& t) {
  return t.defined() && t.is_cuda() &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16) && t.is_contiguous() &&
         t.numel() > 0 && kernels_run_on(t.get_device());
}

std::string cuda_kernels_status(int index) {
  if (cuda_kernels() == nullptr) {
    return "ATen's compositions (loom's CUDA kernels are not in this build or not loaded: " +
           device::cuda_support_status() + ")";
  }
  if (const std::string why = cuda_kernels()->device_support(index); !why.empty()) {
    return "ATen's compositions (" + why + ")";
  }
  if (!enabled.load()) {
    return "ATen's compositions (loom's CUDA kernels are built but off: training.cuda_kernels "
           "= true turns them on)";
  }
  return "loom's CUDA kernels (RMSNorm + residual, SwiGLU, RoPE, cross-entropy, gradient norm "
         "and clip; training.cuda_kernels = true)";
}

}  // namespace loom::models::kernels
