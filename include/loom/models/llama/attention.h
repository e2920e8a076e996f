// Grouped-query causal self-attention with rotary embeddings.
#pragma once

#include "loom/models/common.h"
#include "loom/models/llama/args.h"

namespace loom::models::llama {

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const LlamaArgs& args, const at::TensorOptions& options);
  // x [bs, seq, dim], freqs_cis [>= seq, head_dim / 2] -> [bs, seq, dim]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& freqs_cis);
  // Inference with a key/value cache (kv_cache.h): x [bs, q, dim] are the tokens of cache slots
  // [start, start + q), rotations [bs, q, head_dim / 2] their RoPE rows. Writes their keys and
  // values into `keys`/`values` [bs, kv_heads, capacity, head_dim] and attends over slots
  // [0, start + q) under `mask` (bool [bs, 1, q, start + q], true = may attend; undefined: every
  // slot, or causal when start == 0).
  at::Tensor forward_cached(const at::Tensor& x, const at::Tensor& rotations, at::Tensor& keys,
                            at::Tensor& values, int64_t start, const at::Tensor& mask);

  Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  int64_t n_heads;     // of the whole model (forward() reads this rank's from wq's shape)
  int64_t n_kv_heads;
  int64_t head_dim;
};
TORCH_MODULE(Attention);

// [bs, seq, kv_heads, head_dim] -> [bs, seq, kv_heads * n_rep, head_dim]; kv head j serves query
// heads j * n_rep ... j * n_rep + n_rep - 1.
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep);

}  // namespace loom::models::llama
