// The per-instruction-set bodies of the fused RMSNorm kernel (rms_norm_kernel.inc, compiled once
// per CPU_CAPABILITY by src/CMakeLists.txt). Each works on `rows` contiguous rows of `dim` floats.
#pragma once

#include <cstdint>

namespace loom::models::kernels {

#define LOOM_RMS_NORM_DECLARE(ISA)                                                            \
  namespace ISA {                                                                             \
  void rms_norm_forward(const float* x, const float* weight, float* y, float* rstd,           \
                        int64_t rows, int64_t dim, float eps);                                \
  void rms_norm_add_forward(const float* x, const float* delta, const float* weight,         \
                            float* sum, float* y, float* rstd, int64_t rows, int64_t dim,     \
                            float eps);                                                       \
  void rms_norm_backward(const float* grad, const float* x, const float* weight,              \
                         const float* rstd, const float* grad_residual, float* grad_x,        \
                         float* grad_weight, int64_t rows, int64_t dim);                      \
  }

LOOM_RMS_NORM_DECLARE(DEFAULT)
#if LOOM_KERNELS_X86
LOOM_RMS_NORM_DECLARE(AVX2)
LOOM_RMS_NORM_DECLARE(AVX512)
#endif
#undef LOOM_RMS_NORM_DECLARE

}  // namespace loom::models::kernels
