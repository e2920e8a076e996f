#include "loom/parallel/loss_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "loom/distributed/comm.h"
#include "loom/parallel/tp_regions.h"
#include "loom/protocols/causal_lm.h"

namespace loom::parallel {

at::Tensor vocab_parallel_cross_entropy_sum(const at::Tensor& local_logits,
                                            const at::Tensor& labels, int64_t first,
                                            distributed::Comm& tp) {
  const at::Tensor z = local_logits.flatten(0, local_logits.dim() - 2).to(at::kFloat);
  const at::Tensor y = labels.flatten();
  const int64_t local = z.size(1);
  // The maximum only keeps exp() in range: the loss does not depend on it, so no gradient.
  at::Tensor max;
  {
    at::NoGradGuard no_grad;
    max = local > 0 ? std::get<0>(z.max(1)) : at::full({z.size(0)}, -INFINITY, z.options());
    tp.all_reduce(max, distributed::ReduceOp::kMax);
  }
  const at::Tensor shifted = z - max.unsqueeze(1);
  const at::Tensor mine = y.ge(first).logical_and(y.lt(first + local));
  at::Tensor target = at::zeros({z.size(0)}, z.options());
  if (local > 0) {
    const at::Tensor column = (y - first).clamp(0, local - 1).unsqueeze(1);
    target = at::where(mine, shifted.gather(1, column).squeeze(1), target);
  }
  // One collective for both sums: the softmax normalizer and the target's shifted logit.
  const at::Tensor sums =
      all_reduce_replicated(at::stack({shifted.exp().sum(1), target}), tp);
  const at::Tensor per_token = sums[0].log() - sums[1];
  const at::Tensor valid = y.ne(models::kIgnoreIndex);
  return at::where(valid, per_token, at::zeros_like(per_token)).sum();
}

}  // namespace loom::parallel
