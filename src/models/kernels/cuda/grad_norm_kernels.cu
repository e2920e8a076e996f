// The gradients' sum of squares in float64 and the clip, over lists of tensors: up to
// kMaxTensorsPerLaunch tensors a launch, passed by value as the kernel's argument. The sum is
// reduced in a fixed order (each block's tree, then the blocks in order), so it is the same on
// every run; the clip reads the total on the device, so no host waits for it.
#include "device_common.cuh"

namespace loom::models::kernels::cuda_launch {
namespace {

using namespace cuda_math;

// Block (b, i): tensor i's elements b, b + blocks, ... (in block-sized strides).
template <typename T>
__global__ void squared_norm_kernel(TensorList tensors, double* partials) {
  const int tensor = blockIdx.y;
  const T* data = static_cast<const T*>(tensors.data[tensor]);
  const int64_t n = tensors.numel[tensor];
  double acc = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc += square_of(Scalar<T>::load(data[i]));
  }
  const double total = block_reduce(acc, 0.0, AddDouble{});
  if (threadIdx.x == 0) partials[tensor * gridDim.x + blockIdx.x] = total;
}

__global__ void sum_partials_kernel(const double* partials, int64_t count, double* total) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  const double sum = block_reduce(acc, 0.0, AddDouble{});
  if (threadIdx.x == 0) *total = sum;
}

template <typename T>
__global__ void clip_kernel(TensorList tensors, const double* squared_total, double max_norm) {
  const float coef = clip_coefficient(*squared_total, max_norm);
  if (coef == 1.f) return;  // a scale by exactly 1 changes no bit
  const int tensor = blockIdx.y;
  T* data = static_cast<T*>(tensors.data[tensor]);
  const int64_t n = tensors.numel[tensor];
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    data[i] = Scalar<T>::store(Scalar<T>::load(data[i]) * coef);
  }
}

}  // namespace

void squared_norm_partials(Dtype dtype, const TensorList& tensors, double* partials,
                           cudaStream_t stream) {
  if (tensors.count == 0) return;
  const dim3 grid(kSquaredNormBlocksPerTensor, static_cast<unsigned>(tensors.count));
  LOOM_CUDA_DISPATCH(dtype, [&] {
    squared_norm_kernel<scalar_t><<<grid, kPointwiseThreads, 0, stream>>>(tensors, partials);
  });
  check_launch("squared_norm");
}

void sum_partials(const double* partials, int64_t count, double* total, cudaStream_t stream) {
  sum_partials_kernel<<<1, kPointwiseThreads, 0, stream>>>(partials, count, total);
  check_launch("squared_norm_sum");
}

void clip_by_total(Dtype dtype, const TensorList& tensors, const double* squared_total,
                   double max_norm, cudaStream_t stream) {
  if (tensors.count == 0) return;
  // Enough blocks per tensor to fill the GPU for the large ones; small ones exit early.
  const dim3 grid(256, static_cast<unsigned>(tensors.count));
  LOOM_CUDA_DISPATCH(dtype, [&] {
    clip_kernel<scalar_t><<<grid, kPointwiseThreads, 0, stream>>>(tensors, squared_total, max_norm);
  });
  check_launch("clip_by_total");
}

}  // namespace loom::models::kernels::cuda_launch
