// The tensor side of loom's fused float8 cast kernels, built into bin/libloom_cuda.so: outputs,
// shapes and the stream for the launches of cast_launch.h. Exports `loom_cuda_float8_casts`,
// which quantize finds in the loaded library (src/quantize/float8_cuda.cpp).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <stdexcept>
#include <string>

#include "../../models/kernels/cuda/tensor_launch.h"
#include "cast_launch.h"
#include "loom/quantize/float8_cuda.h"

namespace loom::quantize {
namespace {

namespace launch = cuda_launch;

launch::Dtype dtype_of(const at::Tensor& t) {
  return models::kernels::cuda_launch::dtype_of(t, "loom float8 casts");
}

cuda_math::Float8Kind kind_of(Float8Format format) {
  return format == Float8Format::kE4M3 ? cuda_math::Float8Kind::kE4M3
                                       : cuda_math::Float8Kind::kE5M2;
}

at::ScalarType float8_type(Float8Format format) {
  return format == Float8Format::kE4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

using models::kernels::cuda_launch::stream_of;

class Float8CudaCastsLibrary final : public Float8CudaCasts {
 public:
  at::Tensor amax(const at::Tensor& x) const override {
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor out = at::zeros({}, x.options().dtype(at::kFloat));
    launch::float8_amax(dtype_of(x), x.const_data_ptr(), x.numel(), out.mutable_data_ptr<float>(),
                        stream_of(x));
    return out;
  }

  Float8Tensor cast_tensorwise(const at::Tensor& x, const at::Tensor& amax, Float8Format format,
                               bool power_of_2) const override {
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor data = at::empty(x.sizes(), x.options().dtype(float8_type(format)));
    at::Tensor scale = at::empty({}, x.options().dtype(at::kFloat));
    const at::Tensor a = amax.to(at::kFloat).contiguous();
    launch::float8_cast_tensorwise(dtype_of(x), x.const_data_ptr(), x.numel(),
                                   a.const_data_ptr<float>(), kind_of(format), power_of_2,
                                   data.data_ptr(), scale.mutable_data_ptr<float>(), stream_of(x));
    return {data, scale};
  }

  Float8Tensor cast_tensorwise_transposed(const at::Tensor& x, const at::Tensor& amax,
                                          Float8Format format, bool power_of_2) const override {
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t rows = x.size(0), cols = x.size(1);
    if ((rows + 31) / 32 > 65535) {
      // Row squares beyond a grid's y dimension (over 2M rows): the plain cast, and the GEMM
      // that wants the transpose reads it strided (Float8Tensor::t()) as on the unfused path.
      return cast_tensorwise(x, amax, format, power_of_2);
    }
    at::Tensor data = at::empty(x.sizes(), x.options().dtype(float8_type(format)));
    at::Tensor transposed = at::empty({cols, rows}, x.options().dtype(float8_type(format)));
    at::Tensor scale = at::empty({}, x.options().dtype(at::kFloat));
    const at::Tensor a = amax.to(at::kFloat).contiguous();
    launch::float8_cast_tensorwise_transposed(dtype_of(x), x.const_data_ptr(), rows, cols,
                                              a.const_data_ptr<float>(), kind_of(format),
                                              power_of_2, data.data_ptr(), transposed.data_ptr(),
                                              scale.mutable_data_ptr<float>(), stream_of(x));
    Float8Tensor out{data, scale};
    out.transposed = transposed;
    return out;
  }

  std::pair<at::Tensor, at::Tensor> cast_tiles(const at::Tensor& x, int64_t tile_rows,
                                               int64_t tile_cols, Float8Format format,
                                               bool power_of_2) const override {
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t rows = x.size(0), cols = x.size(1);
    const int64_t down = (rows + tile_rows - 1) / tile_rows;
    const int64_t across = (cols + tile_cols - 1) / tile_cols;
    if (down * across > 0x7fffffff) {
      throw std::invalid_argument("loom float8 casts: more tiles than one launch's blocks");
    }
    at::Tensor data = at::empty(x.sizes(), x.options().dtype(float8_type(format)));
    at::Tensor scales = at::empty({down, across}, x.options().dtype(at::kFloat));
    launch::float8_cast_tiles(dtype_of(x), x.const_data_ptr(), rows, cols, tile_rows, tile_cols,
                              kind_of(format), power_of_2, data.data_ptr(),
                              scales.mutable_data_ptr<float>(), stream_of(x));
    return {data, scales};
  }
};

}  // namespace
}  // namespace loom::quantize

extern "C" __attribute__((visibility("default"))) const loom::quantize::Float8CudaCasts*
loom_cuda_float8_casts() {
  static const loom::quantize::Float8CudaCastsLibrary casts;
  return &casts;
}
