#include "loom/optim/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

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

namespace {

// A step count for the fused kernels to read on `device`: float32, as their host-fed counts.
at::Tensor device_step_count(int64_t step, const at::Device& device) {
  return at::full({}, static_cast<double>(step),
                  at::TensorOptions().device(device).dtype(at::kFloat));
}

// A learning rate for them: float32 on CUDA (what its kernels read), float64 elsewhere (the CPU
// kernel then steps exactly as with a host double).
at::Tensor device_lr(double lr, const at::Device& device) {
  return at::full(
      {}, lr,
      at::TensorOptions().device(device).dtype(device.is_cuda() ? at::kFloat : at::kDouble));
}

}  // namespace

void Optimizer::step() {
  step(at::Tensor());
}

void Optimizer::step(const at::Tensor& skip) {
  at::NoGradGuard no_grad;
  const bool on_device = scalar_device_.has_value();
  if (skip.defined()) {
    LOOM_CHECK(can_skip(), "optimizer ", name_, ": an algorithm of its groups cannot skip a step");
    LOOM_CHECK(skip.dim() == 0 && skip.scalar_type() == at::kFloat,
               "optimizer: the skip flag is a 0-d float32 tensor, got ", skip.sizes(), " ",
               skip.scalar_type());
    if (uncounted_skips_.empty()) uncounted_skips_.assign(parameters_.size(), at::Tensor());
  }
  last_stepped_.clear();
  for (size_t g = 0; g < groups_.size(); ++g) {
    auto& group = groups_[g];
    const auto names = group.algorithm->state_names();
    std::vector<Slot> slots;
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
      Slot slot{&parameters_[i], p.grad(), {}, state->step + 1};
      if (on_device) {
        // The host count advances in count_device_step(), after the step really ran.
        if (!device_steps_[i].defined()) {
          device_steps_[i] = device_step_count(state->step, *scalar_device_);
        }
        slot.device_step = device_steps_[i];
      } else {
        ++state->step;
      }
      // Once any step could skip, every step reads the counters (a host count may still hold a
      // skip that no state() has settled, whether or not this step has a flag).
      if (!uncounted_skips_.empty()) {
        if (!uncounted_skips_[i].defined()) {
          uncounted_skips_[i] = at::zeros({}, p.options().dtype(at::kFloat));
        }
        slot.uncounted_skips = uncounted_skips_[i];
      }
      for (const auto& n : names) slot.state.push_back(state->tensors.at(n));
      slots.push_back(std::move(slot));
      last_stepped_.push_back(i);
    }
    GroupSettings settings{
        lr_ * group.lr_factor, weight_decay_ * group.weight_decay_factor, {}, skip};
    if (on_device) settings.device_lr = device_lrs_[g];
    // Every rank calls every group, even with no gradient here: distributed rules collect.
    group.algorithm->step(slots, settings);
    if (skip.defined() && !slots.empty()) count_skip(slots, skip, on_device);
    // LibTorch's fused optimizer kernels (at::_fused_adamw_) write the parameters in place
    // without bumping their version counters: bump them, so that whatever keys on a tensor's
    // version (float8's kept weight casts, autograd's saved-tensor checks) sees the step.
    if (!on_device) {
      for (const Slot& slot : slots) slot.parameter->tensor.unsafeGetTensorImpl()->bump_version();
    }
  }
}

void Optimizer::count_skip(const std::vector<Slot>& slots, const at::Tensor& skip, bool on_device) {
  // The host counts (and count_device_step) advanced for the step: a skipped one is remembered
  // on the device, and the device counts the kernels read go back by it at once.
  std::vector<at::Tensor> uncounted, device_counts;
  for (const Slot& slot : slots) {
    uncounted.push_back(slot.uncounted_skips);
    if (on_device) device_counts.push_back(slot.device_step);
  }
  at::_foreach_add_(uncounted, skip);
  if (on_device) at::_foreach_add_(device_counts, skip, /*alpha=*/-1);
  skips_unsettled_ = true;
}

void Optimizer::settle_skips() const {
  if (!skips_unsettled_) return;
  skips_unsettled_ = false;
  std::vector<size_t> held;
  std::vector<at::Tensor> counts;
  for (size_t i = 0; i < uncounted_skips_.size(); ++i) {
    if (!uncounted_skips_[i].defined()) continue;
    held.push_back(i);
    counts.push_back(uncounted_skips_[i].reshape({1}));
  }
  if (held.empty()) return;
  const at::Tensor values = at::cat(counts).to(at::kCPU);  // one copy (a sync on a device)
  for (size_t k = 0; k < held.size(); ++k) {
    const auto skipped = static_cast<int64_t>(std::llround(values[k].item<double>()));
    if (skipped == 0) continue;
    auto& state = states_[held[k]];
    if (state) state->step -= skipped;
    uncounted_skips_[held[k]].zero_();
  }
}

bool Optimizer::can_skip() const {
  for (const auto& group : groups_) {
    if (!group.algorithm->takes_skip()) return false;
  }
  return true;
}

bool Optimizer::can_keep_scalars_on_device() const {
  for (const auto& group : groups_) {
    if (!group.algorithm->takes_device_scalars()) return false;
  }
  return true;
}

void Optimizer::keep_scalars_on_device(const at::Device& device) {
  LOOM_CHECK(can_keep_scalars_on_device(), "optimizer ", name_,
             ": an algorithm of its groups cannot read its lr and step counts on the device");
  settle_skips();  // the device counts start from the host's
  scalar_device_ = device;
  device_lrs_.clear();
  for (const auto& group : groups_) device_lrs_.push_back(device_lr(lr_ * group.lr_factor, device));
  device_steps_.assign(parameters_.size(), at::Tensor());
}

void Optimizer::load_device_scalars() {
  LOOM_CHECK(scalar_device_.has_value(), "optimizer: keep_scalars_on_device was not called");
  for (size_t g = 0; g < groups_.size(); ++g) device_lrs_[g].fill_(lr_ * groups_[g].lr_factor);
}

void Optimizer::count_device_step() {
  // A replayed step graph runs count_skip's device ops without its host code: the host learns
  // here that the device counters may have moved.
  if (!uncounted_skips_.empty()) skips_unsettled_ = true;
  for (size_t i : last_stepped_) {
    ++states_[i]->step;
    parameters_[i].tensor.unsafeGetTensorImpl()->bump_version();
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
  settle_skips();
  return states_[index] ? &*states_[index] : nullptr;
}

void Optimizer::set_state(size_t index, ParameterState state) {
  LOOM_CHECK(index < states_.size(), "optimizer: no parameter ", index);
  settle_skips();
  // The device count follows the new one in place: a recorded step graph keeps its address.
  if (scalar_device_ && device_steps_[index].defined()) {
    device_steps_[index].fill_(static_cast<double>(state.step));
  }
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
