// The per-instruction-set bodies of the fused rotary embedding (rotary_kernel.inc, compiled once
// per CPU_CAPABILITY by src/CMakeLists.txt).
#pragma once

#include <cstdint>

namespace loom::models::kernels {

// The widest head the kernel takes (its per-position cos/sin buffers live on the stack).
constexpr int64_t kRotaryMaxHeadDim = 1024;

// Rotates `heads` rows of head_dim floats at one position by the position's (cos, sin) pairs,
// rotation [head_dim / 2][2]; `sign` -1 rotates by the inverse angle (backward).
#define LOOM_ROTARY_DECLARE(ISA)                                                              \
  namespace ISA {                                                                             \
  void rotate_heads(const float* x, const float* rotation, float* out, int64_t heads,         \
                    int64_t head_dim, float sign);                                            \
  }

LOOM_ROTARY_DECLARE(DEFAULT)
#if LOOM_KERNELS_X86
LOOM_ROTARY_DECLARE(AVX2)
LOOM_ROTARY_DECLARE(AVX512)
#endif
#undef LOOM_ROTARY_DECLARE

}  // namespace loom::models::kernels
