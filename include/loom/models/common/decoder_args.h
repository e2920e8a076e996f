// The arguments of the shared decoder (common/decoder.h): a pre-norm transformer with grouped-
// query attention, rotary embeddings and a SwiGLU feed-forward. Families are settings of it:
// Llama 3 (interleaved RoPE with Llama 3.1 scaling, untied head), Qwen3 (per-head q/k RMSNorm,
// head_dim set apart from dim / n_heads, rotate-half RoPE, tied head on the small sizes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "loom/models/common/moe_args.h"

namespace loom::models {

// Llama 3.1 RoPE frequency scaling (long-context extension).
struct RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
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
  bool qk_norm = false;         // RMSNorm over each q and k head before RoPE (Qwen3)
  bool tie_embeddings = false;  // the output projection is the token embedding's table
  int64_t max_seq_len = 131072;
  // Output projections of block i are initialized with std 0.02 / sqrt(2 (i + 1)) when true,
  // 0.02 / sqrt(2 n_layers) when false (Llama's init).
  bool depth_init = true;
  // Mixture-of-experts feed-forward on the layers MoEArgs::is_moe_layer picks; unset: dense.
  std::optional<MoEArgs> moe;

  int64_t head_dim() const { return head_dim_override.value_or(dim / n_heads); }
  int64_t kv_heads() const { return n_kv_heads.value_or(n_heads); }
  int64_t ffn_hidden_dim() const;
  bool is_moe_layer(int64_t layer) const { return moe && moe->is_moe_layer(layer); }
  // Throws loom::InputError naming `family` and the first inconsistent argument.
  void validate(const std::string& family = "decoder") const;
};

// SwiGLU hidden size exactly as Llama 3: 2/3 of 4*dim, times the multiplier, rounded up.
int64_t ffn_hidden_dim(int64_t dim, int64_t multiple_of, std::optional<double> multiplier);

}  // namespace loom::models
