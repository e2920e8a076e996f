// SwiGLU and RoPE, forward and backward: one thread per element (SwiGLU) or per rotated pair
// (RoPE), grid-stride (kernel_math.h holds the arithmetic).
#include "device_common.cuh"

namespace loom::models::kernels::cuda_launch {
namespace {

using namespace cuda_math;

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

template <typename T>
__global__ void swiglu_forward_kernel(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) swiglu_element(a, b, out, i);
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* grad, const T* a, const T* b, T* grad_a, T* grad_b,
                                       int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    swiglu_element_backward(grad, a, b, grad_a, grad_b, i);
  }
}

// q's pairs, then k's, in one launch.
template <typename T>
__global__ void rotary_kernel(const T* q, const T* k, const float* rotation, T* q_out, T* k_out,
                              int64_t q_pairs, int64_t k_pairs, int64_t seq, int64_t q_heads,
                              int64_t k_heads, int64_t head_dim, bool halves_in, bool halves_out,
                              float sign) {
  for (int64_t p = first_index(); p < q_pairs + k_pairs; p += grid_stride()) {
    if (p < q_pairs) {
      rope_pair_rotate(q, rotation, q_out, p, seq, q_heads, head_dim, halves_in, halves_out, sign);
    } else {
      rope_pair_rotate(k, rotation, k_out, p - q_pairs, seq, k_heads, head_dim, halves_in,
                       halves_out, sign);
    }
  }
}

}  // namespace

void swiglu_forward(Dtype dtype, const void* a, const void* b, void* out, int64_t n,
                    cudaStream_t stream) {
  LOOM_CUDA_DISPATCH(dtype, [&] {
    swiglu_forward_kernel<scalar_t>
        <<<blocks_for(n, kPointwiseThreads), kPointwiseThreads, 0, stream>>>(
            static_cast<const scalar_t*>(a), static_cast<const scalar_t*>(b),
            static_cast<scalar_t*>(out), n);
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(Dtype dtype, const void* grad, const void* a, const void* b, void* grad_a,
                     void* grad_b, int64_t n, cudaStream_t stream) {
  LOOM_CUDA_DISPATCH(dtype, [&] {
    swiglu_backward_kernel<scalar_t>
        <<<blocks_for(n, kPointwiseThreads), kPointwiseThreads, 0, stream>>>(
            static_cast<const scalar_t*>(grad), static_cast<const scalar_t*>(a),
            static_cast<const scalar_t*>(b), static_cast<scalar_t*>(grad_a),
            static_cast<scalar_t*>(grad_b), n);
  });
  check_launch("swiglu_backward");
}

void rotary(Dtype dtype, const void* q, const void* k, const float* rotation, void* q_out,
            void* k_out, int64_t bs, int64_t seq, int64_t q_heads, int64_t k_heads,
            int64_t head_dim, bool halves_in, bool halves_out, float sign, cudaStream_t stream) {
  const int64_t q_pairs = bs * seq * q_heads * (head_dim / 2);
  const int64_t k_pairs = bs * seq * k_heads * (head_dim / 2);
  LOOM_CUDA_DISPATCH(dtype, [&] {
    rotary_kernel<scalar_t>
        <<<blocks_for(q_pairs + k_pairs, kPointwiseThreads), kPointwiseThreads, 0, stream>>>(
            static_cast<const scalar_t*>(q), static_cast<const scalar_t*>(k), rotation,
            static_cast<scalar_t*>(q_out), static_cast<scalar_t*>(k_out), q_pairs, k_pairs, seq,
            q_heads, k_heads, head_dim, halves_in, halves_out, sign);
  });
  check_launch("rotary");
}

cudaError_t kernel_image_status() {
  cudaFuncAttributes attributes;
  const cudaError_t status = cudaFuncGetAttributes(&attributes, swiglu_forward_kernel<float>);
  (void)cudaGetLastError();  // not sticky: the next launch's check must not see it
  return status;
}

}  // namespace loom::models::kernels::cuda_launch
