// Grouped-query causal self-attention with rotary embeddings, optionally with an RMSNorm over
// each q and k head before the rotation (Qwen3's qk_norm), a sliding window and sinks per layer
// (DecoderArgs::layer_windows and attention_sinks, handed to the backend as LayerAttention).
#pragma once

#include "loom/models/common/decoder_args.h"
#include "loom/models/common/layers.h"
#include "loom/models/common/max_logits.h"
#include "loom/protocols/attention_backend.h"

namespace loom::models {

// A ParameterTableModule: the sinks are read from the table at each call, so FSDP's swap of the
// meta or sharded tensor (replace_parameter) reaches them; the projections are WeightModules.
class AttentionImpl : public ParameterTableModule {
 public:
  // `layer` picks this layer's window from args.layer_windows.
  AttentionImpl(const DecoderArgs& args, const at::TensorOptions& options, int64_t layer = 0);
  // x [bs, seq, dim] -> [bs, seq, dim], rotated and attended as `in` says.
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in);
  // Tokens at positions 0..seq-1 of one causal row: freqs_cis [>= seq, head_dim / 2].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& freqs_cis) {
    return forward(x, AttentionInputs{freqs_cis, {}, {}, nullptr});
  }
  // Inference with a key/value cache (kv_cache.h): x [bs, q, dim] are the tokens of cache slots
  // [start, start + q), rotations [bs, q, head_dim / 2] their RoPE rows. Writes their keys and
  // values into `keys`/`values` [bs, kv_heads, capacity, head_dim] and attends over slots
  // [0, start + q) under `mask` (bool [bs, 1, q, start + q], true = may attend; undefined: every
  // slot, or causal when start == 0). Keys are cached as rotate_qk leaves them. A layer with a
  // sliding window or sinks attends as in training instead, over the slots, with each row's
  // left `padding` ([bs] slots; undefined: none) unseen.
  at::Tensor forward_cached(const at::Tensor& x, const at::Tensor& rotations, at::Tensor& keys,
                            at::Tensor& values, int64_t start, const at::Tensor& mask,
                            const at::Tensor& padding = {});

  Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // null without qk_norm
  int64_t window = 0;                        // this layer's sliding window (0: full)
  bool has_sinks = false;                    // DecoderArgs::attention_sinks
  // The parameter "sinks" [n_heads]; undefined without attention_sinks.
  at::Tensor sinks() const { return has_sinks ? param("sinks") : at::Tensor(); }
  int64_t n_heads;  // of the whole model (forward() reads this rank's from wq's shape)
  int64_t n_kv_heads;
  MaxLogits max_logits;  // QK-clip's statistic (qk_clip.h)
  int64_t head_dim;
  RopeLayout rope_layout;

 private:
  // q, k, v [bs, seq, heads, head_dim] of x, with q and k normalized (qk_norm).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> project(const at::Tensor& x);
};
TORCH_MODULE(Attention);

// [bs, seq, kv_heads, head_dim] -> [bs, seq, kv_heads * n_rep, head_dim]; kv head j serves query
// heads j * n_rep ... j * n_rep + n_rep - 1.
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep);

}  // namespace loom::models
