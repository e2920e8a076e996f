#include "loom/parallel/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <array>
#include <unordered_set>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"

namespace loom::parallel {
namespace {

enum class RegionPhase { kNone, kForward, kRecompute };
thread_local RegionPhase region_phase = RegionPhase::kNone;

// Sets the thread's region phase while alive (regions may nest), then restores the previous one.
class PhaseScope {
 public:
  explicit PhaseScope(RegionPhase phase) : previous_(region_phase) { region_phase = phase; }
  ~PhaseScope() { region_phase = previous_; }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  RegionPhase previous_;
};

// The autocast state of the forward (thread-local), so that the recompute in backward runs the
// same function: without it, a bf16-autocast forward would be recomputed in float32 and
// backward would differentiate a different function.
class AutocastState {
 public:
  static AutocastState capture() {
    AutocastState s;
    for (size_t i = 0; i < kTypes.size(); ++i) {
      s.enabled_[i] = at::autocast::is_autocast_enabled(kTypes[i]);
      s.dtype_[i] = at::autocast::get_autocast_dtype(kTypes[i]);
    }
    return s;
  }
  void apply() const {
    for (size_t i = 0; i < kTypes.size(); ++i) {
      at::autocast::set_autocast_enabled(kTypes[i], enabled_[i]);
      at::autocast::set_autocast_dtype(kTypes[i], dtype_[i]);
    }
  }

 private:
  static constexpr std::array<at::DeviceType, 2> kTypes = {at::kCPU, at::kCUDA};
  std::array<bool, 2> enabled_{};
  std::array<at::ScalarType, 2> dtype_{};
};

// Applies an autocast state while alive, then restores the previous one. It caches no cast:
// LibTorch's cache of cast weights is process-wide and emptied only when the outermost autocast
// region ends, and a recompute runs in backward, outside any region, so a weight cast cached
// there would outlive the optimizer step and serve the next forward a stale copy.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& target)
      : previous_(AutocastState::capture()),
        previous_cache_(at::autocast::is_autocast_cache_enabled()) {
    target.apply();
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastScope() {
    previous_.apply();
    at::autocast::set_autocast_cache_enabled(previous_cache_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState previous_;
  bool previous_cache_;
};

// The backward node of a checkpointed region. Its inputs in the graph are the region's input
// and its parameters, so the engine sees every parameter behind it: a backward restricted to
// some tensors (autograd::grad for an input gradient only, or backward(inputs = parameters) for
// weight gradients only, as zero-bubble pipeline schedules do) reaches exactly those. apply()
// recomputes the region and differentiates it, non-reentrantly, for the outputs this graph task
// needs; the parameters' gradients flow back as the node's outputs and are accumulated (and
// their gradient hooks run) by the outer backward, as for any other node.
// The recomputed graph of `output` may only end in `input` and `parameters`: a leaf that needs
// a gradient but was not listed would silently get none (the outer backward cannot see it).
void check_leaves_are_listed(const at::Tensor& output, const at::Tensor& input,
                             const std::vector<at::Tensor>& parameters) {
  std::unordered_set<const c10::TensorImpl*> listed{input.unsafeGetTensorImpl()};
  for (const auto& p : parameters) listed.insert(p.unsafeGetTensorImpl());
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  if (output.grad_fn()) todo.push_back(output.grad_fn().get());
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* leaf = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      LOOM_CHECK(listed.count(leaf->variable.unsafeGetTensorImpl()) > 0,
                 "activation checkpoint: the checkpointed function reads a tensor of shape ",
                 leaf->variable.sizes(), " that needs a gradient but is not among the ",
                 parameters.size(), " parameters passed to checkpoint(); it would get none");
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function) todo.push_back(edge.function.get());
    }
  }
}

class CheckpointBackward : public torch::autograd::Node {
 public:
  CheckpointBackward(CheckpointedFn fn, at::Tensor input, std::vector<at::Tensor> parameters)
      : fn_(std::move(fn)),
        input_(std::move(input)),
        parameters_(std::move(parameters)),
        autocast_(AutocastState::capture()) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    LOOM_CHECK(input_.defined(), "a checkpointed region ran backward twice");
    torch::autograd::variable_list out(num_outputs());
    std::vector<at::Tensor> wanted;
    std::vector<size_t> slot;
    at::Tensor input = input_.detach().requires_grad_(true);
    if (task_should_compute_output(0)) {
      wanted.push_back(input);
      slot.push_back(0);
    }
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (!task_should_compute_output(i + 1)) continue;
      wanted.push_back(parameters_[i]);
      slot.push_back(i + 1);
    }
    if (!wanted.empty() && grads.at(0).defined()) {
      at::Tensor output;
      {
        torch::autograd::AutoGradMode enable_grad(true);
        AutocastScope same_autocast(autocast_);
        PhaseScope recompute(RegionPhase::kRecompute);
        output = fn_(input);
      }
      check_leaves_are_listed(output, input, parameters_);
      auto computed = torch::autograd::grad({output}, wanted, {grads.at(0)},
                                            /*retain_graph=*/false, /*create_graph=*/false,
                                            /*allow_unused=*/true);
      for (size_t k = 0; k < slot.size(); ++k) out[slot[k]] = std::move(computed[k]);
    }
    return out;
  }

  std::string name() const override { return "loom::CheckpointBackward"; }
  // The engine calls this after apply() unless the graph is retained (zero bubble's I keeps it
  // for the W that follows).
  void release_variables() override {
    input_.reset();
    parameters_.clear();
  }

 private:
  CheckpointedFn fn_;
  at::Tensor input_;
  std::vector<at::Tensor> parameters_;
  AutocastState autocast_;
};

}  // namespace

