// Runs a callback each time autograd has accumulated a leaf's gradient (LibTorch's
// post-accumulate-grad hook): where DDP and FSDP learn that a parameter's gradient is final for
// this backward and its communication can start. One hook per tensor; a new one replaces it.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace loom::parallel {

void set_gradient_ready_hook(const at::Tensor& leaf, std::function<void()> callback);
void clear_gradient_ready_hook(const at::Tensor& leaf);

}  // namespace loom::parallel
