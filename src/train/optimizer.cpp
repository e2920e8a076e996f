#include "loom/train/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "loom/core/check.h"

namespace loom::train {

std::unique_ptr<torch::optim::Optimizer> build_optimizer(
    const config::OptimizerSection& section, const std::vector<at::Tensor>& parameters) {
  if (section.name == "AdamW") {
    torch::optim::AdamWOptions options(section.lr);
    options.betas({section.beta1, section.beta2})
        .eps(section.eps)
        .weight_decay(section.weight_decay);
    return std::make_unique<torch::optim::AdamW>(parameters, options);
  }
  LOOM_CHECK_AS(InputError, section.name == "Adam",
                "optimizer.name: loom implements AdamW and Adam, got '", section.name, "'");
  // Adam's weight decay is the classic L2 term added to the gradient, as in torch.optim.Adam.
  torch::optim::AdamOptions options(section.lr);
  options.betas({section.beta1, section.beta2}).eps(section.eps).weight_decay(section.weight_decay);
  return std::make_unique<torch::optim::Adam>(parameters, options);
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    group.options().set_lr(lr);
  }
}

double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const auto& p : parameters) {
    // In float64: a float32 sum of squares over a million-element gradient is off by ~1e-4,
    // enough to make runs that differ only in layout clip differently.
    if (p.grad().defined()) {
      norms.push_back(at::linalg_vector_norm(p.grad(), 2, std::nullopt, false, at::kDouble));
    }
  }
  if (norms.empty()) return 0.0;
  const double total = at::linalg_vector_norm(at::stack(norms), 2).item<double>();
  // Same rule as torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when below 1.
  const double scale = max_norm / (total + 1e-6);
  if (max_norm > 0 && std::isfinite(total) && scale < 1.0) {
    for (const auto& p : parameters) {
      if (p.grad().defined()) p.grad().mul_(scale);
    }
  }
  return total;
}

}  // namespace loom::train
