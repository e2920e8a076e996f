#include "loom/protocols/forward_hooks.h"

#include <algorithm>

namespace loom::models {

void ForwardHookTable::set(const std::string& module, const std::string& owner,
                           ForwardHooks hooks) {
  auto& owners = hooks_[module];
  auto it = std::find_if(owners.begin(), owners.end(),
                         [&](const auto& entry) { return entry.first == owner; });
  if (hooks.empty()) {
    if (it != owners.end()) owners.erase(it);
    if (owners.empty()) hooks_.erase(module);
  } else if (it != owners.end()) {
    it->second = std::move(hooks);
  } else {
    owners.emplace_back(owner, std::move(hooks));
  }
}

at::Tensor ForwardHookTable::run(const std::string& module, const at::Tensor& input,
                                 const std::function<at::Tensor(const at::Tensor&)>& body) const {
  auto found = hooks_.find(module);
  if (found == hooks_.end()) return body(input);
  const auto& owners = found->second;
  at::Tensor x = input;
  for (const auto& [owner, hooks] : owners) {
    if (hooks.before) hooks.before();
    if (hooks.input) x = hooks.input(x);
  }
  at::Tensor out = body(x);
  for (const auto& [owner, hooks] : owners) {
    if (hooks.after) out = hooks.after(out);
  }
  return out;
}

}  // namespace loom::models
