// Float8 casts fused into as few passes as the scaling allows (cast_math.h holds the arithmetic):
// per tensor, one pass for the amax and one for scale and cast; per row, column or block, one
// block per tile reads it for its amax, computes the scale and writes the cast in the same pass.
#include <cuda_fp8.h>

#include "../../models/kernels/cuda/device_common.cuh"
#include "cast_launch.h"

namespace loom::quantize::cuda_launch {
namespace {

using namespace cuda_math;
using models::kernels::cuda_math::block_reduce;
using models::kernels::cuda_math::row_threads;

struct MaxKeepNan {
  __device__ float operator()(float a, float b) const { return max_keep_nan(a, b); }
};

__device__ __forceinline__ uint8_t to_float8(float v, Float8Kind kind) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE,
                               kind == Float8Kind::kE4M3 ? __NV_E4M3 : __NV_E5M2);
}

// A non-negative float's bits order as the float does: atomicMax on them is the float max.
__device__ void atomic_max_nonnegative(float* address, float value) {
  if (value != value) {  // NaN wins, as in amax
    atomicExch(address, value);
    return;
  }
  atomicMax(reinterpret_cast<int*>(address), __float_as_int(value));
}

template <typename T>
__global__ void amax_kernel(const T* x, int64_t n, float* amax) {
  float acc = 0.f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc = max_keep_nan(acc, fabsf(Scalar<T>::load(x[i])));
  }
  const float block_max = block_reduce(acc, 0.f, MaxKeepNan{});
  if (threadIdx.x == 0) atomic_max_nonnegative(amax, block_max);
}

template <typename T>
__global__ void cast_tensorwise_kernel(const T* x, int64_t n, const float* amax, Float8Kind kind,
                                       bool power_of_2, uint8_t* data, float* scale_out) {
  const float scale = scale_from_amax(*amax, kind, power_of_2);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_out = scale;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    data[i] = to_float8(scaled_clamped(Scalar<T>::load(x[i]), scale, kind), kind);
  }
}

template <typename T>
__global__ void __launch_bounds__(kSquare* kSquareRows)
    cast_tensorwise_transposed_kernel(const T* x, int64_t rows, int64_t cols, const float* amax,
                                      Float8Kind kind, bool power_of_2, uint8_t* data,
                                      uint8_t* transposed, float* scale_out) {
  __shared__ uint8_t square[kSquare][kSquare + 1];  // +1: no bank conflicts down a column
  const float scale = scale_from_amax(*amax, kind, power_of_2);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) {
    *scale_out = scale;
  }
  const int tx = threadIdx.x, ty = threadIdx.y;
  square_cast(
      x, rows, cols, blockIdx.y, blockIdx.x, scale, kind, tx, ty,
      [&](int64_t at, float v) { data[at] = to_float8(v, kind); },
      [&](int r, int c, float v) { square[r][c] = to_float8(v, kind); });
  __syncthreads();
  square_write_transposed(rows, cols, blockIdx.y, blockIdx.x, tx, ty,
                          [&](int64_t at, int r, int c) { transposed[at] = square[r][c]; });
}

template <typename T>
__global__ void __launch_bounds__(1024)
    cast_tiles_kernel(const T* x, int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols,
                      int64_t tiles_across, Float8Kind kind, bool power_of_2, uint8_t* data,
                      float* scales) {
  const int64_t index = blockIdx.x;
  const Tile tile =
      tile_at(index / tiles_across, index % tiles_across, rows, cols, tile_rows, tile_cols);
  const float partial = tile_amax_partial(x, cols, tile, threadIdx.x, blockDim.x);
  const float scale = scale_from_amax(block_reduce(partial, 0.f, MaxKeepNan{}), kind, power_of_2);
  if (threadIdx.x == 0) scales[index] = scale;
  tile_cast(x, cols, tile, scale, kind, threadIdx.x, blockDim.x,
            [&](int64_t at, float v) { data[at] = to_float8(v, kind); });
}

}  // namespace

void float8_amax(Dtype dtype, const void* x, int64_t n, float* amax, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  const unsigned blocks = models::kernels::cuda_launch::blocks_for(n, kThreads * 8);
  if (dtype == Dtype::kFloat32) {
    amax_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(x), n, amax);
  } else {
    amax_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), n, amax);
  }
  models::kernels::cuda_launch::check_launch("float8_amax");
}

void float8_cast_tensorwise(Dtype dtype, const void* x, int64_t n, const float* amax,
                            Float8Kind kind, bool power_of_2, void* data, float* scale_out,
                            cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  const unsigned blocks = models::kernels::cuda_launch::blocks_for(n, kThreads);
  auto* out = static_cast<uint8_t*>(data);
  if (dtype == Dtype::kFloat32) {
    cast_tensorwise_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(x), n, amax,
                                                            kind, power_of_2, out, scale_out);
  } else {
    cast_tensorwise_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), n,
                                                            amax, kind, power_of_2, out, scale_out);
  }
  models::kernels::cuda_launch::check_launch("float8_cast_tensorwise");
}

void float8_cast_tensorwise_transposed(Dtype dtype, const void* x, int64_t rows, int64_t cols,
                                       const float* amax, Float8Kind kind, bool power_of_2,
                                       void* data, void* transposed, float* scale_out,
                                       cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>((cols + kSquare - 1) / kSquare),
                  static_cast<unsigned>((rows + kSquare - 1) / kSquare));
  const dim3 threads(kSquare, kSquareRows);
  auto* out = static_cast<uint8_t*>(data);
  auto* out_t = static_cast<uint8_t*>(transposed);
  if (dtype == Dtype::kFloat32) {
    cast_tensorwise_transposed_kernel<<<grid, threads, 0, stream>>>(
        static_cast<const float*>(x), rows, cols, amax, kind, power_of_2, out, out_t, scale_out);
  } else {
    cast_tensorwise_transposed_kernel<<<grid, threads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), rows, cols, amax, kind, power_of_2, out, out_t,
        scale_out);
  }
  models::kernels::cuda_launch::check_launch("float8_cast_tensorwise_transposed");
}

void float8_cast_tiles(Dtype dtype, const void* x, int64_t rows, int64_t cols, int64_t tile_rows,
                       int64_t tile_cols, Float8Kind kind, bool power_of_2, void* data,
                       float* scales, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t tiles_down = (rows + tile_rows - 1) / tile_rows;
  const int64_t tiles_across = (cols + tile_cols - 1) / tile_cols;
  const int threads = row_threads(tile_rows * tile_cols);
  auto* out = static_cast<uint8_t*>(data);
  if (dtype == Dtype::kFloat32) {
    cast_tiles_kernel<<<tiles_down * tiles_across, threads, 0, stream>>>(
        static_cast<const float*>(x), rows, cols, tile_rows, tile_cols, tiles_across, kind,
        power_of_2, out, scales);
  } else {
    cast_tiles_kernel<<<tiles_down * tiles_across, threads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), rows, cols, tile_rows, tile_cols, tiles_across, kind,
        power_of_2, out, scales);
  }
  models::kernels::cuda_launch::check_launch("float8_cast_tiles");
}

}  // namespace loom::quantize::cuda_launch
