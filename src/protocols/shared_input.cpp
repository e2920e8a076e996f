// SharedInputScope (protocols/shared_input.h): a per-thread stack of open scopes.
#include "loom/protocols/shared_input.h"

#include <utility>

namespace loom::models {
namespace {

thread_local SharedInputScope* innermost = nullptr;

}  // namespace

SharedInputScope::SharedInputScope(const at::Tensor& input)
    : input_(input),
      version_(input.defined() ? static_cast<int64_t>(input._version()) : -1),
      outer_(innermost) {
  innermost = this;
}

SharedInputScope::~SharedInputScope() {
  innermost = outer_;
}

// The same tensor object (not another view of its storage), not written since the scope opened.
SharedInputScope* SharedInputScope::declared_for(const at::Tensor& input) {
  if (!input.defined()) return nullptr;
  for (SharedInputScope* s = innermost; s != nullptr; s = s->outer_) {
    if (s->input_.defined() && s->input_.unsafeGetTensorImpl() == input.unsafeGetTensorImpl() &&
        static_cast<int64_t>(input._version()) == s->version_) {
      return s;
    }
  }
  return nullptr;
}

std::shared_ptr<void> shared_input_value(const at::Tensor& input, const std::string& key) {
  SharedInputScope* scope = SharedInputScope::declared_for(input);
  if (scope == nullptr) return nullptr;
  auto it = scope->kept_.find(key);
  return it == scope->kept_.end() ? nullptr : it->second;
}

bool keep_shared_input_value(const at::Tensor& input, const std::string& key,
                             std::shared_ptr<void> value) {
  SharedInputScope* scope = SharedInputScope::declared_for(input);
  if (scope == nullptr) return false;
  scope->kept_[key] = std::move(value);
  return true;
}

}  // namespace loom::models
