#include "loom/parallel/grad_hooks.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace loom::parallel {
namespace {

class CallbackHook : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit CallbackHook(std::function<void()> callback) : callback_(std::move(callback)) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override { callback_(); }

 private:
  std::function<void()> callback_;
};

}  // namespace

void set_gradient_ready_hook(const at::Tensor& leaf, std::function<void()> callback) {
  torch::autograd::impl::set_post_acc_grad_hooks(
      leaf, std::make_unique<CallbackHook>(std::move(callback)));
}

void clear_gradient_ready_hook(const at::Tensor& leaf) {
  torch::autograd::impl::set_post_acc_grad_hooks(leaf, nullptr);
}

}  // namespace loom::parallel
