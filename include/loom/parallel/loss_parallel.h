// Loss parallelism: cross-entropy over vocabulary-sharded logits without gathering them.
// Each tp rank holds logits [batch, seq, local] for vocabulary columns [first, first + local);
// the softmax's maximum, normalizer and target logit are reduced over tp (two small collectives
// of [batch · seq] values), so no rank ever holds [batch, seq, vocab].
#pragma once

#include <ATen/core/Tensor.h>

namespace loom::distributed {
class Comm;
}

namespace loom::parallel {

// Summed token cross-entropy (labels == models::kIgnoreIndex skipped), equal on every tp rank
// and to models::cross_entropy_sum of the gathered logits. Backward gives each rank the gradient
// of its own columns.
at::Tensor vocab_parallel_cross_entropy_sum(const at::Tensor& local_logits,
                                            const at::Tensor& labels, int64_t first,
                                            distributed::Comm& tp);

}  // namespace loom::parallel
