// Finds loom's fused float8 cast kernels in the loaded CUDA support library, and casts through
// them as quantize() defines (include/loom/quantize/float8_cuda.h).
#include "loom/quantize/float8_cuda.h"

#include <ATen/ATen.h>

#include "loom/core/check.h"
#include "loom/core/cuda_support.h"
#include "loom/distributed/comm.h"
#include "loom/models/kernels/cuda.h"

extern "C" {
using LoomCudaFloat8CastsEntry = const loom::quantize::Float8CudaCasts* (*)();
}

namespace loom::quantize {

const Float8CudaCasts* float8_cuda_casts() {
  static const Float8CudaCasts* const casts = []() -> const Float8CudaCasts* {
    auto entry = reinterpret_cast<LoomCudaFloat8CastsEntry>(
        device::cuda_support_symbol("loom_cuda_float8_casts"));
    return entry != nullptr ? entry() : nullptr;
  }();
  return models::kernels::cuda_kernels_enabled() ? casts : nullptr;
}

Float8Tensor fused_quantize(const Float8CudaCasts& casts, const at::Tensor& x, const CastSpec& spec,
                            int64_t reduction_dim, bool power_of_2, distributed::Comm* amax_group,
                            bool with_transposed) {
  LOOM_CHECK(x.dim() == 2, "float8 quantize: a GEMM operand is 2-D, got ", x.sizes());
  const at::Tensor input = x.contiguous();
  if (spec.scaling == Scaling::kTensorwise) {
    at::Tensor amax = casts.amax(input);
    if (amax_group != nullptr) {
      at::Tensor flat = amax.reshape({1});
      amax_group->all_reduce(flat, distributed::ReduceOp::kMax);
      amax = flat.reshape({});
    }
    return with_transposed ? casts.cast_tensorwise_transposed(input, amax, spec.format, power_of_2)
                           : casts.cast_tensorwise(input, amax, spec.format, power_of_2);
  }
  LOOM_CHECK(spec.scaling != Scaling::kNone, "float8 quantize of an operand that is not cast");
  if (spec.scaling == Scaling::kAxiswise) {
    // One tile per row (reduction along dim 1: scales [rows, 1]) or per column ([1, cols]).
    const int64_t tile_rows = reduction_dim == 1 ? 1 : input.size(0);
    const int64_t tile_cols = reduction_dim == 1 ? input.size(1) : 1;
    auto [data, scales] = casts.cast_tiles(input, tile_rows, tile_cols, spec.format, power_of_2);
    return {data, scales};
  }
  const auto [tile_rows, tile_cols] = blockwise_tile(spec, reduction_dim);
  auto [data, scales] = casts.cast_tiles(input, tile_rows, tile_cols, spec.format, power_of_2);
  return {data, scales, tile_rows, tile_cols};
}

}  // namespace loom::quantize
