// loom's CUDA kernels replayed on the CPU: each function runs its kernel's blocks and threads one
// after another, through the same phase functions (kernel_math.h), launch shapes and reduction
// trees (device_common.cuh's block_reduce) as the .cu files, on host memory. The default suite
// tests these replays against ATen (tests/unit/test_cuda_kernel_math.cpp), so the kernels' math
// is checked on machines without a GPU; the `cuda` tests check the kernels themselves.
//
// T is float or any type with a Scalar<T> specialization in scope (the tests add c10::BFloat16).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernel_math.h"

namespace loom::models::kernels::cuda_replay {

using namespace cuda_math;

// block_reduce of device_common.cuh: a butterfly in each warp (lane 0's value is the warp's),
// then one butterfly over the warps' results, lanes past the last warp holding `identity`.
template <typename V, typename Op>
V block_reduce(const std::vector<V>& values, V identity, Op op) {
  auto butterfly = [&](std::vector<V> lanes) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      std::vector<V> next(lanes);
      for (int lane = 0; lane < kWarp; ++lane) next[lane] = op(lanes[lane], lanes[lane ^ offset]);
      lanes = std::move(next);
    }
    return lanes[0];
  };
  const int warps = static_cast<int>(values.size()) / kWarp;
  std::vector<V> warp_results(kWarp, identity);
  for (int w = 0; w < warps; ++w) {
    warp_results[w] =
        butterfly(std::vector<V>(values.begin() + w * kWarp, values.begin() + (w + 1) * kWarp));
  }
  return butterfly(warp_results);
}

inline float add_float(float a, float b) {
  return a + b;
}
inline double add_double(double a, double b) {
  return a + b;
}

// rms_norm_forward_kernel over `rows` rows.
template <typename T, typename W>
void rms_norm_forward(const T* x, const T* delta, const W* weight, T* sum, T* y, float* rstd,
                      int64_t rows, int64_t dim, float eps) {
  const int threads = row_threads(dim);
  std::vector<float> partials(threads);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t offset = row * dim;
    T* row_sum = delta != nullptr ? sum + offset : nullptr;
    for (int t = 0; t < threads; ++t) {
      partials[t] = rms_partial(x + offset, delta != nullptr ? delta + offset : nullptr, row_sum,
                                dim, t, threads);
    }
    const float r = rms_rstd(block_reduce(partials, 0.f, add_float), dim, eps);
    rstd[row] = r;
    for (int t = 0; t < threads; ++t) {
      rms_write(row_sum != nullptr ? row_sum : x + offset, weight, y + offset, r, dim, t, threads);
    }
  }
}

// rms_norm_backward_kernel, then the weight gradient's chunks (rms_grad_weight_kernel) added in
// chunk order (sum_chunks_kernel). grad_s and grad_weight may be null.
template <typename T, typename W>
void rms_norm_backward(const T* grad, const T* s, const W* weight, const float* rstd,
                       const T* grad_residual, T* grad_s, float* grad_weight, int64_t rows,
                       int64_t dim) {
  const int threads = row_threads(dim);
  std::vector<float> partials(threads);
  for (int64_t row = 0; grad_s != nullptr && row < rows; ++row) {
    const int64_t offset = row * dim;
    for (int t = 0; t < threads; ++t) {
      partials[t] = rms_backward_partial(grad + offset, s + offset, weight, dim, t, threads);
    }
    const float dot = block_reduce(partials, 0.f, add_float);
    for (int t = 0; t < threads; ++t) {
      rms_backward_write(grad + offset, s + offset, weight, rstd[row], dot,
                         grad_residual != nullptr ? grad_residual + offset : nullptr,
                         grad_s + offset, dim, t, threads);
    }
  }
  if (grad_weight == nullptr) return;
  const int64_t chunks = (rows + kGradWeightRows - 1) / kGradWeightRows;
  for (int64_t col = 0; col < dim; ++col) {
    float acc = 0.f;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t first = c * kGradWeightRows;
      const int64_t last = first + kGradWeightRows < rows ? first + kGradWeightRows : rows;
      acc += rms_grad_weight_partial(grad, s, rstd, first, last, dim, col);
    }
    grad_weight[col] = acc;
  }
}

