// Runs callbacks each time autograd has accumulated a leaf's gradient (LibTorch's
// post-accumulate-grad hook): where DDP, FSDP and TP learn that a parameter's gradient is final
// for this backward and its communication can start. A tensor holds any number of callbacks,
// each under an owner key, so that wrappers composed on one parameter (FSDP's reduce-scatter
// and a TP all-reduce) each get theirs; callbacks run in the order they were added.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace loom::parallel {

// Adds `callback` under `owner` (any address unique to the caller, e.g. `this`).
void add_gradient_ready_hook(const at::Tensor& leaf, const void* owner,
                             std::function<void()> callback);
// Removes the callbacks `owner` added to `leaf` (the others stay).
void remove_gradient_ready_hooks(const at::Tensor& leaf, const void* owner);

}  // namespace loom::parallel
