#include "loom/models/mtp.h"

#include <ATen/ATen.h>

#include "loom/core/check.h"
#include "loom/protocols/causal_lm.h"

namespace loom::models {

MtpTargets mtp_targets(const at::Tensor& inputs, const at::Tensor& labels,
                       const at::Tensor& documents, int64_t depths) {
  LOOM_CHECK(inputs.dim() == 2 && labels.sizes() == inputs.sizes() && depths >= 1,
             "multi-token prediction needs [b, s] inputs and labels, got ", inputs.sizes(), " and ",
             labels.sizes());
  LOOM_CHECK(!documents.defined() || documents.sizes() == inputs.sizes(), "documents ",
             documents.sizes(), " for inputs ", inputs.sizes());
  const int64_t seq = inputs.size(1);
  std::vector<at::Tensor> tokens, targets;
  for (int64_t k = 1; k <= depths; ++k) {
    at::Tensor shifted = at::zeros_like(inputs);
    at::Tensor shifted_labels = at::full_like(labels, kIgnoreIndex);
    const int64_t kept = seq - k;  // positions whose token k ahead is in the row
    if (kept > 0) {
      at::Tensor ahead = inputs.narrow(1, k, kept);
      at::Tensor ahead_labels = labels.narrow(1, k, kept);
      if (documents.defined()) {
        const at::Tensor same = documents.narrow(1, k, kept).eq(documents.narrow(1, 0, kept));
        ahead = at::where(same, ahead, at::zeros_like(ahead));
        ahead_labels = at::where(same, ahead_labels, at::full_like(ahead_labels, kIgnoreIndex));
      }
      shifted.narrow(1, 0, kept).copy_(ahead);
      shifted_labels.narrow(1, 0, kept).copy_(ahead_labels);
    }
    tokens.push_back(shifted);
    targets.push_back(shifted_labels);
  }
  return {at::stack(tokens), at::stack(targets)};
}

at::Tensor depths_side_by_side(const std::vector<at::Tensor>& per_depth) {
  return at::cat(per_depth, 1);
}

at::Tensor depths_apart(const at::Tensor& side_by_side, int64_t depths) {
  const int64_t rows = side_by_side.size(0), width = side_by_side.size(1);
  LOOM_CHECK(depths >= 1 && width % depths == 0, "a [", rows, ", ", width,
             "] tensor does not hold ", depths, " depths side by side");
  return side_by_side.view({rows, depths, width / depths}).transpose(0, 1);
}

at::Tensor mtp_loss_sum(const LossSum& loss, const at::Tensor& output, const at::Tensor& labels,
                        int64_t depths, double scale, std::vector<at::Tensor>* depth_sums) {
  const int64_t rows = labels.size(0), seq = output.size(1);
  LOOM_CHECK(output.size(0) == (depths + 1) * rows && labels.size(1) == (depths + 1) * seq,
             "multi-token prediction over ", depths, " depths: logits ", output.sizes(),
             " and labels ", labels.sizes(), " do not match");
  const at::Tensor by_depth = depths_apart(labels, depths + 1);
  at::Tensor total = loss(output.narrow(0, 0, rows), by_depth[0].contiguous());
  at::Tensor ahead;
  for (int64_t k = 1; k <= depths; ++k) {
    const at::Tensor target = by_depth[k].contiguous();
    const at::Tensor sum = loss(output.narrow(0, k * rows, rows), target);
    ahead = ahead.defined() ? ahead + sum : sum;
    if (depth_sums != nullptr) {
      const at::Tensor count = target.ne(kIgnoreIndex).sum().to(at::kFloat);
      depth_sums->push_back(at::stack({sum.detach().to(at::kFloat), count.to(sum.device())}));
    }
  }
  return total + ahead * (scale / static_cast<double>(depths));
}

}  // namespace loom::models
