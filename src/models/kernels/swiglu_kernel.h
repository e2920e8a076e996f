// The per-instruction-set bodies of the fused SwiGLU kernel (swiglu_kernel.inc, compiled once
// per CPU_CAPABILITY by src/CMakeLists.txt). Each works on a contiguous range of n floats.
#pragma once

#include <cstdint>

namespace loom::models::kernels {

#define LOOM_SWIGLU_DECLARE(ISA)                                                              \
  namespace ISA {                                                                             \
  void swiglu_forward(const float* a, const float* b, float* out, int64_t n);                 \
  void swiglu_backward(const float* grad, const float* a, const float* b, float* grad_a,      \
                       float* grad_b, int64_t n);                                             \
  }

LOOM_SWIGLU_DECLARE(DEFAULT)
#if LOOM_KERNELS_X86
LOOM_SWIGLU_DECLARE(AVX2)
LOOM_SWIGLU_DECLARE(AVX512)
#endif
#undef LOOM_SWIGLU_DECLARE

}  // namespace loom::models::kernels
