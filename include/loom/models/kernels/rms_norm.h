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

#include <utility>

namespace loom::models::kernels {

// RMSNorm of `input` over its last dimension with `weight` (that dimension's size).
at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps);

// True when rms_norm(input, weight, eps) takes the fused kernel for these inputs.
bool rms_norm_is_fused(const at::Tensor& input, const at::Tensor& weight);

// The residual stream's norm: (sum, rms_norm(sum)) with sum = x + delta, or sum = x when delta
// is undefined. One pass forward (the add and the norm per row); in backward, the gradient the
// sum receives from its other use is added inside the norm's pass, where autograd would add it
// in one of its own. Results equal the unfused ops bit for bit.
std::pair<at::Tensor, at::Tensor> residual_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                    const at::Tensor& weight, double eps);

// True when residual_rms_norm takes the fused kernels for these inputs.
bool residual_rms_norm_is_fused(const at::Tensor& x, const at::Tensor& delta,
                                const at::Tensor& weight);

}  // namespace loom::models::kernels
