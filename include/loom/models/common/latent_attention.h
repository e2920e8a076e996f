// Multi-head latent attention (DeepSeek-V2/V3, common/decoder_args.h MLAArgs). Parameter names
// follow torchtitan: attention.wq (q_lora_rank 0) or attention.wq_a, q_norm, wq_b; attention.wkv_a
// (x -> the kv latent and the shared rotary key), kv_norm, wkv_b (latent -> per-head key and
// value features), wo.
//
// Training expands the latent into per-head keys and values and runs SDPA. Decoding caches only
// the normed latent and the rotated key ((kv_lora_rank + qk_rope_head_dim) values per token and
// layer) and attends in the latent space: wkv_b's key half is folded into the queries and its
// value half applied after the attention, so the cache never holds per-head keys or values.
#pragma once

#include "loom/models/common/decoder_args.h"
#include "loom/models/common/layers.h"
#include "loom/models/common/max_logits.h"
#include "loom/protocols/attention_backend.h"

namespace loom::models {

class LatentAttentionImpl : public torch::nn::Module {
 public:
  LatentAttentionImpl(const DecoderArgs& args, const at::TensorOptions& options);
  // x [bs, seq, dim] -> [bs, seq, dim], rotated and attended as `in` says.
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& freqs_cis) {
    return forward(x, AttentionInputs{freqs_cis, {}, {}, nullptr});
  }
  // Inference (see AttentionImpl::forward_cached for slots, rotations and mask): writes the
  // tokens' normed latents into `latents` [bs, capacity, kv_lora_rank] and rotated keys into
  // `rope_keys` [bs, capacity, qk_rope_head_dim], attends over slots [0, start + q).
  at::Tensor forward_cached(const at::Tensor& x, const at::Tensor& rotations, at::Tensor& latents,
                            at::Tensor& rope_keys, int64_t start, const at::Tensor& mask);

  Linear wq{nullptr};                   // q_lora_rank == 0
  Linear wq_a{nullptr}, wq_b{nullptr};  // q_lora_rank > 0
  RMSNorm q_norm{nullptr};              // q_lora_rank > 0
  Linear wkv_a{nullptr}, wkv_b{nullptr}, wo{nullptr};
  RMSNorm kv_norm{nullptr};
  MLAArgs mla;
  int64_t n_heads;  // of the whole model (forward() reads this rank's from the shapes)
  double softmax_scale;
  MaxLogits max_logits;  // QK-clip's statistic (qk_clip.h)
  RopeLayout rope_layout;

 private:
  // Queries [bs, seq, local heads, qk_head_dim].
  at::Tensor queries(const at::Tensor& x);
};
TORCH_MODULE(LatentAttention);

}  // namespace loom::models
