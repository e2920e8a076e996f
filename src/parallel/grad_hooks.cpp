#include "loom/parallel/grad_hooks.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace loom::parallel {
namespace {

// LibTorch keeps one post-accumulate-grad hook per tensor; this one fans out to many.
class CallbackList : public torch::autograd::PostAccumulateGradHook {
 public:
  void operator()(const torch::autograd::Variable& /*tensor*/) override {
    // A copy: a callback may remove hooks of its own.
    auto callbacks = callbacks_;
    for (auto& entry : callbacks) entry.second();
  }
  void add(const void* owner, std::function<void()> callback) {
    callbacks_.emplace_back(owner, std::move(callback));
  }
  void remove(const void* owner) {
    callbacks_.erase(std::remove_if(callbacks_.begin(), callbacks_.end(),
                                    [owner](const auto& e) { return e.first == owner; }),
                     callbacks_.end());
  }
  bool empty() const { return callbacks_.empty(); }

 private:
  std::vector<std::pair<const void*, std::function<void()>>> callbacks_;
};

CallbackList* callback_list(const at::Tensor& leaf) {
  auto& hook = torch::autograd::impl::post_acc_grad_hooks(leaf);
  return dynamic_cast<CallbackList*>(hook.get());
}

}  // namespace

void add_gradient_ready_hook(const at::Tensor& leaf, const void* owner,
                             std::function<void()> callback) {
  CallbackList* list = callback_list(leaf);
  if (list == nullptr) {
    auto fresh = std::make_unique<CallbackList>();
    list = fresh.get();
    torch::autograd::impl::set_post_acc_grad_hooks(leaf, std::move(fresh));
  }
  list->add(owner, std::move(callback));
}

void remove_gradient_ready_hooks(const at::Tensor& leaf, const void* owner) {
  CallbackList* list = callback_list(leaf);
  if (list == nullptr) return;
  list->remove(owner);
  if (list->empty()) torch::autograd::impl::set_post_acc_grad_hooks(leaf, nullptr);
}

}  // namespace loom::parallel
