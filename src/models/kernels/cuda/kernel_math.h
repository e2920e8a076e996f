// The arithmetic of loom's CUDA kernels, one function per phase of a thread's work, shared by the
// kernels (nvcc) and by replay.h, which runs each kernel's thread decomposition on the CPU (g++):
// the same strided loops, the same reduction trees, so the default CPU suite tests the kernels'
// math on machines without a GPU (tests/unit/test_cuda_kernel_math.cpp).
//
// Values are loaded into float, computed in float (float64 for the gradient norm) and rounded
// once when stored, through Scalar<T>: specialized for float here, for __nv_bfloat16 by the
// kernels and for c10::BFloat16 by the CPU replay (both round to nearest even).
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__ __forceinline__
#else
#define LOOM_HD inline
#endif

namespace loom::models::kernels::cuda_math {

constexpr int kWarp = 32;
// Rows a block of RMSNorm's weight-gradient kernel sums, per column, in row order; the blocks'
// partial sums are then added in block order, so the result depends on no launch detail.
constexpr int kGradWeightRows = 64;
// Threads per block of the elementwise kernels.
constexpr int kPointwiseThreads = 256;
// Blocks of the squared-norm kernel per tensor; their float64 sums are added in order after.
constexpr int kSquaredNormBlocksPerTensor = 32;

// Threads of the block that reduces one row of `length` (RMSNorm, cross-entropy: one block a
// row): a whole number of warps, more for the vocabulary's long rows.
LOOM_HD int row_threads(int64_t length) {
  if (length >= 16384) return 1024;
  if (length >= 256) return 256;
  return static_cast<int>((length + kWarp - 1) / kWarp) * kWarp;
}

template <typename T>
struct Scalar;

template <>
struct Scalar<float> {
  static LOOM_HD float load(float v) { return v; }
  static LOOM_HD float store(float v) { return v; }
};

// ---- RMSNorm: y = s * rstd * w, s = x (+ delta), rstd = 1 / sqrt(mean(s^2) + eps) ----

// Thread t of `threads` of a row's block: its share of the row's sum of squares. Where `delta`
// is given, s = x + delta is rounded to T and stored in `sum` first, and the rounded sum is what
// is normed (as the unfused add then norm would).
template <typename T>
LOOM_HD float rms_partial(const T* x, const T* delta, T* sum, int64_t dim, int t, int threads) {
  float acc = 0.f;
  for (int64_t i = t; i < dim; i += threads) {
    float v = Scalar<T>::load(x[i]);
    if (delta != nullptr) {
      const T rounded = Scalar<T>::store(v + Scalar<T>::load(delta[i]));
      sum[i] = rounded;
      v = Scalar<T>::load(rounded);
    }
    acc += v * v;
  }
  return acc;
}

LOOM_HD float rms_rstd(float sum_of_squares, int64_t dim, float eps) {
  return 1.f / sqrtf(sum_of_squares / static_cast<float>(dim) + eps);
}

template <typename T, typename W>
LOOM_HD void rms_write(const T* s, const W* weight, T* y, float rstd, int64_t dim, int t,
                       int threads) {
  for (int64_t i = t; i < dim; i += threads) {
    y[i] = Scalar<T>::store(Scalar<T>::load(s[i]) * rstd * Scalar<W>::load(weight[i]));
  }
}

// Backward, per row: dot = sum_i g_i w_i s_i over the thread's share ...
template <typename T, typename W>
LOOM_HD float rms_backward_partial(const T* grad, const T* s, const W* weight, int64_t dim, int t,
                                   int threads) {
  float acc = 0.f;
  for (int64_t i = t; i < dim; i += threads) {
    acc += Scalar<T>::load(grad[i]) * Scalar<W>::load(weight[i]) * Scalar<T>::load(s[i]);
  }
  return acc;
}

// ... then ds_i = rstd w_i g_i - s_i rstd^3 dot / dim, plus the gradient the sum received from
// its other use (the residual path) where given.
template <typename T, typename W>
LOOM_HD void rms_backward_write(const T* grad, const T* s, const W* weight, float rstd, float dot,
                                const T* grad_residual, T* grad_s, int64_t dim, int t,
                                int threads) {
  const float c = rstd * rstd * rstd * dot / static_cast<float>(dim);
  for (int64_t i = t; i < dim; i += threads) {
    float v =
        rstd * Scalar<W>::load(weight[i]) * Scalar<T>::load(grad[i]) - Scalar<T>::load(s[i]) * c;
    if (grad_residual != nullptr) v += Scalar<T>::load(grad_residual[i]);
    grad_s[i] = Scalar<T>::store(v);
  }
}

// The weight's gradient in column `col`, summed over rows [first, last) in row order.
template <typename T>
LOOM_HD float rms_grad_weight_partial(const T* grad, const T* s, const float* rstd, int64_t first,
                                      int64_t last, int64_t dim, int64_t col) {
  float acc = 0.f;
  for (int64_t r = first; r < last; ++r) {
    acc += Scalar<T>::load(grad[r * dim + col]) * Scalar<T>::load(s[r * dim + col]) * rstd[r];
  }
  return acc;
}

// ---- SwiGLU: silu(a) * b ----

LOOM_HD float sigmoid(float a) {
  return 1.f / (1.f + expf(-a));
}

LOOM_HD float swiglu_value(float a, float b) {
  return a * sigmoid(a) * b;
}

LOOM_HD void swiglu_gradients(float g, float a, float b, float* grad_a, float* grad_b) {
  const float s = sigmoid(a);
  *grad_a = g * b * s * (1.f + a * (1.f - s));
  *grad_b = g * a * s;
}

// Element i of SwiGLU's forward and backward (a thread's work).
template <typename T>
LOOM_HD void swiglu_element(const T* a, const T* b, T* out, int64_t i) {
  out[i] = Scalar<T>::store(swiglu_value(Scalar<T>::load(a[i]), Scalar<T>::load(b[i])));
}

template <typename T>
LOOM_HD void swiglu_element_backward(const T* grad, const T* a, const T* b, T* grad_a, T* grad_b,
                                     int64_t i) {
  float da = 0.f, db = 0.f;
  swiglu_gradients(Scalar<T>::load(grad[i]), Scalar<T>::load(a[i]), Scalar<T>::load(b[i]), &da,
                   &db);
  grad_a[i] = Scalar<T>::store(da);
  grad_b[i] = Scalar<T>::store(db);
}

// ---- RoPE: pairs of a head rotated by their position's angle ----

// The two elements of pair `p` (0 <= p < head_dim / 2) of a head: adjacent (interleaved, Llama's
// complex layout) or half a head apart (rotate-half, Hugging Face's layout).
LOOM_HD void rope_pair(int64_t p, int64_t head_dim, bool half_split, int64_t* first,
                       int64_t* second) {
  if (half_split) {
    *first = p;
    *second = p + head_dim / 2;
  } else {
    *first = 2 * p;
    *second = 2 * p + 1;
  }
}

// Where pair p of a rotary launch's tensor ([bs * seq, heads, head_dim / 2] pairs, flattened)
// is read and written, and its (cos, sin) in the [seq, head_dim] rotation table.
struct RopePlace {
  int64_t in0, in1, out0, out1, rotation;
};

LOOM_HD RopePlace rope_place(int64_t p, int64_t seq, int64_t heads, int64_t head_dim,
                             bool halves_in, bool halves_out) {
  const int64_t half = head_dim / 2;
  const int64_t pair = p % half;
  const int64_t head = p / half;  // over every token's heads
  const int64_t base = head * head_dim;
  RopePlace place{};
  rope_pair(pair, head_dim, halves_in, &place.in0, &place.in1);
  rope_pair(pair, head_dim, halves_out, &place.out0, &place.out1);
  place.in0 += base;
  place.in1 += base;
  place.out0 += base;
  place.out1 += base;
  place.rotation = ((head / heads) % seq) * head_dim + 2 * pair;
  return place;
}

// (x0 + i x1) (cos + i sign sin): sign -1 is the inverse rotation (the backward).
LOOM_HD void rope_rotate(float x0, float x1, float cos_a, float sin_a, float sign, float* y0,
                         float* y1) {
  const float s = sign * sin_a;
  *y0 = x0 * cos_a - x1 * s;
  *y1 = x0 * s + x1 * cos_a;
}

// Pair p of a tensor [bs, seq, heads, head_dim] rotated from x into out (a thread's work).
template <typename T>
LOOM_HD void rope_pair_rotate(const T* x, const float* rotation, T* out, int64_t p, int64_t seq,
                              int64_t heads, int64_t head_dim, bool halves_in, bool halves_out,
                              float sign) {
  const RopePlace at = rope_place(p, seq, heads, head_dim, halves_in, halves_out);
  float y0 = 0.f, y1 = 0.f;
  rope_rotate(Scalar<T>::load(x[at.in0]), Scalar<T>::load(x[at.in1]), rotation[at.rotation],
              rotation[at.rotation + 1], sign, &y0, &y1);
  out[at.out0] = Scalar<T>::store(y0);
  out[at.out1] = Scalar<T>::store(y1);
}

// ---- Cross-entropy: loss = logsumexp(row) - row[label]; grad = scale (softmax - onehot) ----

// A running maximum and the sum of exp(x - max) over the values seen.
struct MaxSum {
  float max;
  float sum;
};

LOOM_HD MaxSum max_sum_empty() {
  return {-INFINITY, 0.f};
}

LOOM_HD MaxSum max_sum_add(MaxSum a, float x) {
  if (x == -INFINITY) return a;
  if (x > a.max) return {x, a.sum * expf(a.max - x) + 1.f};
  return {a.max, a.sum + expf(x - a.max)};
}

// Commutative, so every lane of a butterfly holds the same value after it.
LOOM_HD MaxSum max_sum_merge(MaxSum a, MaxSum b) {
  const float m = a.max > b.max ? a.max : b.max;
  if (m == -INFINITY) return a;
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

template <typename T>
LOOM_HD MaxSum cross_entropy_partial(const T* row, int64_t vocab, int t, int threads) {
  MaxSum acc = max_sum_empty();
  for (int64_t i = t; i < vocab; i += threads) acc = max_sum_add(acc, Scalar<T>::load(row[i]));
  return acc;
}

LOOM_HD float logsumexp_of(MaxSum m) {
  return m.max + logf(m.sum);
}

// A label that is neither the ignore index nor in [0, vocab) makes the row's loss NaN: the
// device does not stop to report it, the loss shows it (the CPU kernel raises instead).
LOOM_HD bool label_in_vocab(int64_t label, int64_t vocab) {
  return label >= 0 && label < vocab;
}

// A row's loss from its logsumexp: 0 when its label is the ignore index.
template <typename T>
LOOM_HD float cross_entropy_row_loss(const T* row, int64_t label, int64_t vocab,
                                     int64_t ignore_index, float lse) {
  if (label == ignore_index) return 0.f;
  if (!label_in_vocab(label, vocab)) return NAN;
  return lse - Scalar<T>::load(row[label]);
}

LOOM_HD float cross_entropy_grad(float x, float lse, bool is_label, float scale) {
  return scale * (expf(x - lse) - (is_label ? 1.f : 0.f));
}

// ---- Gradient norm and clip ----

LOOM_HD double square_of(float v) {
  const double d = v;
  return d * d;
}

// min(1, max_norm / (norm + 1e-6)), and 1 for a norm that is not finite (left to the caller), as
// train/grad_clip.cpp's rule; computed on the device from the summed squares, so no host reads it.
LOOM_HD float clip_coefficient(double squared_total, double max_norm) {
  const double norm = sqrt(squared_total);
  if (!(norm <= 1.7976931348623157e308)) return 1.f;  // NaN or infinite
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.f;
}

}  // namespace loom::models::kernels::cuda_math
