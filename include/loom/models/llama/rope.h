// Rotary position embeddings as Llama 3 (and torchtitan) apply them: adjacent pairs of a head's
// features are rotated by position * frequency, frequencies 1/theta^(2i/head_dim), optionally
// rescaled for long context (Llama 3.1).
#pragma once

#include <ATen/core/Tensor.h>

#include "loom/models/llama/args.h"

namespace loom::models::llama {

// Per-pair frequencies [head_dim / 2] in float32, scaled when args.use_scaled_rope.
at::Tensor rope_frequencies(int64_t head_dim, double theta, bool scaled,
                            const RopeScaling& scaling);

// Complex rotations [seq_len, head_dim / 2] (complex64) on `device`.
at::Tensor precompute_freqs_cis(const LlamaArgs& args, int64_t seq_len, const at::Device& device);

// Rotates q [bs, seq, heads, head_dim] (or k) by freqs_cis [seq, head_dim / 2].
at::Tensor apply_rotary_emb(const at::Tensor& x, const at::Tensor& freqs_cis);

// Rotates x [bs, seq, heads, head_dim] by per-token rotations [bs, seq, head_dim / 2] (rows of
// freqs_cis gathered at each token's own position: left-padded batches, incremental decoding).
at::Tensor apply_rotary_emb_at(const at::Tensor& x, const at::Tensor& rotations);

}  // namespace loom::models::llama
