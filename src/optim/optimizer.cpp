#include "loom/optim/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "loom/core/check.h"

namespace loom::optim {

Optimizer::Optimizer(std::string name, std::vector<NamedParameter> parameters,
                     std::vector<ParameterGroup> groups, double lr, double weight_decay)
    : name_(std::move(name)),
      parameters_(std::move(parameters)),
      groups_(std::move(groups)),
      group_index_(parameters_.size(), groups_.size()),
      states_(parameters_.size()),
      lr_(lr),
      weight_decay_(weight_decay) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    LOOM_CHECK(groups_[g].algorithm != nullptr, "optimizer group '", groups_[g].role,
               "' has no algorithm");
    for (size_t i : groups_[g].members) {
      LOOM_CHECK(i < parameters_.size() && group_index_[i] == groups_.size(),
                 "optimizer: parameter ", i, " is in no group or in two");
      group_index_[i] = g;
    }
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    LOOM_CHECK(group_index_[i] < groups_.size(), "optimizer: parameter '", parameters_[i].name,
               "' is in no group");
    by_name_.emplace(parameters_[i].name, i);
    by_tensor_.emplace(parameters_[i].tensor.unsafeGetTensorImpl(), i);
  }
}

Optimizer::~Optimizer() = default;

void Optimizer::step() {
  at::NoGradGuard no_grad;
  for (auto& group : groups_) {
    const auto names = group.algorithm->state_names();
    std::vector<Slot> slots;
    std::vector<size_t> stepped;
    for (size_t i : group.members) {
      const at::Tensor& p = parameters_[i].tensor;
      if (!p.grad().defined()) continue;
      auto& state = states_[i];
      if (!state) {
        state.emplace();
        for (const auto& n : names) {
          state->tensors[n] = at::zeros_like(p, at::MemoryFormat::Preserve);
        }
      }
      ++state->step;
      Slot slot{&parameters_[i], p.grad(), {}, state->step};
      for (const auto& n : names) slot.state.push_back(state->tensors.at(n));
      slots.push_back(std::move(slot));
    }
    // Every rank calls every group, even with no gradient here: distributed rules collect.
    group.algorithm->step(slots,
                          {lr_ * group.lr_factor, weight_decay_ * group.weight_decay_factor});
    // LibTorch's fused optimizer kernels (at::_fused_adamw_) write the parameters in place
    // without bumping their version counters: bump them, so that whatever keys on a tensor's
    // version (float8's kept weight casts, autograd's saved-tensor checks) sees the step.
    for (const Slot& slot : slots) slot.parameter->tensor.unsafeGetTensorImpl()->bump_version();
  }
}

void Optimizer::zero_grad() {
  for (auto& p : parameters_) {
    if (p.tensor.grad().defined()) p.tensor.mutable_grad().reset();
  }
}

std::optional<size_t> Optimizer::index_of(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::optional<size_t> Optimizer::index_of(const at::Tensor& tensor) const {
  auto it = by_tensor_.find(tensor.unsafeGetTensorImpl());
  if (it == by_tensor_.end()) return std::nullopt;
  return it->second;
}

const ParameterGroup& Optimizer::group_of(size_t index) const {
  LOOM_CHECK(index < parameters_.size(), "optimizer: no parameter ", index);
  return groups_[group_index_[index]];
}

std::vector<std::string> Optimizer::state_names(size_t index) const {
  return group_of(index).algorithm->state_names();
}

std::vector<std::string> Optimizer::all_state_names() const {
  std::vector<std::string> all;
  for (const auto& g : groups_) {
    for (const auto& n : g.algorithm->state_names()) {
      if (std::find(all.begin(), all.end(), n) == all.end()) all.push_back(n);
    }
  }
  return all;
}

const ParameterState* Optimizer::state(size_t index) const {
  LOOM_CHECK(index < states_.size(), "optimizer: no parameter ", index);
  return states_[index] ? &*states_[index] : nullptr;
}

void Optimizer::set_state(size_t index, ParameterState state) {
  LOOM_CHECK(index < states_.size(), "optimizer: no parameter ", index);
  if (state.step == 0) {
    states_[index].reset();
    return;
  }
  const auto& p = parameters_[index];
  const auto names = state_names(index);
  LOOM_CHECK(state.tensors.size() == names.size(), "optimizer state of '", p.name,
             "': ", state.tensors.size(), " tensors, ", group_of(index).algorithm->name(),
             " keeps ", names.size());
  for (const auto& n : names) {
    auto it = state.tensors.find(n);
    LOOM_CHECK(it != state.tensors.end(), "optimizer state of '", p.name, "' has no '", n, "'");
    LOOM_CHECK(it->second.sizes() == p.tensor.sizes(), "optimizer state '", n, "' of '", p.name,
               "' has shape ", it->second.sizes(), ", the parameter ", p.tensor.sizes());
    // The parameter's device and dtype, as a fresh state would be.
    it->second = it->second.to(p.tensor.options());
  }
  states_[index] = std::move(state);
}

}  // namespace loom::optim
