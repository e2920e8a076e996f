#include "loom/models/kernels/rms_norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <utility>

#include "dispatch.h"
#include "loom/models/kernels/cuda.h"
#include "rms_norm_kernel.h"

namespace loom::models::kernels {
namespace {

// Rows per block of grad_weight's partial sums: the blocks, not the threads, fix the order in
// which rows are added, so the result is the same on any number of threads.
constexpr int64_t kRowsPerBlock = 64;

// RMSNorm's output, and one rstd per row into `rstd`.
at::Tensor norm_forward(const at::Tensor& input, const at::Tensor& weight, double eps,
                        at::Tensor& rstd) {
  RECORD_FUNCTION("loom::kernel_rms_norm", std::vector<c10::IValue>{});  // named in profiles
  if (input.is_cuda()) {
    auto outputs = cuda_kernels()->rms_norm_forward(input, at::Tensor(), weight, eps);
    rstd = outputs.rstd;
    return outputs.y;
  }
  const int64_t dim = input.size(-1);
  const int64_t rows = input.numel() / dim;
  at::Tensor out = at::empty_like(input);
  rstd = at::empty({rows}, input.options());
  const float* px = input.const_data_ptr<float>();
  const float* pw = weight.const_data_ptr<float>();
  float* py = out.mutable_data_ptr<float>();
  float* pr = rstd.mutable_data_ptr<float>();
  static const auto fn = LOOM_PICK_KERNEL(rms_norm_forward);
  const auto feps = static_cast<float>(eps);
  at::parallel_for(0, rows, rows_per_task(dim), [&](int64_t begin, int64_t end) {
    fn(px + begin * dim, pw, py + begin * dim, pr + begin, end - begin, dim, feps);
  });
  return out;
}

// grad_x (plus grad_residual, where defined) and grad_weight of RMSNorm, each where wanted.
std::pair<at::Tensor, at::Tensor> norm_backward(const at::Tensor& grad, const at::Tensor& input,
                                                const at::Tensor& weight, const at::Tensor& rstd,
                                                const at::Tensor& grad_residual, bool want_x,
                                                bool want_w) {
  RECORD_FUNCTION("loom::kernel_rms_norm_backward", std::vector<c10::IValue>{});
  if (input.is_cuda()) {
    return cuda_kernels()->rms_norm_backward(grad, input, weight, rstd, grad_residual, want_x,
                                             want_w);
  }
  const int64_t dim = input.size(-1);
  const int64_t rows = input.numel() / dim;
  at::Tensor grad_x = want_x ? at::empty_like(input) : at::Tensor();
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  at::Tensor partial = want_w ? at::zeros({blocks, dim}, weight.options()) : at::Tensor();
  const at::Tensor residual =
      want_x && grad_residual.defined() ? grad_residual.contiguous() : at::Tensor();
  const float* pg = grad.const_data_ptr<float>();
  const float* px = input.const_data_ptr<float>();
  const float* pw = weight.const_data_ptr<float>();
  const float* pr = rstd.const_data_ptr<float>();
  const float* pres = residual.defined() ? residual.const_data_ptr<float>() : nullptr;
  float* pdx = want_x ? grad_x.mutable_data_ptr<float>() : nullptr;
  float* pdw = want_w ? partial.mutable_data_ptr<float>() : nullptr;
  static const auto fn = LOOM_PICK_KERNEL(rms_norm_backward);
  const int64_t grain = std::max<int64_t>(1, rows_per_task(dim) / kRowsPerBlock);
  at::parallel_for(0, blocks, grain, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t row = b * kRowsPerBlock;
      const int64_t count = std::min(kRowsPerBlock, rows - row);
      fn(pg + row * dim, px + row * dim, pw, pr + row, pres ? pres + row * dim : nullptr,
         pdx ? pdx + row * dim : nullptr, pdw ? pdw + b * dim : nullptr, count, dim);
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
  return {grad_x, grad_w};
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, double eps) {
    at::Tensor rstd;
    at::Tensor out = norm_forward(input, weight, eps, rstd);
    ctx->save_for_backward({input, weight, rstd});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_x, grad_w] =
        norm_backward(grads[0].contiguous(), saved[0], saved[1], saved[2], at::Tensor(),
                      ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    return {grad_x, grad_w, at::Tensor()};
  }
};

// Backward of both residual norms: the norm's input gradient with the sum's own gradient added
// in the same pass (or only the latter, where the normed output was not used).
std::pair<at::Tensor, at::Tensor> residual_norm_backward(
    torch::autograd::AutogradContext* ctx, const torch::autograd::variable_list& grads, bool want_x,
    bool want_w) {
  const auto saved = ctx->get_saved_variables();
  if (!grads[1].defined()) return {grads[0], at::Tensor()};
  return norm_backward(grads[1].contiguous(), saved[0], saved[1], saved[2], grads[0], want_x,
                       want_w);
}

// (x, rms_norm(x)): x passes through to the residual path, so that its two uses reach backward
// here, where their gradients are added inside the norm's pass.
class PassThroughRmsNormFunction : public torch::autograd::Function<PassThroughRmsNormFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& weight,
                                                double eps) {
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined: no pass
    at::Tensor rstd;
    at::Tensor out = norm_forward(x, weight, eps, rstd);
    ctx->save_for_backward({x, weight, rstd});
    return {x, out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto [grad_x, grad_w] =
        residual_norm_backward(ctx, grads, ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    return {grad_x, grad_w, at::Tensor()};
  }
};

// (x + delta, rms_norm(x + delta)), the add and the norm in one pass per row.
class AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& delta,
                                                const at::Tensor& weight, double eps) {
    RECORD_FUNCTION("loom::kernel_rms_norm", std::vector<c10::IValue>{});
    ctx->set_materialize_grads(false);
    if (x.is_cuda()) {
      auto outputs = cuda_kernels()->rms_norm_forward(x, delta, weight, eps);
      ctx->save_for_backward({outputs.sum, weight, outputs.rstd});
      return {outputs.sum, outputs.y};
    }
    const int64_t dim = x.size(-1);
    const int64_t rows = x.numel() / dim;
    at::Tensor sum = at::empty_like(x);
    at::Tensor out = at::empty_like(x);
    at::Tensor rstd = at::empty({rows}, x.options());
    const float* px = x.const_data_ptr<float>();
    const float* pd = delta.const_data_ptr<float>();
    const float* pw = weight.const_data_ptr<float>();
    float* ps = sum.mutable_data_ptr<float>();
    float* py = out.mutable_data_ptr<float>();
    float* pr = rstd.mutable_data_ptr<float>();
    const auto feps = static_cast<float>(eps);
    static const auto fn = LOOM_PICK_KERNEL(rms_norm_add_forward);
    at::parallel_for(0, rows, rows_per_task(dim), [&](int64_t begin, int64_t end) {
      fn(px + begin * dim, pd + begin * dim, pw, ps + begin * dim, py + begin * dim, pr + begin,
         end - begin, dim, feps);
    });
    ctx->save_for_backward({sum, weight, rstd});
    return {sum, out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const bool want_sum = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    auto [grad_sum, grad_w] =
        residual_norm_backward(ctx, grads, want_sum, ctx->needs_input_grad(2));
    // d(x + delta) / dx = d(x + delta) / d delta = 1: both get the sum's gradient.
    return {grad_sum, grad_sum, grad_w, at::Tensor()};
  }
};

}  // namespace

