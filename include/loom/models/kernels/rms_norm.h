// RMSNorm, (x * rsqrt(mean(x^2) + eps)) * weight over the last dimension, as one fused CPU
// kernel (forward and backward).
//
// On CPU, at::rms_norm is a composition: pow, mean, add, rsqrt, two muls forward, and about twice
// as many passes in backward, each over the whole activation. The fused kernel reads x once in
// forward (writing y and one rstd per row, which it saves with x), and x and the gradient once in
// backward, writing grad_x and accumulating grad_weight in the same pass. grad_weight is summed
// over fixed blocks of rows and then across the blocks in order, so it does not depend on the
// number of intra-op threads. Built per instruction set like swiglu.h. Anything else (not CPU, not
// float32, not contiguous, a weight that does not match the last dimension) takes at::rms_norm.
#pragma once

#include <ATen/core/Tensor.h>

namespace loom::models::kernels {

// RMSNorm of `input` over its last dimension with `weight` (that dimension's size).
at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps);

// True when rms_norm(input, weight, eps) takes the fused kernel for these inputs.
bool rms_norm_is_fused(const at::Tensor& input, const at::Tensor& weight);

}  // namespace loom::models::kernels
