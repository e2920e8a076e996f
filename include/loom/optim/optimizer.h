// The optimizer seam. An optimizer steps named parameters (their global names and placements, as
// the parallelize functions hand them over) in groups: each group is one update rule (an
// Algorithm: AdamW's, Adam's, Muon's) with its own learning-rate and weight-decay factors.
//
// State is named and generic: each parameter has a step count and the state tensors its group's
// algorithm names ("exp_avg", "exp_avg_sq" for Adam and AdamW; "momentum_buffer" for Muon), each
// shaped like the parameter's local tensor. Checkpoints (optimizer.<state>.<parameter>), replica
// healing and tools read and write state through this interface only; the planner and the memory
// estimate ask the registry (registry.h) how many state tensors each parameter has.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/parallel/parallelize.h"

namespace loom::optim {

using NamedParameter = parallel::ModelParameter;

// One parameter as an algorithm's step sees it: the parameter, its (synchronized) gradient, its
// state tensors in the order of Algorithm::state_names and its step count (already incremented).
struct Slot {
  const NamedParameter* parameter = nullptr;
  at::Tensor grad;
  std::vector<at::Tensor> state;
  int64_t step = 0;
  // With the scalars on the device (Optimizer::keep_scalars_on_device): the step count as a 0-d
  // tensor there, not yet incremented (the algorithm adds 1 on the device), and `step` is unused.
  at::Tensor device_step{};
  // With Optimizer::step(skip): the steps this parameter skipped that `step` still counts (a
  // 0-d float32 tensor on the parameter's device); the kernels read `step` minus it.
  at::Tensor uncounted_skips{};
};

// The learning rate and weight decay a group steps with this step (base values times the
// group's factors).
struct GroupSettings {
  double lr = 0;
  double weight_decay = 0;
  // With the scalars on the device: the group's lr as a 0-d tensor there (read by the kernels
  // when they run, so a replayed CUDA graph steps with the current lr); `lr` is unused.
  at::Tensor device_lr;
  // Optimizer::step(skip): a 0-d float32 tensor on the parameters' device, 1 when this step must
  // change nothing (no parameter, no state), 0 otherwise; read on the device, never the host.
  at::Tensor skip;
};

// One update rule. A new optimizer is an Algorithm in one file, plus its line in registry.cpp.
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual std::string name() const = 0;
  // The state tensors of each parameter, each shaped like the parameter (local tensor).
  virtual std::vector<std::string> state_names() const = 0;
  virtual void step(std::vector<Slot>& slots, const GroupSettings& settings) = 0;
  // For the planner: FLOPs of one step on a parameter of `global_shape` beyond elementwise work
  // (Muon's Newton-Schulz), and whether the rule needs the whole tensor (gathered when sharded).
  virtual double matrix_flops(at::IntArrayRef /*global_shape*/) const { return 0; }
  virtual bool needs_whole_tensor() const { return false; }
  // Whether step() reads the lr and the step counts from the device (Slot::device_step,
  // GroupSettings::device_lr) when they are given, doing nothing on the host that depends on
  // them: what a whole-step CUDA graph needs (train/step_graph.h).
  virtual bool takes_device_scalars() const { return false; }
  // Whether step() honours GroupSettings::skip on the device (nothing changes where it is 1):
  // what Optimizer::step(skip) and training.skip_nonfinite_steps need.
  virtual bool takes_skip() const { return false; }
};

// Which parameters a group holds and how its lr and weight decay relate to the optimizer's.
struct ParameterGroup {
  std::string role;  // "matrix", "embedding", "head", "scalar", "routing" (param_groups.h)
  std::unique_ptr<Algorithm> algorithm;
  double lr_factor = 1.0;
  double weight_decay_factor = 1.0;
  std::vector<size_t> members;  // indices into Optimizer::parameters()
};

// A parameter's state: its step count and its algorithm's state tensors by name.
struct ParameterState {
  int64_t step = 0;
  std::map<std::string, at::Tensor> tensors;
};

