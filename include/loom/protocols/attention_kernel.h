// The CPU attention kernel behind masked_attention and attention_partial: exact softmax attention
// under a MaskDescription (causal, documents, sliding window), blocked as the flash kernel is.
// Queries and keys are cut into blocks of `block` tokens; each query block walks its key blocks
// with an online softmax (running max, running denominator, rescaled accumulator), so the largest
// temporary is one [b, h, block, block] tile and its mask, whatever the sequence length. A key
// block whose slots are all in the query block's future, or all before its window, is never
// computed. Every (b, h) is one batched matmul per tile: BLAS does the work, not scalar loops.
#pragma once

#include <array>

#include "loom/protocols/attention_backend.h"

namespace loom::models {

constexpr int64_t kAttentionBlock = 128;

// How many [query block, key block] tiles the last call computed and skipped (tests read it to
// see that the window skips work, and that the skip is not what makes results right).
struct AttentionKernelStats {
  int64_t tiles_computed = 0;
  int64_t tiles_skipped = 0;
};

// q [b, h, s, d], k [b, h, t, d], v [b, h, t, dv] on the CPU (heads already expanded); float32
// arithmetic whatever their dtype. out in q's dtype, lse float [b, h, s, 1]; a row that sees no
// key gets out 0 and lse -inf.
AttentionPartial blocked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   double scale, const MaskDescription& where,
                                   int64_t block = kAttentionBlock,
                                   AttentionKernelStats* stats = nullptr);

// dq, dk, dv given the rows' final out and lse (after every merge, sinks included): the tiles
// are recomputed, never stored.
std::array<at::Tensor, 3> blocked_attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                                     const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& out, const at::Tensor& lse,
                                                     double scale, const MaskDescription& where,
                                                     int64_t block = kAttentionBlock,
                                                     AttentionKernelStats* stats = nullptr);

}  // namespace loom::models
