// Activation checkpointing: run a function without keeping its intermediate activations, and
// run it again during backward to get them back. Trades compute for memory.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace loom::parallel {

using CheckpointedFn = std::function<at::Tensor(const at::Tensor&)>;

// Returns fn(input). Only `input` is kept for backward; fn must be deterministic (no dropout),
// and reads its parameters at backward time, so they must not change in between.
// `parameters`: the tensors fn reads that need gradients. They become inputs of the region's
// backward node, so a backward restricted to some tensors (autograd::grad(out, input), or
// backward(inputs = parameters)) computes exactly those, and the parameters' gradients are
// accumulated by the outer backward (not by a nested one), so post-accumulate-grad hooks (DDP's,
// FSDP's) run once. A tensor fn reads that needs a gradient but is not listed is an error in
// backward (it would get no gradient). Tensor hooks registered on a listed
// parameter itself (register_hook) run twice: in the recompute's autograd::grad and again when
// the outer backward accumulates; loom registers none there.
at::Tensor checkpoint(const CheckpointedFn& fn, const at::Tensor& input,
                      const std::vector<at::Tensor>& parameters);

// Whether the code running now is a training forward seen once per step: grad mode on outside
// any checkpointed region, or a checkpointed region's first (no-grad) forward, but not its
// recompute in backward nor a no-grad evaluation. State that a forward accumulates (a mixture of
// experts' token counts) counts only then.
bool in_training_forward();
// Whether this forward builds the graph a backward will run through: an ordinary forward with
// gradients on, or an activation-checkpointed region's recompute (not its first, gradient-free
// forward). Losses attached to the graph (a MoE auxiliary loss) attach here.
bool builds_backward_graph();

// Which of n blocks to checkpoint for activation_checkpoint.mode / selective_ac_option:
// "none": none; "full": all; "selective" with N: every N-th (blocks N-1, 2N-1, ...).
std::vector<bool> blocks_to_checkpoint(const std::string& mode, const std::string& selective_option,
                                       int64_t n_blocks);

}  // namespace loom::parallel
