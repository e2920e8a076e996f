// What a model converter does beyond replacing layers, at the trainer's moments (torchtitan's
// ModelConverter.post_optimizer_hook): float8's precomputed all-gather scales are refreshed here
// after each optimizer step, not inside FSDP's gradient sync, so FSDP knows no recipe.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace loom::models {

class ConverterHooks {
 public:
  virtual ~ConverterHooks() = default;
  virtual std::string name() const = 0;
  // After every change of the weights: each optimizer step, a checkpoint load, healing from a
  // replica group. May be a collective: every rank calls it at the same point.
  virtual void after_weights_change() = 0;
};

using ConverterHookList = std::vector<std::shared_ptr<ConverterHooks>>;

inline void after_weights_change(const ConverterHookList& hooks) {
  for (const auto& hook : hooks) hook->after_weights_change();
}

}  // namespace loom::models