namespace {

// loom's CUDA kernels take it: enabled, CUDA tensors on one device, float32 or bfloat16, the
// weight in the input's dtype (a float32 weight on bfloat16 input gives at::rms_norm a float32
// output, which the kernel, writing the input's dtype, would not).
bool rms_norm_takes_cuda(const at::Tensor& input, const at::Tensor& weight) {
  return enabled_cuda_kernels() != nullptr && cuda_kernel_tensor(input) &&
         cuda_kernel_tensor(weight) && weight.device() == input.device() && weight.dim() == 1 &&
         weight.size(0) == input.size(-1) && weight.scalar_type() == input.scalar_type();
}

}  // namespace

bool rms_norm_is_fused(const at::Tensor& input, const at::Tensor& weight) {
  if (rms_norm_takes_cuda(input, weight)) return true;
  return input.device().is_cpu() && weight.device().is_cpu() && input.scalar_type() == at::kFloat &&
         weight.scalar_type() == at::kFloat && input.dim() >= 1 && input.numel() > 0 &&
         weight.dim() == 1 && weight.size(0) == input.size(-1) && input.is_contiguous() &&
         weight.is_contiguous();
}

at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps) {
  if (!rms_norm_is_fused(input, weight)) {
    return at::rms_norm(input, {input.size(-1)}, weight, eps);
  }
  return RmsNormFunction::apply(input, weight, eps);
}

bool residual_rms_norm_is_fused(const at::Tensor& x, const at::Tensor& delta,
                                const at::Tensor& weight) {
  if (!rms_norm_is_fused(x, weight)) return false;
  return !delta.defined() ||
         (delta.device() == x.device() && delta.scalar_type() == x.scalar_type() &&
          delta.sizes() == x.sizes() && delta.is_contiguous());
}

std::pair<at::Tensor, at::Tensor> residual_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                    const at::Tensor& weight, double eps) {
  if (!residual_rms_norm_is_fused(x, delta, weight)) {
    at::Tensor sum = delta.defined() ? x + delta : x;
    return {sum, rms_norm(sum, weight, eps)};
  }
  auto outputs = delta.defined() ? AddRmsNormFunction::apply(x, delta, weight, eps)
                                 : PassThroughRmsNormFunction::apply(x, weight, eps);
  return {outputs[0], outputs[1]};
}

}  // namespace loom::models::kernels
