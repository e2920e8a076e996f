#include "loom/models/kernels/cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "cross_entropy_kernel.h"
#include "dispatch.h"
#include "loom/core/check.h"
#include "loom/models/kernels/cuda.h"

namespace loom::models::kernels {
namespace {

// The same error ATen gives, before any row is touched.
void check_labels(const at::Tensor& labels, int64_t vocab, int64_t ignore_index) {
  const int64_t* p = labels.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < labels.numel(); ++i) {
    LOOM_CHECK(p[i] == ignore_index || (p[i] >= 0 && p[i] < vocab), "cross_entropy: label ", p[i],
               " at position ", i, " is out of bounds for a vocabulary of ", vocab,
               " (expected 0..", vocab - 1, " or the ignore index ", ignore_index, ")");
  }
}

// loom's CUDA kernel: logits read in their own dtype (no float32 copy), the loss in float32, and
// the gradient written over the logits where the caller allows it.
class CudaCrossEntropyFunction : public torch::autograd::Function<CudaCrossEntropyFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& labels, int64_t ignore_index, bool overwrite_logits) {
    RECORD_FUNCTION("loom::kernel_cross_entropy", std::vector<c10::IValue>{});
    auto [loss, lse] = cuda_kernels()->cross_entropy_forward(logits, labels, ignore_index);
    ctx->save_for_backward({logits, labels, lse});
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["overwrite_logits"] = overwrite_logits;
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("loom::kernel_cross_entropy_backward", std::vector<c10::IValue>{});
    const bool overwrite = ctx->saved_data["overwrite_logits"].toBool();
    // A second pass through a node whose first wrote over its logits would read a gradient as
    // logits: a graph backpropagated twice is built under a RepeatedBackwardScope (models/
    // loss.cpp), which keeps them.
    LOOM_CHECK(!overwrite || ctx->saved_data.count("overwritten") == 0,
               "the fused cross-entropy's logits hold its gradient from an earlier backward pass: "
               "build a graph that is backpropagated twice under a RepeatedBackwardScope");
    const auto saved = ctx->get_saved_variables();
    // The scale stays on the device: the kernel reads it there, no host waits.
    at::Tensor grad = cuda_kernels()->cross_entropy_backward(
        saved[0], saved[1], saved[2], grads[0], ctx->saved_data["ignore_index"].toInt(), overwrite);
    if (overwrite) ctx->saved_data["overwritten"] = true;
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& labels) {
    RECORD_FUNCTION("loom::kernel_cross_entropy", std::vector<c10::IValue>{});
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    at::Tensor row_loss = at::empty({rows}, logits.options());
    at::Tensor logsumexp = at::empty({rows}, logits.options());
    const float* px = logits.const_data_ptr<float>();
    const int64_t* pl = labels.const_data_ptr<int64_t>();
    float* ploss = row_loss.mutable_data_ptr<float>();
    float* plse = logsumexp.mutable_data_ptr<float>();
    static const auto fn = LOOM_PICK_KERNEL(cross_entropy_forward);
    at::parallel_for(0, rows, rows_per_task(vocab), [&](int64_t begin, int64_t end) {
      fn(px + begin * vocab, pl + begin, ploss + begin, plse + begin, end - begin, vocab);
    });
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) sum += ploss[r];
    ctx->save_for_backward({logits, labels, logsumexp});
    return at::full({}, sum, logits.options());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("loom::kernel_cross_entropy_backward", std::vector<c10::IValue>{});
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const at::Tensor& labels = saved[1];
    const at::Tensor& logsumexp = saved[2];
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    // The loss is a scalar: its incoming gradient is one number (a host read, no device here).
    const auto scale = grads[0].item<float>();
    at::Tensor grad = at::empty_like(logits);
    const float* px = logits.const_data_ptr<float>();
    const int64_t* pl = labels.const_data_ptr<int64_t>();
    const float* plse = logsumexp.const_data_ptr<float>();
    float* pg = grad.mutable_data_ptr<float>();
    static const auto fn = LOOM_PICK_KERNEL(cross_entropy_backward);
    at::parallel_for(0, rows, rows_per_task(vocab), [&](int64_t begin, int64_t end) {
      fn(px + begin * vocab, pl + begin, plse + begin, scale, pg + begin * vocab, end - begin,
         vocab);
    });
    return {grad, at::Tensor()};
  }
};

}  // namespace

namespace {

bool cross_entropy_takes_cuda(const at::Tensor& logits, const at::Tensor& labels) {
  return enabled_cuda_kernels() != nullptr && cuda_kernel_tensor(logits) && logits.dim() == 2 &&
         labels.device() == logits.device() && labels.scalar_type() == at::kLong &&
         labels.dim() == 1 && labels.size(0) == logits.size(0) && labels.is_contiguous();
}

}  // namespace

bool cross_entropy_is_fused(const at::Tensor& logits, const at::Tensor& labels,
                            int64_t ignore_index) {
  if (cross_entropy_takes_cuda(logits, labels)) return true;
  return logits.device().is_cpu() && labels.device().is_cpu() &&
         logits.scalar_type() == at::kFloat && labels.scalar_type() == at::kLong &&
         logits.dim() == 2 && labels.dim() == 1 && labels.size(0) == logits.size(0) &&
         logits.size(1) > 0 && logits.is_contiguous() && labels.is_contiguous() && ignore_index < 0;
}

at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels,
                             int64_t ignore_index, bool overwrite_logits) {
  if (cross_entropy_takes_cuda(logits, labels)) {
    return CudaCrossEntropyFunction::apply(logits, labels, ignore_index, overwrite_logits);
  }
  if (!cross_entropy_is_fused(logits, labels, ignore_index)) {
    return at::cross_entropy_loss(logits, labels, /*weight=*/{}, at::Reduction::Sum, ignore_index);
  }
  check_labels(labels, logits.size(1), ignore_index);
  return CrossEntropyFunction::apply(logits, labels);
}

}  // namespace loom::models::kernels
