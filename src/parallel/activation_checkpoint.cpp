#include "loom/parallel/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <array>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"

namespace loom::parallel {
namespace {

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

// Applies an autocast state while alive, then restores the previous one.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& target) : previous_(AutocastState::capture()) {
    target.apply();
  }
  ~AutocastScope() { previous_.apply(); }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState previous_;
};

// The backward node of a checkpointed region: recompute, then backpropagate through the
// recomputed graph (parameters get their gradients accumulated there, as in PyTorch's
// reentrant checkpoint).
class CheckpointBackward : public torch::autograd::Node {
 public:
  CheckpointBackward(CheckpointedFn fn, at::Tensor input)
      : fn_(std::move(fn)), input_(std::move(input)), autocast_(AutocastState::capture()) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor input = input_.detach().requires_grad_(true);
    at::Tensor output;
    {
      torch::autograd::AutoGradMode enable_grad(true);
      AutocastScope same_autocast(autocast_);
      output = fn_(input);
    }
    torch::autograd::backward({output}, {grads.at(0)});
    input_.reset();  // the region runs backward once
    return {input.grad()};
  }

  std::string name() const override { return "loom::CheckpointBackward"; }

 private:
  CheckpointedFn fn_;
  at::Tensor input_;
  AutocastState autocast_;
};

}  // namespace

at::Tensor checkpoint(const CheckpointedFn& fn, const at::Tensor& input) {
  if (!torch::autograd::GradMode::is_enabled()) {
    return fn(input);
  }
  at::Tensor output;
  {
    torch::autograd::AutoGradMode no_grad(false);
    output = fn(input);
  }
  auto node = std::shared_ptr<CheckpointBackward>(new CheckpointBackward(fn, input.detach()),
                                                  torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(output, node);
  return output;
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