template <typename T>
void swiglu_forward(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) swiglu_element(a, b, out, i);
}

template <typename T>
void swiglu_backward(const T* grad, const T* a, const T* b, T* grad_a, T* grad_b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) swiglu_element_backward(grad, a, b, grad_a, grad_b, i);
}

// rotary_kernel on one tensor [bs, seq, heads, head_dim].
template <typename T>
void rotary(const T* x, const float* rotation, T* out, int64_t bs, int64_t seq, int64_t heads,
            int64_t head_dim, bool halves_in, bool halves_out, float sign) {
  const int64_t pairs = bs * seq * heads * (head_dim / 2);
  for (int64_t p = 0; p < pairs; ++p) {
    rope_pair_rotate(x, rotation, out, p, seq, heads, head_dim, halves_in, halves_out, sign);
  }
}

// cross_entropy_forward_kernel: each row's loss (0 when ignored, NaN for a label out of range)
// and logsumexp.
template <typename T>
void cross_entropy_forward(const T* logits, const int64_t* labels, int64_t rows, int64_t vocab,
                           int64_t ignore_index, float* row_loss, float* lse) {
  const int threads = row_threads(vocab);
  std::vector<MaxSum> partials(threads);
  for (int64_t row = 0; row < rows; ++row) {
    const T* x = logits + row * vocab;
    for (int t = 0; t < threads; ++t) partials[t] = cross_entropy_partial(x, vocab, t, threads);
    lse[row] = logsumexp_of(block_reduce(partials, max_sum_empty(), max_sum_merge));
    row_loss[row] = cross_entropy_row_loss(x, labels[row], vocab, ignore_index, lse[row]);
  }
}

template <typename T>
void cross_entropy_backward(const T* logits, const int64_t* labels, const float* lse, float scale,
                            int64_t rows, int64_t vocab, int64_t ignore_index, T* grad) {
  for (int64_t row = 0; row < rows; ++row) {
    const bool ignored = labels[row] == ignore_index;
    for (int64_t i = 0; i < vocab; ++i) {
      const int64_t at = row * vocab + i;
      grad[at] = Scalar<T>::store(ignored ? 0.f
                                          : cross_entropy_grad(Scalar<T>::load(logits[at]),
                                                               lse[row], i == labels[row], scale));
    }
  }
}

// squared_norm_kernel's blocks (kSquaredNormBlocksPerTensor per tensor, kPointwiseThreads
// threads, grid-stride) and sum_partials_kernel's one block over their results.
template <typename T>
double squared_norm(const std::vector<const T*>& tensors, const std::vector<int64_t>& numel) {
  const int blocks_per_tensor = kSquaredNormBlocksPerTensor;
  std::vector<double> partials;
  std::vector<double> lanes(kPointwiseThreads);
  const int64_t stride = static_cast<int64_t>(blocks_per_tensor) * kPointwiseThreads;
  for (size_t k = 0; k < tensors.size(); ++k) {
    for (int b = 0; b < blocks_per_tensor; ++b) {
      for (int t = 0; t < kPointwiseThreads; ++t) {
        double acc = 0.0;
        for (int64_t i = static_cast<int64_t>(b) * kPointwiseThreads + t; i < numel[k];
             i += stride) {
          acc += square_of(Scalar<T>::load(tensors[k][i]));
        }
        lanes[t] = acc;
      }
      partials.push_back(block_reduce(lanes, 0.0, add_double));
    }
  }
  for (int t = 0; t < kPointwiseThreads; ++t) {
    double acc = 0.0;
    for (size_t i = t; i < partials.size(); i += kPointwiseThreads) acc += partials[i];
    lanes[t] = acc;
  }
  return block_reduce(lanes, 0.0, add_double);
}

// clip_kernel on one tensor.
template <typename T>
void clip(T* data, int64_t n, double squared_total, double max_norm) {
  const float coef = clip_coefficient(squared_total, max_norm);
  if (coef == 1.f) return;
  for (int64_t i = 0; i < n; ++i) data[i] = Scalar<T>::store(Scalar<T>::load(data[i]) * coef);
}

}  // namespace loom::models::kernels::cuda_replay
