// Rotary position embeddings: pairs of a head's features are rotated by position * frequency,
// frequencies 1/theta^(2i/head_dim), optionally rescaled for long context (Llama 3.1). The pairs
// are adjacent features (RopeLayout::kInterleaved) or the two halves of the head (kHalves).
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

#include "loom/models/common/decoder_args.h"

namespace loom::models {

// Per-pair frequencies [head_dim / 2] in float32, scaled when args.use_scaled_rope.
at::Tensor rope_frequencies(int64_t head_dim, double theta, bool scaled,
                            const RopeScaling& scaling);

// YaRN's per-pair frequencies [dim / 2] in float32 (transformers' _compute_yarn_parameters).
at::Tensor yarn_frequencies(int64_t dim, double theta, const YarnScaling& yarn);

// Complex rotations [seq_len, rope_dim / 2] (complex64) on `device`; of magnitude
// yarn->rotation_scale() under YaRN, 1 otherwise.
at::Tensor precompute_freqs_cis(const DecoderArgs& args, int64_t seq_len, const at::Device& device);

// A head's features reordered from the halves layout to adjacent pairs: (x_0, x_{h/2}, x_1,
// x_{h/2+1}, ...). q and k reordered alike keep every q·k, so attention over the reordered and
// pair-rotated q and k equals attention with halves-rotated ones (a contiguous copy).
at::Tensor halves_to_pairs(const at::Tensor& x);

// q [bs, seq, q_heads, head_dim] and k [bs, seq, kv_heads, head_dim] rotated by freqs_cis
// [>= seq, head_dim / 2] in `layout`, for attention: in the halves layout the results are
// reordered as halves_to_pairs does (equal scores, not equal tensors).
std::pair<at::Tensor, at::Tensor> rotate_qk(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& freqs_cis, RopeLayout layout);

// Rotates q [bs, seq, heads, head_dim] (or k) by freqs_cis [seq, head_dim / 2].
at::Tensor apply_rotary_emb(const at::Tensor& x, const at::Tensor& freqs_cis);

// Rotates x [bs, seq, heads, head_dim] by per-token rotations [bs, seq, head_dim / 2] (rows of
// freqs_cis gathered at each token's own position: left-padded batches, incremental decoding),
// in `layout` (reordered as rotate_qk does for kHalves).
at::Tensor apply_rotary_emb_at(const at::Tensor& x, const at::Tensor& rotations,
                               RopeLayout layout = RopeLayout::kInterleaved);

}  // namespace loom::models
