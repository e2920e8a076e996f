// RMSNorm, with the residual add fused, forward and backward (kernel_math.h holds the arithmetic).
#include "device_common.cuh"

namespace loom::models::kernels::cuda_launch {
namespace {

using namespace cuda_math;

// One block a row: the sum of squares reduced over the block, then each thread writes its share.
template <typename T, typename W>
__global__ void __launch_bounds__(1024)
    rms_norm_forward_kernel(const T* x, const T* delta, const W* weight, T* sum, T* y, float* rstd,
                            int64_t dim, float eps) {
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * dim;
  const T* row = x + offset;
  const T* row_delta = delta != nullptr ? delta + offset : nullptr;
  T* row_sum = delta != nullptr ? sum + offset : nullptr;
  const float partial = rms_partial(row, row_delta, row_sum, dim, threadIdx.x, blockDim.x);
  const float r = rms_rstd(block_reduce(partial, 0.f, AddFloat{}), dim, eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  // Each thread reads back only the elements of the sum it wrote itself.
  rms_write(row_sum != nullptr ? row_sum : row, weight, y + offset, r, dim, threadIdx.x,
            blockDim.x);
}

template <typename T, typename W>
__global__ void __launch_bounds__(1024)
    rms_norm_backward_kernel(const T* grad, const T* s, const W* weight, const float* rstd,
                             const T* grad_residual, T* grad_s, int64_t dim) {
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * dim;
  const float partial =
      rms_backward_partial(grad + offset, s + offset, weight, dim, threadIdx.x, blockDim.x);
  const float dot = block_reduce(partial, 0.f, AddFloat{});
  rms_backward_write(grad + offset, s + offset, weight, rstd[blockIdx.x], dot,
                     grad_residual != nullptr ? grad_residual + offset : nullptr, grad_s + offset,
                     dim, threadIdx.x, blockDim.x);
}

// partials[chunk, col]: column col's weight gradient over the chunk's kGradWeightRows rows.
template <typename T>
__global__ void rms_grad_weight_kernel(const T* grad, const T* s, const float* rstd,
                                       float* partials, int64_t rows, int64_t dim) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= dim) return;
  const int64_t chunks = (rows + kGradWeightRows - 1) / kGradWeightRows;
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t first = chunk * kGradWeightRows;
    const int64_t last = first + kGradWeightRows < rows ? first + kGradWeightRows : rows;
    partials[chunk * dim + col] = rms_grad_weight_partial(grad, s, rstd, first, last, dim, col);
  }
}

// The chunks' partial sums added in chunk order.
__global__ void sum_chunks_kernel(const float* partials, int64_t chunks, int64_t dim, float* out) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= dim) return;
  float acc = 0.f;
  for (int64_t c = 0; c < chunks; ++c) acc += partials[c * dim + col];
  out[col] = acc;
}

}  // namespace

void rms_norm_forward(Dtype dtype, Dtype weight_dtype, const void* x, const void* delta,
                      const void* weight, void* sum, void* y, float* rstd, int64_t rows,
                      int64_t dim, float eps, cudaStream_t stream) {
  const int threads = row_threads(dim);
  LOOM_CUDA_DISPATCH(dtype, [&] {
    using T = scalar_t;
    LOOM_CUDA_DISPATCH(weight_dtype, [&] {
      rms_norm_forward_kernel<T, scalar_t>
          <<<rows, threads, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(delta),
                                         static_cast<const scalar_t*>(weight), static_cast<T*>(sum),
                                         static_cast<T*>(y), rstd, dim, eps);
    });
  });
  check_launch("rms_norm_forward");
}

void rms_norm_backward(Dtype dtype, Dtype weight_dtype, const void* grad, const void* s,
                       const void* weight, const float* rstd, const void* grad_residual,
                       void* grad_s, float* partials, float* grad_weight, int64_t rows, int64_t dim,
                       cudaStream_t stream) {
  LOOM_CUDA_DISPATCH(dtype, [&] {
    using T = scalar_t;
    if (grad_s != nullptr) {
      LOOM_CUDA_DISPATCH(weight_dtype, [&] {
        rms_norm_backward_kernel<T, scalar_t><<<rows, row_threads(dim), 0, stream>>>(
            static_cast<const T*>(grad), static_cast<const T*>(s),
            static_cast<const scalar_t*>(weight), rstd, static_cast<const T*>(grad_residual),
            static_cast<T*>(grad_s), dim);
      });
      check_launch("rms_norm_backward");
    }
    if (grad_weight != nullptr) {
      const int64_t chunks = (rows + kGradWeightRows - 1) / kGradWeightRows;
      const dim3 grid(blocks_for(dim, kPointwiseThreads),
                      static_cast<unsigned>(chunks < 65535 ? chunks : 65535));
      rms_grad_weight_kernel<T><<<grid, kPointwiseThreads, 0, stream>>>(
          static_cast<const T*>(grad), static_cast<const T*>(s), rstd, partials, rows, dim);
      check_launch("rms_norm_grad_weight");
      sum_chunks_kernel<<<blocks_for(dim, kPointwiseThreads), kPointwiseThreads, 0, stream>>>(
          partials, chunks, dim, grad_weight);
      check_launch("rms_norm_grad_weight_sum");
    }
  });
}

}  // namespace loom::models::kernels::cuda_launch
