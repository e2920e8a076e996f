#include "loom/models/loss.h"

#include <ATen/ATen.h>

#include "loom/models/kernels/cross_entropy.h"
#include "loom/protocols/repeated_backward.h"

namespace loom::models {

at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
  const at::Tensor rows = logits.flatten(0, 1);
  const at::Tensor targets = labels.flatten().contiguous();
  if (rows.is_cuda() && kernels::cross_entropy_is_fused(rows, targets, kIgnoreIndex)) {
    // loom's CUDA kernel reads bfloat16 logits as they are and writes their gradient over them:
    // the head's logits serve the loss alone (loss.h). A leaf is someone's data: never
    // overwritten; nor are logits whose graph is backpropagated twice (the zero-bubble
    // schedules' input and weight passes: protocols/repeated_backward.h). No version bump
    // follows the overwrite: multi-token prediction's depths are row ranges of one logits
    // tensor, each saved by its own loss, and a bump by one depth's backward would fail the next
    // depth's unpacking (their rows do not overlap).
    const bool overwrite = !logits.is_leaf() && !protocols::backward_may_repeat();
    return kernels::cross_entropy_sum(rows, targets, kIgnoreIndex, overwrite);
  }
  return kernels::cross_entropy_sum(rows.to(at::kFloat), targets, kIgnoreIndex);
}

int64_t count_valid_tokens(const at::Tensor& labels) {
  return labels.ne(kIgnoreIndex).sum().item<int64_t>();
}

}  // namespace loom::models
