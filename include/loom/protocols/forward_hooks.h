// Hooks around a submodule's forward: how parallel wrappers act on a model that does not know it
// is sharded, the way PyTorch's module hooks serve FSDP2 and tensor parallelism. Several owners
// ("fsdp", "tp") may hook the same module; their hooks run in the order they were set.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loom::models {

struct ForwardHooks {
  std::function<void()> before;                                      // e.g. gather parameters
  std::function<at::Tensor(const at::Tensor& input)> input;          // redistribute the input
  std::function<at::Tensor(const at::Tensor& output)> after;         // redistribute / hook output
  bool empty() const { return !before && !input && !after; }
};

// The hooks of one model, by module name and owner.
class ForwardHookTable {
 public:
  // Empty `hooks` removes the owner's hooks from `module`.
  void set(const std::string& module, const std::string& owner, ForwardHooks hooks);
  // body(input') with every owner's `before` and `input` hooks first and `after` hooks last.
  at::Tensor run(const std::string& module, const at::Tensor& input,
                 const std::function<at::Tensor(const at::Tensor&)>& body) const;

 private:
  std::map<std::string, std::vector<std::pair<std::string, ForwardHooks>>> hooks_;
};

}  // namespace loom::models
