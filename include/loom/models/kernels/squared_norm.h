// The sum of squares of many float32 tensors, accumulated in float64, without a float64 copy of
// them (at::_foreach_norm with a float64 dtype converts each tensor first: on CPU that copy cost
// more than the norm). Gradient clipping uses it: a float32 sum over a million elements is off by
// ~1e-4, enough for layouts to clip differently.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace loom::models::kernels {

// sum over tensors and elements of x^2, as a float64 tensor of shape [1] on the tensors' device
// (CPU when empty). CPU float32 contiguous tensors take the fused kernel, summed over fixed
// blocks of elements in order (the same result on any number of threads); others take
// at::_foreach_norm in float64.
// On CUDA, loom's kernel where enabled (cuda.h), in float64 in a fixed order.
at::Tensor squared_norm(const std::vector<at::Tensor>& tensors);

// Gradient clipping's scale, applied by loom's CUDA kernel: every tensor of `grads` scaled in
// place by min(1, max_norm / (sqrt(squared_total) + 1e-6)) (1 where that is not finite), computed
// on the device from squared_total (float64, one element), so no host waits for the norm.
// Returns false, having done nothing, where the kernels are off or do not take every tensor.
bool clip_on_device(const std::vector<at::Tensor>& grads, const at::Tensor& squared_total,
                    double max_norm);

}  // namespace loom::models::kernels
