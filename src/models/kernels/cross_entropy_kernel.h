// The per-instruction-set bodies of the fused cross-entropy (cross_entropy_kernel.inc, compiled
// once per CPU_CAPABILITY by src/CMakeLists.txt). Each works on `rows` contiguous rows of
// `vocab` logits; a label < 0 (the ignore index) skips its row.
#pragma once

#include <cstdint>

namespace loom::models::kernels {

#define LOOM_CROSS_ENTROPY_DECLARE(ISA)                                                       \
  namespace ISA {                                                                             \
  void cross_entropy_forward(const float* logits, const int64_t* labels, float* loss,         \
                             float* logsumexp, int64_t rows, int64_t vocab);                  \
  void cross_entropy_backward(const float* logits, const int64_t* labels,                     \
                              const float* logsumexp, float scale, float* grad, int64_t rows, \
                              int64_t vocab);                                                 \
  }

LOOM_CROSS_ENTROPY_DECLARE(DEFAULT)
#if LOOM_KERNELS_X86
LOOM_CROSS_ENTROPY_DECLARE(AVX2)
LOOM_CROSS_ENTROPY_DECLARE(AVX512)
#endif
#undef LOOM_CROSS_ENTROPY_DECLARE

}  // namespace loom::models::kernels
