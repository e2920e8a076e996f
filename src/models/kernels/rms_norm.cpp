#include "loom/models/kernels/rms_norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "dispatch.h"
#include "rms_norm_kernel.h"

namespace loom::models::kernels {
namespace {

// Rows per block of grad_weight's partial sums: the blocks, not the threads, fix the order in
// which rows are added, so the result is the same on any number of threads.
constexpr int64_t kRowsPerBlock = 64;

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, double eps) {
    RECORD_FUNCTION("loom::kernel_rms_norm", std::vector<c10::IValue>{});  // named in profiles
    const int64_t dim = input.size(-1);
    const int64_t rows = input.numel() / dim;
    at::Tensor out = at::empty_like(input);
    at::Tensor rstd = at::empty({rows}, input.options());
    const float* px = input.const_data_ptr<float>();
    const float* pw = weight.const_data_ptr<float>();
    float* py = out.mutable_data_ptr<float>();
    float* pr = rstd.mutable_data_ptr<float>();
    static const auto fn = LOOM_PICK_KERNEL(rms_norm_forward);
    const auto feps = static_cast<float>(eps);
    at::parallel_for(0, rows, rows_per_task(dim), [&](int64_t begin, int64_t end) {
      fn(px + begin * dim, pw, py + begin * dim, pr + begin, end - begin, dim, feps);
    });
    ctx->save_for_backward({input, weight, rstd});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("loom::kernel_rms_norm_backward", std::vector<c10::IValue>{});
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& rstd = saved[2];
    const at::Tensor grad = grads[0].contiguous();
    const int64_t dim = input.size(-1);
    const int64_t rows = input.numel() / dim;
    const bool want_x = ctx->needs_input_grad(0);
    const bool want_w = ctx->needs_input_grad(1);
    at::Tensor grad_x = want_x ? at::empty_like(input) : at::Tensor();
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    at::Tensor partial = want_w ? at::zeros({blocks, dim}, weight.options()) : at::Tensor();
    const float* pg = grad.const_data_ptr<float>();
    const float* px = input.const_data_ptr<float>();
    const float* pw = weight.const_data_ptr<float>();
    const float* pr = rstd.const_data_ptr<float>();
    float* pdx = want_x ? grad_x.mutable_data_ptr<float>() : nullptr;
    float* pdw = want_w ? partial.mutable_data_ptr<float>() : nullptr;
    static const auto fn = LOOM_PICK_KERNEL(rms_norm_backward);
    const int64_t grain = std::max<int64_t>(1, rows_per_task(dim) / kRowsPerBlock);
    at::parallel_for(0, blocks, grain, [&](int64_t first, int64_t last) {
      for (int64_t b = first; b < last; ++b) {
        const int64_t row = b * kRowsPerBlock;
        const int64_t count = std::min(kRowsPerBlock, rows - row);
        fn(pg + row * dim, px + row * dim, pw, pr + row, pdx ? pdx + row * dim : nullptr,
           pdw ? pdw + b * dim : nullptr, count, dim);
      }
    });
    at::Tensor grad_w;
    if (want_w) {  // the blocks' partial sums, added in block order
      grad_w = at::empty({dim}, weight.options());
      float* out = grad_w.mutable_data_ptr<float>();
      std::copy(pdw, pdw + dim, out);
      for (int64_t b = 1; b < blocks; ++b) {
        for (int64_t i = 0; i < dim; ++i) out[i] += pdw[b * dim + i];
      }
    }
    return {grad_x, grad_w, at::Tensor()};
  }
};

}  // namespace

bool rms_norm_is_fused(const at::Tensor& input, const at::Tensor& weight) {
  return input.device().is_cpu() && weight.device().is_cpu() &&
         input.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
         input.dim() >= 1 && input.numel() > 0 && weight.dim() == 1 &&
         weight.size(0) == input.size(-1) && input.is_contiguous() && weight.is_contiguous();
}

at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps) {
  if (!rms_norm_is_fused(input, weight)) {
    return at::rms_norm(input, {input.size(-1)}, weight, eps);
  }
  return RmsNormFunction::apply(input, weight, eps);
}

}  // namespace loom::models::kernels
