// What every .cu file of loom's kernels shares: bfloat16 loads and stores, the block reduction
// (whose order replay.h reproduces on the CPU), the dtype switch and the launch check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernel_math.h"
#include "launch.h"

namespace loom::models::kernels::cuda_math {

template <>
struct Scalar<__nv_bfloat16> {
  static LOOM_HD float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static LOOM_HD __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

__device__ __forceinline__ float shuffle_xor(float v, int offset) {
  return __shfl_xor_sync(0xffffffffu, v, offset);
}
__device__ __forceinline__ double shuffle_xor(double v, int offset) {
  return __shfl_xor_sync(0xffffffffu, v, offset);
}
__device__ __forceinline__ MaxSum shuffle_xor(MaxSum v, int offset) {
  return {shuffle_xor(v.max, offset), shuffle_xor(v.sum, offset)};
}

// Butterfly over a warp: after it every lane holds op over the 32 lanes (op is commutative).
template <typename V, typename Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = op(v, shuffle_xor(v, offset));
  return v;
}

// op over the block's values (blockDim.x a multiple of 32, at most 1024): each warp's butterfly,
// then the first warp's butterfly over the warps' results (lanes past the warps hold
// `identity`). Every thread gets the result.
template <typename V, typename Op>
__device__ V block_reduce(V v, V identity, Op op) {
  __shared__ V warp_results[kWarp];
  __shared__ V result;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_reduce(v, op);
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  if (warp == 0) {
    V w = lane < static_cast<int>(blockDim.x / kWarp) ? warp_results[lane] : identity;
    w = warp_reduce(w, op);
    if (lane == 0) result = w;
  }
  __syncthreads();
  return result;
}

struct AddFloat {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct AddDouble {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct MergeMaxSum {
  __device__ MaxSum operator()(MaxSum a, MaxSum b) const { return max_sum_merge(a, b); }
};

}  // namespace loom::models::kernels::cuda_math

namespace loom::models::kernels::cuda_launch {

inline void check_launch(const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("loom CUDA kernel ") + kernel +
                             " failed to launch: " + cudaGetErrorString(error));
  }
}

inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  // A grid-stride loop covers the rest; 2^20 blocks keep every SM busy on any GPU.
  return static_cast<unsigned>(blocks < (int64_t{1} << 20) ? blocks : (int64_t{1} << 20));
}

}  // namespace loom::models::kernels::cuda_launch

// Calls BODY with `scalar_t` bound to the C++ type of dtype D (float or __nv_bfloat16).
#define LOOM_CUDA_DISPATCH(D, ...)                                      \
  do {                                                                  \
    if ((D) == ::loom::models::kernels::cuda_launch::Dtype::kFloat32) { \
      using scalar_t = float;                                           \
      __VA_ARGS__();                                                    \
    } else {                                                            \
      using scalar_t = __nv_bfloat16;                                   \
      __VA_ARGS__();                                                    \
    }                                                                   \
  } while (0)