class Optimizer {
 public:
  Optimizer(std::string name, std::vector<NamedParameter> parameters,
            std::vector<ParameterGroup> groups, double lr, double weight_decay);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // The config's optimizer.name ("AdamW", "Muon"): what checkpoints record.
  const std::string& name() const { return name_; }
  // One step over every parameter with a gradient (a parameter without one keeps its state and
  // step count, as torch.optim does).
  void step();
  // The same, unless `skip` (a 0-d float32 tensor on the parameters' device: 1 or 0) is 1 when
  // the step runs: then no parameter, state tensor or step count changes, as a step skipped by
  // torch's GradScaler. Decided on the device, without a host sync (training.
  // skip_nonfinite_steps); the host's step counts learn of skips lazily, on the next state()
  // or set_state().
  void step(const at::Tensor& skip);
  // Drops every gradient (set_to_none, as torch.optim's default).
  void zero_grad();
  // The base learning rate; each group steps with lr x its lr_factor.
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }

  // Whole-step CUDA graphs (train/step_graph.h): from now on step() takes each group's lr and
  // each parameter's step count from tensors on `device` and counts the step there, so that a
  // recorded step() replays with the current values. load_device_scalars() writes the current lr
  // there before each step; count_device_step() then advances the host's step counts (what
  // checkpoints save) by the step that ran. Needs every group's algorithm to take device
  // scalars.
  bool can_keep_scalars_on_device() const;
  // Whether every group's algorithm can skip a step on the device (step(skip)).
  bool can_skip() const;
  void keep_scalars_on_device(const at::Device& device);
  void load_device_scalars();
  void count_device_step();

  const std::vector<NamedParameter>& parameters() const { return parameters_; }
  const std::vector<ParameterGroup>& groups() const { return groups_; }
  // Index of the parameter named `name` / whose local tensor is `tensor`; nullopt when absent.
  std::optional<size_t> index_of(const std::string& name) const;
  std::optional<size_t> index_of(const at::Tensor& tensor) const;
  // The group parameter `index` belongs to.
  const ParameterGroup& group_of(size_t index) const;

  // The names of parameter `index`'s state tensors (its group's algorithm's).
  std::vector<std::string> state_names(size_t index) const;
  // Every state name any parameter has, in first-seen order (for tools and summaries).
  std::vector<std::string> all_state_names() const;
  // Null until the parameter's first step. Reads the skips of step(skip) first (a device sync
  // when there are any since the last read).
  const ParameterState* state(size_t index) const;
  // Replaces parameter `index`'s state (a checkpoint's or a healthy replica's): the names must be
  // its algorithm's and every tensor shaped like the parameter; step 0 clears it.
  void set_state(size_t index, ParameterState state);

 private:
  std::string name_;
  std::vector<NamedParameter> parameters_;
  std::vector<ParameterGroup> groups_;
  std::vector<size_t> group_index_;  // per parameter
  // Mutable: state() settles the skips of step(skip) into the step counts it returns.
  mutable std::vector<std::optional<ParameterState>> states_;
  // Per parameter, the skipped steps its host count still includes (device 0-d float32); and
  // whether any may be non-zero.
  mutable std::vector<at::Tensor> uncounted_skips_;
  mutable bool skips_unsettled_ = false;
  void settle_skips() const;
  void count_skip(const std::vector<Slot>& slots, const at::Tensor& skip, bool on_device);
  std::unordered_map<std::string, size_t> by_name_;
  std::unordered_map<const void*, size_t> by_tensor_;
  double lr_ = 0;
  double weight_decay_ = 0;
  // keep_scalars_on_device: the device, each group's lr there, each parameter's step count there
  // (made at its first step there) and the parameters the last step() stepped.
  std::optional<at::Device> scalar_device_;
  std::vector<at::Tensor> device_lrs_;
  std::vector<at::Tensor> device_steps_;
  std::vector<size_t> last_stepped_;
};

}  // namespace loom::optim
