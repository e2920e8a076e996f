// Which instruction-set build of loom's fused CPU kernels runs here: chosen once, the way ATen
// chooses its own kernels (at::get_cpu_capability(), so ATEN_CPU_CAPABILITY lowers both alike).
#pragma once

#include <algorithm>
#include <cstdint>

namespace loom::models::kernels {

enum class KernelIsa { kDefault, kAvx2, kAvx512 };

KernelIsa kernel_isa();

// Picks the function of the running instruction set among a kernel's three builds.
template <typename Fn>
Fn pick_kernel(Fn default_fn, [[maybe_unused]] Fn avx2_fn, [[maybe_unused]] Fn avx512_fn) {
  switch (kernel_isa()) {
    case KernelIsa::kAvx512: return avx512_fn;
    case KernelIsa::kAvx2: return avx2_fn;
    case KernelIsa::kDefault: break;
  }
  return default_fn;
}

// The build of kernel function `name` (declared in each ISA's namespace) that runs here.
#if LOOM_KERNELS_X86
#define LOOM_PICK_KERNEL(name) pick_kernel(DEFAULT::name, AVX2::name, AVX512::name)
#else
#define LOOM_PICK_KERNEL(name) (DEFAULT::name)
#endif

// Elements per intra-op task: large enough that a thread's share amortizes waking it.
constexpr int64_t kKernelGrain = 1 << 15;

// Rows per intra-op task for kernels that work on whole rows of `row_length` floats.
inline int64_t rows_per_task(int64_t row_length) {
  return row_length >= kKernelGrain ? 1 : kKernelGrain / std::max<int64_t>(row_length, 1);
}

}  // namespace loom::models::kernels
