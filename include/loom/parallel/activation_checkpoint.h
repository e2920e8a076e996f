// Activation checkpointing: run a function without keeping its intermediate activations, and
// run it again during backward to get them back. Trades compute for memory.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace loom::parallel {

using CheckpointedFn = std::function<at::Tensor(const at::Tensor&)>;

// Returns fn(input). Only `input` is kept for backward; fn must be deterministic (no dropout),
// and reads its parameters at backward time, so they must not change in between.
at::Tensor checkpoint(const CheckpointedFn& fn, const at::Tensor& input);

// Which of n blocks to checkpoint for activation_checkpoint.mode / selective_ac_option:
// "none": none; "full": all; "selective" with N: every N-th (blocks N-1, 2N-1, ...).
std::vector<bool> blocks_to_checkpoint(const std::string& mode, const std::string& selective_option,
                                       int64_t n_blocks);

}  // namespace loom::parallel
