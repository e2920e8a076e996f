// AdamW (or Adam) over the model's (local) parameters. The step runs LibTorch's fused
// multi-tensor kernel (at::_fused_adamw_ / at::_fused_adam_, one pass over parameters, gradients
// and moments; CPU and CUDA kernels), with the state kept in torch::optim's classes so that
// checkpoints and tools read it as before.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <memory>
#include <vector>

#include "loom/config/job_config.h"

namespace loom::train {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  at::Tensor step(LossClosure closure = nullptr) override;
};

// optimizer.name AdamW (decoupled weight decay) or Adam (L2 weight decay).
std::unique_ptr<torch::optim::Optimizer> build_optimizer(const config::OptimizerSection& section,
                                                         const std::vector<at::Tensor>& parameters);

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace loom::train
