// Llama 3 model arguments and the named flavors (debugmodel, 8B, 70B, 405B).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace loom::models::llama {

// Llama 3.1 RoPE frequency scaling (long-context extension).
struct RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaArgs {
  int64_t dim = 4096;
  int64_t n_layers = 32;
  int64_t n_heads = 32;
  std::optional<int64_t> n_kv_heads;  // unset: as many as n_heads (no GQA)
  int64_t vocab_size = 128256;
  int64_t multiple_of = 256;  // SwiGLU hidden size is rounded up to a multiple of this
  std::optional<double> ffn_dim_multiplier;
  double norm_eps = 1e-5;
  double rope_theta = 500000;
  bool use_scaled_rope = true;
  RopeScaling rope_scaling;
  int64_t max_seq_len = 131072;
  // Output projections of block i are initialized with std 0.02 / sqrt(2 (i + 1)) when true,
  // 0.02 / sqrt(2 n_layers) when false.
  bool depth_init = true;

  int64_t head_dim() const { return dim / n_heads; }
  int64_t kv_heads() const { return n_kv_heads.value_or(n_heads); }
  int64_t ffn_hidden_dim() const;
  // Throws loom::InputError naming the first inconsistent argument.
  void validate() const;
};

// SwiGLU hidden size exactly as Llama 3: 2/3 of 4*dim, times the multiplier, rounded up.
int64_t ffn_hidden_dim(int64_t dim, int64_t multiple_of, std::optional<double> multiplier);

// Named flavors of the llama3 family (torchtitan's debugmodel, 8B, 70B, 405B, and loom's 100M
// benchmark size); vocab_size is a default the tokenizer may replace.
const std::map<std::string, LlamaArgs>& llama3_flavors();

}  // namespace loom::models::llama
