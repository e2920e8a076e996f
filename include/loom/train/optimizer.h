// AdamW (or Adam) over the model's (local) parameters, and global-norm gradient clipping.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <memory>
#include <vector>

#include "loom/config/job_config.h"

namespace loom::train {

// optimizer.name AdamW (decoupled weight decay) or Adam (L2 weight decay).
std::unique_ptr<torch::optim::Optimizer> build_optimizer(const config::OptimizerSection& section,
                                                         const std::vector<at::Tensor>& parameters);

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// Scales gradients so their global L2 norm is at most max_norm (no scaling when max_norm <= 0)
// and returns the norm before clipping.
double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm);

}  // namespace loom::train
