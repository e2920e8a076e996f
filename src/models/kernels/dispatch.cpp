#include "dispatch.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include <mutex>
#include <set>

#include "loom/models/kernels/capability.h"

namespace loom::models::kernels {

KernelIsa kernel_isa() {
  static const KernelIsa chosen = [] {
#if LOOM_KERNELS_X86
    const std::string aten = at::get_cpu_capability();
    if (aten == "AVX512") return KernelIsa::kAvx512;
    if (aten == "AVX2") return KernelIsa::kAvx2;
#endif
    return KernelIsa::kDefault;
  }();
  return chosen;
}

std::string kernel_cpu_capability() {
  switch (kernel_isa()) {
    case KernelIsa::kAvx512: return "AVX512";
    case KernelIsa::kAvx2: return "AVX2";
    case KernelIsa::kDefault: break;
  }
  return "DEFAULT";
}

int kernel_threads_used(int64_t tasks) {
  std::mutex mutex;
  std::set<int> threads;
  at::parallel_for(0, tasks, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(at::get_thread_num());
  });
  return static_cast<int>(threads.size());
}

}  // namespace loom::models::kernels
