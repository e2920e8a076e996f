// AdamW (decoupled weight decay) and Adam (L2 weight decay, added to the gradient, as
// torch.optim.Adam): LibTorch's fused multi-tensor kernels (at::_fused_adamw_ / at::_fused_adam_,
// one pass over parameters, gradients and moments; CPU and CUDA), one call per (device, dtype).
#include <ATen/ATen.h>

#include <map>
#include <optional>

#include "loom/core/check.h"
#include "loom/optim/adamw.h"
#include "loom/optim/registry.h"

namespace loom::optim {
namespace {

class FusedAdam : public Algorithm {
 public:
  FusedAdam(const config::OptimizerSection& s, bool decoupled)
      : beta1_(s.beta1), beta2_(s.beta2), eps_(s.eps), decoupled_(decoupled) {}

  std::string name() const override { return decoupled_ ? "AdamW" : "Adam"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  bool takes_device_scalars() const override { return true; }
  // The fused kernels' found_inf: a step flagged there changes nothing.
  bool takes_skip() const override { return true; }

  void step(std::vector<Slot>& slots, const GroupSettings& settings) override {
    if (settings.device_lr.defined()) {
      step_with_device_scalars(slots, settings);
      return;
    }
    struct Lists {
      std::vector<at::Tensor> params, grads, avg, avg_sq, steps_cpu, uncounted_skips;
    };
    std::map<std::pair<std::string, at::ScalarType>, Lists> by_kind;
    for (auto& slot : slots) {
      const at::Tensor& p = slot.parameter->tensor;
      Lists& lists = by_kind[{p.device().str(), p.scalar_type()}];
      lists.params.push_back(p);
      lists.grads.push_back(slot.grad);
      lists.avg.push_back(slot.state[0]);
      lists.avg_sq.push_back(slot.state[1]);
      lists.steps_cpu.push_back(at::scalar_tensor(static_cast<double>(slot.step), at::kFloat));
      if (slot.uncounted_skips.defined()) lists.uncounted_skips.push_back(slot.uncounted_skips);
    }
    const std::optional<at::Tensor> found_inf =
        settings.skip.defined() ? std::optional<at::Tensor>(settings.skip) : std::nullopt;
    for (auto& [kind, lists] : by_kind) {
      // The kernel reads each parameter's step count (already incremented) from a float tensor
      // on the parameters' device: one copy for all of them, from pinned memory and without
      // waiting on a GPU (a copy from pageable memory would synchronize the host every step).
      const at::Device device = lists.params.front().device();
      at::Tensor steps = at::stack(lists.steps_cpu);
      if (device.is_cuda()) steps = steps.pin_memory();
      steps = steps.to(device, /*non_blocking=*/device.is_cuda());
      // Skipped steps the host counts still hold are taken off on the device (no sync).
      if (!lists.uncounted_skips.empty()) steps = steps - at::stack(lists.uncounted_skips);
      const std::vector<at::Tensor> no_max_exp_avg_sqs;  // amsgrad only
      if (decoupled_) {
        at::_fused_adamw_(lists.params, lists.grads, lists.avg, lists.avg_sq, no_max_exp_avg_sqs,
                          steps.unbind(0), settings.lr, beta1_, beta2_, settings.weight_decay, eps_,
                          /*amsgrad=*/false, /*maximize=*/false, std::nullopt, found_inf);
      } else {
        at::_fused_adam_(lists.params, lists.grads, lists.avg, lists.avg_sq, no_max_exp_avg_sqs,
                         steps.unbind(0), settings.lr, beta1_, beta2_, settings.weight_decay, eps_,
                         /*amsgrad=*/false, /*maximize=*/false, std::nullopt, found_inf);
      }
    }
  }

 private:
  // The lr and the step counts read on the device (a whole-step CUDA graph): the counts are
  // incremented there, then the kernels read them and the lr tensor when they run.
  void step_with_device_scalars(std::vector<Slot>& slots, const GroupSettings& settings) {
    std::map<std::pair<std::string, at::ScalarType>, std::vector<Slot*>> by_kind;
    for (auto& slot : slots) {
      const at::Tensor& p = slot.parameter->tensor;
      by_kind[{p.device().str(), p.scalar_type()}].push_back(&slot);
    }
    for (auto& [kind, group] : by_kind) {
      std::vector<at::Tensor> params, grads, avg, avg_sq, steps;
      for (Slot* slot : group) {
        params.push_back(slot->parameter->tensor);
        grads.push_back(slot->grad);
        avg.push_back(slot->state[0]);
        avg_sq.push_back(slot->state[1]);
        steps.push_back(slot->device_step);
      }
      at::_foreach_add_(steps, 1);
      const std::vector<at::Tensor> no_max_exp_avg_sqs;
      // A skipped step's count is taken back by the Optimizer after this (count_skip).
      const std::optional<at::Tensor> found_inf =
          settings.skip.defined() ? std::optional<at::Tensor>(settings.skip) : std::nullopt;
      if (decoupled_) {
        at::_fused_adamw_(params, grads, avg, avg_sq, no_max_exp_avg_sqs, steps, settings.device_lr,
                          beta1_, beta2_, settings.weight_decay, eps_,
                          /*amsgrad=*/false, /*maximize=*/false, std::nullopt, found_inf);
      } else {
        at::_fused_adam_(params, grads, avg, avg_sq, no_max_exp_avg_sqs, steps, settings.device_lr,
                         beta1_, beta2_, settings.weight_decay, eps_,
                         /*amsgrad=*/false, /*maximize=*/false, std::nullopt, found_inf);
      }
    }
  }

  double beta1_, beta2_, eps_;
  bool decoupled_;
};

}  // namespace

std::unique_ptr<Algorithm> make_adam(const config::OptimizerSection& section, bool decoupled) {
  return std::make_unique<FusedAdam>(section, decoupled);
}

OptimizerKind adamw_kind() {
  return {"AdamW", "Adam with decoupled weight decay (torch.optim.AdamW), every parameter",
          [](const config::OptimizerSection& s, const std::string&) { return make_adam(s, true); }};
}

OptimizerKind adam_kind() {
  return {
      "Adam", "Adam with L2 weight decay (torch.optim.Adam), every parameter",
      [](const config::OptimizerSection& s, const std::string&) { return make_adam(s, false); }};
}

}  // namespace loom::optim
