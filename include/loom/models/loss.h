// Cross-entropy for language modeling: summed over the tokens whose label is not kIgnoreIndex,
// so the trainer can divide by the valid tokens of the whole global batch (microbatches and
// data-parallel ranks together), which makes the loss independent of how the batch is split.
#pragma once

#include <ATen/core/Tensor.h>

#include "loom/protocols/causal_lm.h"  // kIgnoreIndex

namespace loom::models {

// logits [bs, seq, vocab] float32, labels [bs, seq] int64 -> 0-d sum of per-token losses.
// With loom's CUDA kernels on (kernels/cuda.h), bfloat16 logits are read as they are and the
// backward writes their gradient over them: pass logits that serve this loss alone.
at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels);

// Number of labels that count (!= kIgnoreIndex).
int64_t count_valid_tokens(const at::Tensor& labels);

}  // namespace loom::models
