// Global-norm gradient clipping over any parallel layout (torch.nn.utils.clip_grad_norm_'s rule).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "loom/parallel/placement.h"

namespace loom::distributed {
class Comm;
}

namespace loom::train {

// The L2 norm of the gradients of the global parameters that `tensors` are local boxes of (one
// placement each): every box is counted once, by the first rank of its replica set, and the
// squared sums of all ranks are added over `all_ranks` (every rank holding any parameter; null
// or one rank: nothing to add). Gradients must be synchronized first. When max_norm > 0 and the
// norm is finite, scales every local gradient by min(1, max_norm / (norm + 1e-6)). Returns the
// norm before clipping as a 0-d float64 tensor on the gradients' device, without a host sync:
// read it only when it is logged.
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& tensors,
                          const std::vector<parallel::Placement>& placements, double max_norm,
                          distributed::Comm* all_ranks);

// All tensors whole and local (one process).
double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm);

// training.skip_nonfinite_steps: 1 where the norm clip_grad_norm returned is NaN or infinite,
// else 0 (a 0-d float32 tensor on its device, made without a host sync: the optimizer's skip
// flag). Undefined when skipping is off (limit 0). Every rank computes it from the same
// all-reduced norm, so every rank skips alike.
at::Tensor nonfinite_skip_flag(const at::Tensor& grad_norm, int64_t limit);

}  // namespace loom::train
