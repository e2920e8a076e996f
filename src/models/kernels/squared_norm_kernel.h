// The per-instruction-set bodies of the float64 sum of squares (squared_norm_kernel.inc,
// compiled once per CPU_CAPABILITY by src/CMakeLists.txt).
#pragma once

#include <cstdint>

namespace loom::models::kernels {

#define LOOM_SQUARED_NORM_DECLARE(ISA)                        \
  namespace ISA {                                             \
  double sum_of_squares(const float* x, int64_t n);           \
  }

LOOM_SQUARED_NORM_DECLARE(DEFAULT)
#if LOOM_KERNELS_X86
LOOM_SQUARED_NORM_DECLARE(AVX2)
LOOM_SQUARED_NORM_DECLARE(AVX512)
#endif
#undef LOOM_SQUARED_NORM_DECLARE

}  // namespace loom::models::kernels
