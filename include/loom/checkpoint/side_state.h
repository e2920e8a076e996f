// State a run keeps beside each parameter outside its optimizer, which a checkpoint must carry
// for an exact resume: a semi-synchronous replica group's period start (DiLoCo's global
// parameters) and DiLoCo's outer momentum. Each is one tensor per parameter, shaped and placed
// like it, so it reshards across layouts as the optimizer's state does.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::checkpoint {

struct ParameterSideState {
  // Saved as "<name>.<parameter name>" (e.g. "ft.outer_momentum.layers.0.attention.wq.weight").
  std::string name;
  // The loadable part (checkpoint.exclude_from_loading) it is loaded with: "model" or
  // "optimizer".
  std::string part;
  // The tensors to save after step `step`, one per parameter in the targets' order; none when
  // there is nothing to keep at that step.
  std::function<std::vector<at::Tensor>(int64_t step)> to_save;
  // Called once at load: the saved tensors (one per parameter), or none when the checkpoint has
  // none (saved without it, by another mode, or with its part excluded).
  std::function<void(std::vector<at::Tensor>)> restore;
};

}  // namespace loom::checkpoint
