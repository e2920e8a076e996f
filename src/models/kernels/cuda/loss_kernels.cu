// Cross-entropy fused with the log-softmax, forward and backward (kernel_math.h holds the
// arithmetic). One block per token's row of logits, read in the logits' own dtype: no float32
// copy of the logits is made, and the backward may write the gradient over the logits.
#include "device_common.cuh"

namespace loom::models::kernels::cuda_launch {
namespace {

using namespace cuda_math;

template <typename T>
__global__ void __launch_bounds__(1024)
    cross_entropy_forward_kernel(const T* logits, const int64_t* labels, int64_t vocab,
                                 int64_t ignore_index, float* row_loss, float* lse) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  const MaxSum partial = cross_entropy_partial(x, vocab, threadIdx.x, blockDim.x);
  const MaxSum total = block_reduce(partial, max_sum_empty(), MergeMaxSum{});
  if (threadIdx.x != 0) return;
  lse[row] = logsumexp_of(total);
  row_loss[row] = cross_entropy_row_loss(x, labels[row], vocab, ignore_index, lse[row]);
}

// One block per row again: each thread reads an element and writes its gradient in its place.
template <typename T>
__global__ void __launch_bounds__(1024)
    cross_entropy_backward_kernel(const T* logits, const int64_t* labels, const float* lse,
                                  const float* grad_scale, int64_t vocab, int64_t ignore_index,
                                  T* grad) {
  const int64_t row = blockIdx.x;
  const int64_t label = labels[row];
  const bool ignored = label == ignore_index;
  const float row_lse = lse[row];
  const float scale = *grad_scale;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const int64_t at = row * vocab + i;
    grad[at] = Scalar<T>::store(
        ignored ? 0.f
                : cross_entropy_grad(Scalar<T>::load(logits[at]), row_lse, i == label, scale));
  }
}

}  // namespace

void cross_entropy_forward(Dtype dtype, const void* logits, const int64_t* labels, int64_t rows,
                           int64_t vocab, int64_t ignore_index, float* row_loss, float* lse,
                           cudaStream_t stream) {
  LOOM_CUDA_DISPATCH(dtype, [&] {
    cross_entropy_forward_kernel<scalar_t><<<rows, row_threads(vocab), 0, stream>>>(
        static_cast<const scalar_t*>(logits), labels, vocab, ignore_index, row_loss, lse);
  });
  check_launch("cross_entropy_forward");
}

void cross_entropy_backward(Dtype dtype, const void* logits, const int64_t* labels,
                            const float* lse, const float* grad_scale, int64_t rows, int64_t vocab,
                            int64_t ignore_index, void* grad, cudaStream_t stream) {
  LOOM_CUDA_DISPATCH(dtype, [&] {
    cross_entropy_backward_kernel<scalar_t><<<rows, row_threads(vocab), 0, stream>>>(
        static_cast<const scalar_t*>(logits), labels, lse, grad_scale, vocab, ignore_index,
        static_cast<scalar_t*>(grad));
  });
  check_launch("cross_entropy_backward");
}

}  // namespace loom::models::kernels::cuda_launch
