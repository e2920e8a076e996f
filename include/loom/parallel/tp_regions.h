// The region changes of tensor parallelism with sequence parallelism (Megatron-LM's
// "f"/"g" operators), each an autograd function whose backward is its communication pair,
// over the tp group through loom's Comm (so the byte counters see them).
//
// Layouts: activations [batch, seq, ...] are either sequence-sharded (rank r holds sequence
// chunk r of seq / tp tokens: norms and the residual stream) or replicated (every tp rank holds
// the whole sequence: the input of column-parallel projections).
#pragma once

#include <ATen/core/Tensor.h>

namespace loom::distributed {
class Comm;
}

namespace loom::parallel {

// Sequence-sharded -> replicated: all-gather on dim 1. Backward: reduce-scatter on dim 1 (each
// rank's column-parallel projections contribute a partial input gradient).
at::Tensor gather_sequence(const at::Tensor& x, distributed::Comm& tp);

// Partial sums (row-parallel outputs, vocab-parallel embeddings) -> sequence-sharded:
// reduce-scatter on dim 1. Backward: all-gather on dim 1. Needs seq % tp == 0.
at::Tensor reduce_scatter_sequence(const at::Tensor& x, distributed::Comm& tp);

// Vocabulary-sharded logits [..., local] -> the whole [..., full]: all-gather on the last dim,
// where rank r holds columns [r·c, r·c + local) with c = ceil(full / tp) (Placement::shard's
// pieces). Backward: this rank's columns of the gradient, no communication (every tp rank
// computes the same loss from the same gathered logits).
at::Tensor gather_last_dim(const at::Tensor& x, distributed::Comm& tp, int64_t full);

// Sum over the tp ranks of a value every rank then uses identically (the pieces of a
// vocab-parallel softmax). Backward: identity (each rank's contribution gets the gradient of
// the replicated result).
at::Tensor all_reduce_replicated(const at::Tensor& x, distributed::Comm& tp);

}  // namespace loom::parallel
