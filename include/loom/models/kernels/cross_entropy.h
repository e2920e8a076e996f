// Cross-entropy summed over tokens, from logits, as one fused CPU kernel (forward and backward).
//
// ATen's cross_entropy is log_softmax (a second [tokens, vocab] float32 tensor, kept for
// backward) then nll_loss; its backward zero-fills a [tokens, vocab] gradient, scatters into it
// and runs log_softmax's backward over it. The fused kernel keeps no log-probabilities: forward
// reads each row of logits for its max and its sum of exponentials and saves one logsumexp per
// row; backward writes softmax - onehot in one pass over the saved logits. Rows are split over
// LibTorch's intra-op threads; the per-row losses are summed in float64, in row order. Built per
// instruction set like swiglu.h. Anything else (not CPU or CUDA, not float32, not contiguous, a
// non-negative ignore index) takes at::cross_entropy_loss.
#pragma once

#include <ATen/core/Tensor.h>

namespace loom::models::kernels {

// sum over rows of -log_softmax(logits)[row, labels[row]], skipping rows whose label is
// `ignore_index`; logits [rows, vocab], labels [rows] int64. A label outside [0, vocab) that is
// not the ignore index is an error.
//
// On CUDA, loom's kernel where enabled (cuda.h): logits in float32 or bfloat16, read in their own
// dtype; a label out of range makes the loss NaN (the device does not stop to raise). With
// `overwrite_logits`, its backward writes the gradient over `logits` (no second logits-sized
// buffer): the caller promises nothing reads those logits after the backward, and no other
// autograd node saved them (rows of one logits tensor, each with its own call, are fine).
at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels,
                             int64_t ignore_index, bool overwrite_logits = false);

// True when cross_entropy_sum takes the fused kernel for these inputs.
bool cross_entropy_is_fused(const at::Tensor& logits, const at::Tensor& labels,
                            int64_t ignore_index);

}  // namespace loom::models::kernels
