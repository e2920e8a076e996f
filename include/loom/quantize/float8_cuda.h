// loom's fused float8 cast kernels on CUDA (src/quantize/cuda): per tensor, an amax pass and one
// pass that computes the scale on the device and casts; per row, column or blockwise tile, one
// pass that reads each tile for its amax, scales and casts it (ATen's path takes five or six
// passes and a host-visible scale). Built into bin/libloom_cuda.so beside the models' kernels
// and taken by float8's casts where loom's CUDA kernels are on (`training.cuda_kernels`,
// models/kernels/cuda.h). Their results equal quantize()'s bit for bit: the arithmetic is shared
// with a CPU replay (src/quantize/cuda/cast_replay.h) that the default suite compares with
// quantize(), and the cuda tests compare the kernels themselves.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

#include "loom/quantize/float8.h"

namespace loom::distributed {
class Comm;
}

namespace loom::quantize {

class Float8CudaCasts {
 public:
  virtual ~Float8CudaCasts() = default;
  // max |x| of a contiguous float32 or bfloat16 CUDA tensor, as a float32 [] on its device.
  virtual at::Tensor amax(const at::Tensor& x) const = 0;
  // saturate(x * scale) in `format`, scale from `amax` (float32 [], read on the device).
  virtual Float8Tensor cast_tensorwise(const at::Tensor& x, const at::Tensor& amax,
                                       Float8Format format, bool power_of_2) const = 0;
  // cast_tensorwise of a contiguous 2-D x that also returns the row-major transposed copy
  // (Float8Tensor::transposed) from the same pass: what the weight gradient's GEMM reads.
  virtual Float8Tensor cast_tensorwise_transposed(const at::Tensor& x, const at::Tensor& amax,
                                                  Float8Format format, bool power_of_2) const = 0;
  // (data, scales [ceil(rows / tile_rows), ceil(cols / tile_cols)]) of a contiguous 2-D x cast
  // per tile of tile_rows x tile_cols.
  virtual std::pair<at::Tensor, at::Tensor> cast_tiles(const at::Tensor& x, int64_t tile_rows,
                                                       int64_t tile_cols, Float8Format format,
                                                       bool power_of_2) const = 0;
};

// The kernels when loom's CUDA kernels are on and the library has them, else null.
const Float8CudaCasts* float8_cuda_casts();

// The cast of a 2-D x (quantize()'s contract) through the kernels: the amax of a tensorwise
// cast is max-reduced over `amax_group` between the two passes (null: none). `with_transposed`:
// a tensorwise cast also writes its transposed copy in its second pass (other scalings ignore
// it: their transposed use is another cast).
Float8Tensor fused_quantize(const Float8CudaCasts& casts, const at::Tensor& x, const CastSpec& spec,
                            int64_t reduction_dim, bool power_of_2, distributed::Comm* amax_group,
                            bool with_transposed = false);

}  // namespace loom::quantize
