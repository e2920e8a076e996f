// The loop every fused elementwise kernel body runs: full vectors, then one partial vector for
// the tail. Header-only and ISA-neutral: each *_kernel.inc instantiates it with its own step.
#pragma once

#include <cstdint>

namespace loom::models::kernels {

// step(i, count) for i = 0, width, 2 * width, ... with count = width, then once for the
// remaining n % width elements (count < width) if there are any.
template <typename Step>
inline void for_each_vector(int64_t n, int64_t width, const Step& step) {
  int64_t i = 0;
  for (; i + width <= n; i += width) step(i, width);
  if (i < n) step(i, n - i);
}

}  // namespace loom::models::kernels
