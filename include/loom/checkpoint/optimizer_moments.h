// Adam's and AdamW's per-parameter state (step count and moments), read and written the same way
// for both classes: what checkpoints save and load, and what a healing replica group receives.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace torch::optim {
class Optimizer;
}

namespace loom::checkpoint {

struct MomentState {
  int64_t step = 0;
  at::Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
};
// nullopt: the optimizer has not stepped this parameter yet.
std::optional<MomentState> moments(torch::optim::Optimizer& optimizer, const at::Tensor& p);
void set_moments(torch::optim::Optimizer& optimizer, const at::Tensor& p, const MomentState& m);

}  // namespace loom::checkpoint
