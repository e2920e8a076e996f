#include "loom/models/kernels/swiglu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include "dispatch.h"
#include "loom/models/kernels/cuda.h"
#include "swiglu_kernel.h"

namespace loom::models::kernels {
namespace {

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b) {
    RECORD_FUNCTION("loom::kernel_swiglu", std::vector<c10::IValue>{});  // named in profiles
    ctx->save_for_backward({a, b});
    if (a.is_cuda()) return cuda_kernels()->swiglu_forward(a, b);
    at::Tensor out = at::empty_like(a);
    const float* pa = a.const_data_ptr<float>();
    const float* pb = b.const_data_ptr<float>();
    float* po = out.mutable_data_ptr<float>();
    static const auto fn = LOOM_PICK_KERNEL(swiglu_forward);
    at::parallel_for(0, a.numel(), kKernelGrain, [&](int64_t begin, int64_t end) {
      fn(pa + begin, pb + begin, po + begin, end - begin);
    });
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("loom::kernel_swiglu_backward", std::vector<c10::IValue>{});
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& a = saved[0];
    const at::Tensor& b = saved[1];
    const at::Tensor grad = grads[0].contiguous();
    if (a.is_cuda()) {
      auto [grad_a, grad_b] = cuda_kernels()->swiglu_backward(grad, a, b);
      return {grad_a, grad_b};
    }
    at::Tensor grad_a = at::empty_like(a);
    at::Tensor grad_b = at::empty_like(b);
    const float* pg = grad.const_data_ptr<float>();
    const float* pa = a.const_data_ptr<float>();
    const float* pb = b.const_data_ptr<float>();
    float* pga = grad_a.mutable_data_ptr<float>();
    float* pgb = grad_b.mutable_data_ptr<float>();
    static const auto fn = LOOM_PICK_KERNEL(swiglu_backward);
    at::parallel_for(0, a.numel(), kKernelGrain, [&](int64_t begin, int64_t end) {
      fn(pg + begin, pa + begin, pb + begin, pga + begin, pgb + begin, end - begin);
    });
    return {grad_a, grad_b};
  }
};

}  // namespace

bool swiglu_is_fused(const at::Tensor& a, const at::Tensor& b) {
  if (enabled_cuda_kernels() != nullptr && cuda_kernel_tensor(a) && cuda_kernel_tensor(b)) {
    return a.device() == b.device() && a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes();
  }
  return a.device().is_cpu() && b.device().is_cpu() && a.scalar_type() == at::kFloat &&
         b.scalar_type() == at::kFloat && a.sizes() == b.sizes() && a.is_contiguous() &&
         b.is_contiguous() && !a.is_complex();
}

at::Tensor swiglu(const at::Tensor& a, const at::Tensor& b) {
  if (!swiglu_is_fused(a, b)) return at::silu(a) * b;
  return SwigluFunction::apply(a, b);
}

}  // namespace loom::models::kernels
