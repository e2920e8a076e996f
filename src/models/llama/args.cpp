#include "loom/models/llama/args.h"


namespace loom::models::llama {

namespace {

struct Shape {
  int64_t dim, n_layers, n_heads;
  std::optional<int64_t> n_kv_heads;
  int64_t multiple_of;
  std::optional<double> ffn_dim_multiplier;
  int64_t vocab_size;
};

LlamaArgs args_of(const Shape& shape) {
  LlamaArgs args;
  args.dim = shape.dim;
  args.n_layers = shape.n_layers;
  args.n_heads = shape.n_heads;
  args.n_kv_heads = shape.n_kv_heads;
  args.multiple_of = shape.multiple_of;
  args.ffn_dim_multiplier = shape.ffn_dim_multiplier;
  args.vocab_size = shape.vocab_size;
  return args;
}

}  // namespace

const std::map<std::string, LlamaArgs>& llama3_flavors() {
  // Theta 500000 with Llama 3.1 rope scaling everywhere (the LlamaArgs defaults), as torchtitan.
  static const std::map<std::string, LlamaArgs> flavors = {
      {"debugmodel", args_of({256, 6, 16, std::nullopt, 256, std::nullopt, 2048})},
      // loom's benchmark size: GPT-2 small's shape with Llama 3 blocks, ~100M parameters.
      {"100M", args_of({768, 12, 12, std::nullopt, 256, std::nullopt, 8192})},
      {"8B", args_of({4096, 32, 32, 8, 1024, 1.3, 128256})},
      // 4 of 8B's 32 layers with its vocabulary: its per-layer throughput on one GPU.
      {"8B_4layers", args_of({4096, 4, 32, 8, 1024, 1.3, 128256})},
      {"70B", args_of({8192, 80, 64, 8, 4096, 1.3, 128256})},
      {"405B", args_of({16384, 126, 128, 8, 4096, 1.2, 128256})},
  };
  return flavors;
}

}  // namespace loom::models::llama
