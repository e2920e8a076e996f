// The arguments of the shared decoder (common/decoder.h): a pre-norm transformer with grouped-
// query attention, rotary embeddings and a SwiGLU feed-forward. Families are settings of it:
// Llama 3 (interleaved RoPE with Llama 3.1 scaling, untied head), Qwen3 (per-head q/k RMSNorm,
// head_dim set apart from dim / n_heads, rotate-half RoPE, tied head on the small sizes).
#pragma once

#include <algorithm>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/models/common/moe_args.h"

namespace loom::models {

// Llama 3.1 RoPE frequency scaling (long-context extension).
struct RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// YaRN RoPE scaling (transformers' rope_type "yarn", DeepSeek-V3's long context): per-pair
// frequencies blended between the original and the interpolated ones by a ramp over
// [beta_slow, beta_fast] rotations in the original context; the rotations' magnitude is
// attention_factor, and multi-head latent attention multiplies its softmax scale by
// mscale(factor, mscale_all_dim)^2 where mscale_all_dim is set.
struct YarnScaling {
  double factor = 40.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;                     // 0: unset
  double mscale_all_dim = 0.0;             // 0: unset
  std::optional<double> attention_factor;  // unset: from factor, mscale and mscale_all_dim
  bool truncate = true;                    // the ramp's ends rounded to whole pairs
  // torchtitan's DeepSeek-V3 flavors pretrain at the original context with plain RoPE and switch
  // YaRN on only for a longer max_seq_len; Hugging Face configs apply it whatever the length.
  bool only_beyond_original = false;

  // The magnitude of the rotations (transformers' attention_scaling on cos and sin).
  double rotation_scale() const;
  // The factor on MLA's softmax scale (1 without mscale_all_dim).
  double softmax_scale_factor() const;
};

// Multi-head latent attention (DeepSeek-V2/V3): queries through an optional low-rank bottleneck
// (q_lora_rank; 0: one projection), keys and values from a shared compressed latent of
// kv_lora_rank features plus one rotary key of qk_rope_head_dim shared by every head.
struct MLAArgs {
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  double norm_eps = 1e-6;  // the q and kv latent norms' (transformers' DeepseekV3RMSNorm default)

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// Which features of a head RoPE rotates together: adjacent pairs (x0, x1), (x2, x3), ... as Meta's
// Llama and torchtitan's llama3, or the two halves (x_i, x_{i + head_dim/2}) as transformers and
// Qwen. Attention only reads q·k, so the halves layout is computed as the pair layout on q and k
// with their features reordered (common/rope.h); the weights keep each layout's own order.
enum class RopeLayout { kInterleaved, kHalves };

struct DecoderArgs {
  int64_t dim = 4096;
  int64_t n_layers = 32;
  int64_t n_heads = 32;
  std::optional<int64_t> n_kv_heads;  // unset: as many as n_heads (no GQA)
  // Unset: dim / n_heads (Llama); Qwen3 sets 128 whatever the width.
  std::optional<int64_t> head_dim_override;
  int64_t vocab_size = 128256;
  // SwiGLU hidden size: `hidden_dim` when set (Qwen3), else Llama's rule from multiple_of and
  // ffn_dim_multiplier.
  std::optional<int64_t> hidden_dim;
  int64_t multiple_of = 256;
  std::optional<double> ffn_dim_multiplier;
  double norm_eps = 1e-5;
  double rope_theta = 500000;
  bool use_scaled_rope = true;
  RopeScaling rope_scaling;
  RopeLayout rope_layout = RopeLayout::kInterleaved;
  std::optional<YarnScaling> yarn;  // instead of use_scaled_rope; applied when yarn_active()
  bool qk_norm = false;             // RMSNorm over each q and k head before RoPE (Qwen3)
  bool tie_embeddings = false;      // the output projection is the token embedding's table
  int64_t max_seq_len = 131072;
  // Output projections of block i are initialized with std 0.02 / sqrt(2 (i + 1)) when true,
  // 0.02 / sqrt(2 n_layers) when false (Llama's init).
  bool depth_init = true;
  // Multi-head latent attention instead of grouped-query attention (n_kv_heads, head_dim and
  // qk_norm unused).
  std::optional<MLAArgs> mla;
  // Mixture-of-experts feed-forward on the layers MoEArgs::is_moe_layer picks; unset: dense.
  std::optional<MoEArgs> moe;
  // Sliding-window attention per layer (gpt-oss: every other layer sees its last 128 keys):
  // empty, every layer full; else one entry per layer, 0 for full (LayerAttention::window).
  std::vector<int64_t> layer_windows;
  // A learned logit per query head that joins each row's softmax denominator (gpt-oss's sinks):
  // the parameter layers.N.attention.sinks [n_heads].
  bool attention_sinks = false;
  // Biases on the q, k, v and output projections (gpt-oss).
  bool attention_bias = false;
  // DeepSeek-V3's multi-token prediction: this many extra blocks after the model's, layers
  // n_layers .. n_layers + num_mtp_layers - 1 (Hugging Face's numbering), each predicting one
  // token further ahead from the previous depth's representation and the embedding of the token
  // it adds (mtp.h). They run in training only and sit with the head.
  int64_t num_mtp_layers = 0;

  int64_t head_dim() const { return head_dim_override.value_or(dim / n_heads); }
  int64_t kv_heads() const { return n_kv_heads.value_or(n_heads); }
  int64_t ffn_hidden_dim() const;
  // The features RoPE rotates per head: head_dim, or MLA's qk_rope_head_dim.
  int64_t rope_dim() const { return mla ? mla->qk_rope_head_dim : head_dim(); }
  bool yarn_active() const {
    return yarn &&
           (!yarn->only_beyond_original || max_seq_len > yarn->original_max_position_embeddings);
  }
  bool is_moe_layer(int64_t layer) const { return moe && moe->is_moe_layer(layer); }
  // A multi-token-prediction block (layer >= n_layers) attends as the last layer does.
  int64_t window(int64_t layer) const {
    return layer_windows.empty()
               ? 0
               : layer_windows.at(static_cast<size_t>(std::min(layer, n_layers - 1)));
  }
  bool is_mtp_layer(int64_t layer) const { return layer >= n_layers; }
  // Throws loom::InputError naming `family` and the first inconsistent argument.
  void validate(const std::string& family = "decoder") const;
};

// SwiGLU hidden size exactly as Llama 3: 2/3 of 4*dim, times the multiplier, rounded up.
int64_t ffn_hidden_dim(int64_t dim, int64_t multiple_of, std::optional<double> multiplier);

}  // namespace loom::models
