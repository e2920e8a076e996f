// Which instruction-set build of loom's fused CPU kernels runs here: chosen once, the way ATen
// chooses its own kernels (at::get_cpu_capability(), so ATEN_CPU_CAPABILITY lowers both alike).
#pragma once

#include <cstdint>

namespace loom::models::kernels {

enum class KernelIsa { kDefault, kAvx2, kAvx512 };

KernelIsa kernel_isa();

// Picks the function of the running instruction set among a kernel's three builds.
template <typename Fn>
Fn pick_kernel(Fn default_fn, [[maybe_unused]] Fn avx2_fn, [[maybe_unused]] Fn avx512_fn) {
#if LOOM_KERNELS_X86
  switch (kernel_isa()) {
    case KernelIsa::kAvx512: return avx512_fn;
    case KernelIsa::kAvx2: return avx2_fn;
    case KernelIsa::kDefault: break;
  }
#endif
  return default_fn;
}

// A kernel's AVX2 / AVX-512 build where this target compiles them (the default one elsewhere).
#if LOOM_KERNELS_X86
#define LOOM_KERNEL_AVX2(name) AVX2::name
#define LOOM_KERNEL_AVX512(name) AVX512::name
#else
#define LOOM_KERNEL_AVX2(name) DEFAULT::name
#define LOOM_KERNEL_AVX512(name) DEFAULT::name
#endif

// Elements per intra-op task: large enough that a thread's share amortizes waking it.
constexpr int64_t kKernelGrain = 1 << 15;

}  // namespace loom::models::kernels
