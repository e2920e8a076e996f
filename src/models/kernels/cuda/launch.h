// Host entry points of loom's CUDA kernels (the .cu files beside this one). Plain pointers and
// sizes only, so nvcc compiles the kernels without LibTorch's headers (seconds, not minutes);
// cuda_kernels_library.cpp turns tensors into these calls. Every launch is asynchronous on
// `stream` and checks its launch (cudaGetLastError) by throwing std::runtime_error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernel_math.h"

namespace loom::models::kernels::cuda_launch {

enum class Dtype { kFloat32, kBFloat16 };

// RMSNorm of `rows` rows of `dim`, one block a row. `delta` (may be null): the rows are x + delta,
// stored into `sum`. `rstd` receives one float per row.
void rms_norm_forward(Dtype dtype, Dtype weight_dtype, const void* x, const void* delta,
                      const void* weight, void* sum, void* y, float* rstd, int64_t rows,
                      int64_t dim, float eps, cudaStream_t stream);

// grad_s (may be null: not wanted) = the norm's input gradient plus `grad_residual` (may be
// null); grad_weight (may be null) = the weight's gradient in float, through `partials`
// (ceil(rows / kGradWeightRows) x dim floats of scratch).
void rms_norm_backward(Dtype dtype, Dtype weight_dtype, const void* grad, const void* s,
                       const void* weight, const float* rstd, const void* grad_residual,
                       void* grad_s, float* partials, float* grad_weight, int64_t rows, int64_t dim,
                       cudaStream_t stream);

void swiglu_forward(Dtype dtype, const void* a, const void* b, void* out, int64_t n,
                    cudaStream_t stream);
void swiglu_backward(Dtype dtype, const void* grad, const void* a, const void* b, void* grad_a,
                     void* grad_b, int64_t n, cudaStream_t stream);

// q [bs, seq, q_heads, head_dim] and k [bs, seq, k_heads, head_dim] rotated into q_out, k_out by
// `rotation` [seq, head_dim] floats (cos, sin of each pair); sign -1 rotates back. Each pair is
// read from the rotate-half layout where halves_in, else the interleaved one, and written in the
// layout halves_out says.
void rotary(Dtype dtype, const void* q, const void* k, const float* rotation, void* q_out,
            void* k_out, int64_t bs, int64_t seq, int64_t q_heads, int64_t k_heads,
            int64_t head_dim, bool halves_in, bool halves_out, float sign, cudaStream_t stream);

// Per row: row_loss (0 where the label is the ignore index) and its logsumexp.
void cross_entropy_forward(Dtype dtype, const void* logits, const int64_t* labels, int64_t rows,
                           int64_t vocab, int64_t ignore_index, float* row_loss, float* lse,
                           cudaStream_t stream);
// grad = *grad_scale (softmax - onehot), 0 on ignored rows; `grad` may be `logits` itself.
void cross_entropy_backward(Dtype dtype, const void* logits, const int64_t* labels,
                            const float* lse, const float* grad_scale, int64_t rows, int64_t vocab,
                            int64_t ignore_index, void* grad, cudaStream_t stream);

// Whether the current device can run this library's kernels: cudaSuccess, or the error asking
// for a kernel's attributes gives (cudaErrorNoKernelImageForDevice: no image for its
// architecture among those this build compiled, LOOM_CUDA_ARCHITECTURES). Every .cu file of the
// library is compiled for the same architectures, so one kernel answers for all.
cudaError_t kernel_image_status();

// Up to kMaxTensorsPerLaunch tensors of one dtype per launch.
constexpr int kMaxTensorsPerLaunch = 32;
using cuda_math::kSquaredNormBlocksPerTensor;

struct TensorList {
  void* data[kMaxTensorsPerLaunch];
  int64_t numel[kMaxTensorsPerLaunch];
  int count = 0;
};

// partials[i * kSquaredNormBlocksPerTensor + b] = block b's float64 sum of squares of tensor i.
void squared_norm_partials(Dtype dtype, const TensorList& tensors, double* partials,
                           cudaStream_t stream);
// *total = the sum of partials[0, count), in order.
void sum_partials(const double* partials, int64_t count, double* total, cudaStream_t stream);
// Every tensor scaled in place by clip_coefficient(*squared_total, max_norm), read on the device.
void clip_by_total(Dtype dtype, const TensorList& tensors, const double* squared_total,
                   double max_norm, cudaStream_t stream);

}  // namespace loom::models::kernels::cuda_launch
