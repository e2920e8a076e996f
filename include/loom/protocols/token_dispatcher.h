// The seam of expert parallelism: the mixture-of-experts layer (models/common/moe.h) hands its
// routed token copies to a TokenDispatcher, which parallel/expert_parallel.h implements with
// all-to-alls; the model never knows where its experts live.
#pragma once

#include <ATen/core/Tensor.h>

namespace loom::models {

// Moves routed token copies to the ranks that hold their experts and back (expert parallelism,
// implemented above the models by parallel/expert_parallel.h). Both calls are differentiable.
class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  struct Dispatched {
    at::Tensor tokens;        // [M, D] for this rank's experts, grouped by local expert
    at::Tensor local_counts;  // [local experts] int64
  };
  // routed [N, D] sorted by global expert, counts [E] int64 per global expert.
  virtual Dispatched dispatch(const at::Tensor& routed, const at::Tensor& counts) = 0;
  // The experts' outputs, in dispatch's order, back in `routed`'s order on this rank.
  virtual at::Tensor combine(const at::Tensor& expert_out) = 0;
};

}  // namespace loom::models
