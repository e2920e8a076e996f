#include "loom/train/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <tuple>

#include "loom/core/check.h"

namespace loom::train {
namespace {

// One fused call per (device, dtype) group of parameters with gradients. `Options` and `State`
// are Adam's or AdamW's; `kernel` is at::_fused_adam_ or at::_fused_adamw_.
template <typename Options, typename State, typename Kernel>
void fused_step(torch::optim::Optimizer& optimizer, Kernel kernel) {
  at::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    LOOM_CHECK_AS(InputError, !options.amsgrad(), "optimizer: amsgrad is not supported");
    struct Lists {
      std::vector<at::Tensor> params, grads, avg, avg_sq, steps_cpu;
    };
    std::map<std::pair<std::string, at::ScalarType>, Lists> by_kind;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = optimizer.state()[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto state = std::make_unique<State>();
        state->step(0);
        state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(state);
      }
      auto& state = static_cast<State&>(*slot);
      state.step(state.step() + 1);
      Lists& lists = by_kind[{p.device().str(), p.scalar_type()}];
      lists.params.push_back(p);
      lists.grads.push_back(p.grad());
      lists.avg.push_back(state.exp_avg());
      lists.avg_sq.push_back(state.exp_avg_sq());
      lists.steps_cpu.push_back(at::scalar_tensor(static_cast<double>(state.step()), at::kFloat));
    }
    const auto [beta1, beta2] = options.betas();
    for (auto& [kind, lists] : by_kind) {
      // The kernel reads each parameter's step count (already incremented) from a float tensor
      // on the parameters' device: one copy for all of them.
      at::Tensor steps = at::stack(lists.steps_cpu).to(lists.params.front().device());
      const std::vector<at::Tensor> no_max_exp_avg_sqs;  // amsgrad only
      kernel(lists.params, lists.grads, lists.avg, lists.avg_sq, no_max_exp_avg_sqs,
             steps.unbind(0), options.lr(), beta1, beta2, options.weight_decay(), options.eps(),
             /*amsgrad=*/false, /*maximize=*/false, std::nullopt, std::nullopt);
    }
  }
}

}  // namespace

at::Tensor FusedAdamW::step(LossClosure closure) {
  LOOM_CHECK(closure == nullptr, "FusedAdamW: closures are not supported");
  fused_step<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
      *this, [](auto&&... args) { at::_fused_adamw_(std::forward<decltype(args)>(args)...); });
  return {};
}

at::Tensor FusedAdam::step(LossClosure closure) {
  LOOM_CHECK(closure == nullptr, "FusedAdam: closures are not supported");
  fused_step<torch::optim::AdamOptions, torch::optim::AdamParamState>(
      *this, [](auto&&... args) { at::_fused_adam_(std::forward<decltype(args)>(args)...); });
  return {};
}

std::unique_ptr<torch::optim::Optimizer> build_optimizer(
    const config::OptimizerSection& section, const std::vector<at::Tensor>& parameters) {
  if (section.name == "AdamW") {
    torch::optim::AdamWOptions options(section.lr);
    options.betas({section.beta1, section.beta2})
        .eps(section.eps)
        .weight_decay(section.weight_decay);
    return std::make_unique<FusedAdamW>(parameters, options);
  }
  LOOM_CHECK_AS(InputError, section.name == "Adam",
                "optimizer.name: loom implements AdamW and Adam, got '", section.name, "'");
  // Adam's weight decay is the classic L2 term added to the gradient, as in torch.optim.Adam.
  torch::optim::AdamOptions options(section.lr);
  options.betas({section.beta1, section.beta2}).eps(section.eps).weight_decay(section.weight_decay);
  return std::make_unique<FusedAdam>(parameters, options);
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    group.options().set_lr(lr);
  }
}

}  // namespace loom::train
