#include "loom/models/llama/args.h"

#include "loom/core/check.h"

namespace loom::models::llama {

int64_t ffn_hidden_dim(int64_t dim, int64_t multiple_of, std::optional<double> multiplier) {
  int64_t hidden = 2 * (4 * dim) / 3;
  if (multiplier) {
    hidden = static_cast<int64_t>(*multiplier * static_cast<double>(hidden));
  }
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

int64_t LlamaArgs::ffn_hidden_dim() const {
  return llama::ffn_hidden_dim(dim, multiple_of, ffn_dim_multiplier);
}

void LlamaArgs::validate() const {
  LOOM_CHECK_AS(InputError, dim > 0 && n_layers > 0 && n_heads > 0 && vocab_size > 0,
                "llama3: dim, n_layers, n_heads and vocab_size must be positive");
  LOOM_CHECK_AS(InputError, dim % n_heads == 0, "llama3: dim (", dim,
                ") must be divisible by n_heads (", n_heads, ")");
  LOOM_CHECK_AS(InputError, head_dim() % 2 == 0, "llama3: head_dim (", head_dim(),
                ") must be even for rotary embeddings");
  LOOM_CHECK_AS(InputError, kv_heads() > 0 && n_heads % kv_heads() == 0, "llama3: n_heads (",
                n_heads, ") must be a multiple of n_kv_heads (", kv_heads(), ")");
  LOOM_CHECK_AS(InputError, multiple_of > 0, "llama3: multiple_of must be positive");
}

const std::map<std::string, LlamaArgs>& llama3_flavors() {
  static const std::map<std::string, LlamaArgs> flavors = [] {
    std::map<std::string, LlamaArgs> f;
    LlamaArgs debug;
    debug.dim = 256;
    debug.n_layers = 6;
    debug.n_heads = 16;
    debug.vocab_size = 2048;
    f["debugmodel"] = debug;

    // loom's benchmark size: the ~100M-parameter shape of GPT-2 small with Llama 3 blocks.
    LlamaArgs m100;
    m100.dim = 768;
    m100.n_layers = 12;
    m100.n_heads = 12;
    m100.vocab_size = 8192;
    f["100M"] = m100;

    LlamaArgs b8;
    b8.dim = 4096;
    b8.n_layers = 32;
    b8.n_heads = 32;
    b8.n_kv_heads = 8;
    b8.multiple_of = 1024;
    b8.ffn_dim_multiplier = 1.3;
    f["8B"] = b8;

    LlamaArgs b70;
    b70.dim = 8192;
    b70.n_layers = 80;
    b70.n_heads = 64;
    b70.n_kv_heads = 8;
    b70.multiple_of = 4096;
    b70.ffn_dim_multiplier = 1.3;
    f["70B"] = b70;

    LlamaArgs b405;
    b405.dim = 16384;
    b405.n_layers = 126;
    b405.n_heads = 128;
    b405.n_kv_heads = 8;
    b405.multiple_of = 4096;
    b405.ffn_dim_multiplier = 1.2;
    f["405B"] = b405;
    return f;
  }();
  return flavors;
}

}  // namespace loom::models::llama
