#include "loom/models/loss.h"

#include <ATen/ATen.h>

#include "loom/models/kernels/cross_entropy.h"

namespace loom::models {

at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
  return kernels::cross_entropy_sum(logits.flatten(0, 1).to(at::kFloat),
                                           labels.flatten().contiguous(), kIgnoreIndex);
}

int64_t count_valid_tokens(const at::Tensor& labels) {
  return labels.ne(kIgnoreIndex).sum().item<int64_t>();
}

}  // namespace loom::models