at::Tensor checkpoint(const CheckpointedFn& fn, const at::Tensor& input,
                      const std::vector<at::Tensor>& parameters) {
  if (!torch::autograd::GradMode::is_enabled()) {
    return fn(input);
  }
  at::Tensor output;
  {
    torch::autograd::AutoGradMode no_grad(false);
    PhaseScope first_forward(RegionPhase::kForward);
    output = fn(input);
  }
  auto node = std::shared_ptr<CheckpointBackward>(
      new CheckpointBackward(fn, input.detach(), parameters), torch::autograd::deleteNode);
  torch::autograd::variable_list edges_of{input};
  edges_of.insert(edges_of.end(), parameters.begin(), parameters.end());
  node->set_next_edges(torch::autograd::collect_next_edges(edges_of));
  torch::autograd::set_history(output, node);
  return output;
}

bool builds_backward_graph() {
  return region_phase != RegionPhase::kForward && torch::autograd::GradMode::is_enabled();
}

bool in_training_forward() {
  if (region_phase == RegionPhase::kRecompute) return false;
  return region_phase == RegionPhase::kForward || torch::autograd::GradMode::is_enabled();
}

std::vector<bool> blocks_to_checkpoint(const std::string& mode, const std::string& selective_option,
                                       int64_t n_blocks) {
  std::vector<bool> wrap(static_cast<size_t>(n_blocks), false);
  if (mode == "none") {
    return wrap;
  }
  int64_t every = 1;
  if (mode == "selective") {
    if (selective_option == "op") {
      static bool warned = false;
      if (!warned) {
        warned = true;
        log::get("ac")->warn(
            "activation_checkpoint.selective_ac_option = 'op' (per-operator policy) is not "
            "implemented; checkpointing every block (mode 'full') instead");
      }
    } else {
      auto parsed = strings::parse_int(selective_option);
      LOOM_CHECK_AS(
          InputError, parsed && *parsed >= 1,
          "activation_checkpoint.selective_ac_option must be 'op' or a positive integer, got '",
          selective_option, "'");
      every = *parsed;
    }
  } else if (mode == "memory_budget") {
    LOOM_THROW(InputError,
               "activation_checkpoint.mode = 'memory_budget' needs torch.compile; use none, full "
               "or selective");
  } else {
    LOOM_CHECK_AS(InputError, mode == "full", "activation_checkpoint.mode: unknown mode '", mode,
                  "'");
  }
  for (int64_t i = 0; i < n_blocks; ++i) {
    wrap[static_cast<size_t>(i)] = (i + 1) % every == 0;
  }
  return wrap;
}

}  // namespace loom::parallel
