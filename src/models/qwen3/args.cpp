#include "loom/models/qwen3/args.h"

#include <ATen/ATen.h>

#include "loom/models/common/init.h"

namespace loom::models::qwen3 {
namespace {

struct Shape {
  int64_t dim, n_layers, n_heads, n_kv_heads, hidden_dim, vocab_size, max_seq_len;
  bool tied;
};

DecoderArgs args_of(const Shape& shape) {
  DecoderArgs args;
  args.dim = shape.dim;
  args.n_layers = shape.n_layers;
  args.n_heads = shape.n_heads;
  args.n_kv_heads = shape.n_kv_heads;
  args.head_dim_override = 128;
  args.hidden_dim = shape.hidden_dim;
  args.vocab_size = shape.vocab_size;
  args.max_seq_len = shape.max_seq_len;
  args.tie_embeddings = shape.tied;
  args.qk_norm = true;
  args.norm_eps = 1e-6;
  args.rope_theta = 1e6;
  args.use_scaled_rope = false;
  args.rope_layout = RopeLayout::kHalves;
  return args;
}

}  // namespace

const std::map<std::string, DecoderArgs>& qwen3_flavors() {
  static const std::map<std::string, DecoderArgs> flavors = {
      {"debugmodel", args_of({256, 8, 16, 8, 3072, 2048, 4096, true})},
      {"0.6B", args_of({1024, 28, 16, 8, 3072, 151936, 40960, true})},
      {"1.7B", args_of({2048, 28, 16, 8, 6144, 151936, 40960, true})},
      {"4B", args_of({2560, 36, 32, 8, 9728, 151936, 40960, true})},
      {"8B", args_of({4096, 36, 32, 8, 12288, 151936, 40960, false})},
      {"14B", args_of({5120, 40, 40, 8, 17408, 151936, 40960, false})},
      {"32B", args_of({5120, 64, 64, 8, 25600, 151936, 40960, false})},
  };
  return flavors;
}

namespace {

struct MoEShape {
  int64_t num_experts, top_k, hidden_dim;
};

DecoderArgs moe_args_of(DecoderArgs args, const MoEShape& shape) {
  MoEArgs moe = qwen3_moe_routing();
  moe.num_experts = shape.num_experts;
  moe.top_k = shape.top_k;
  moe.hidden_dim = shape.hidden_dim;
  args.moe = moe;
  return args;
}

}  // namespace

MoEArgs qwen3_moe_routing() {
  MoEArgs moe;
  moe.score_function = ScoreFunction::kSoftmax;
  moe.route_norm = true;  // Qwen3-MoE's norm_topk_prob
  moe.load_balance_coeff = 1e-3;
  return moe;
}

const std::map<std::string, DecoderArgs>& qwen3_moe_flavors() {
  static const std::map<std::string, DecoderArgs> flavors = [] {
    // A CPU-sized model: 8 experts of width 256, two per token, head_dim 32.
    DecoderArgs debug = args_of({256, 4, 8, 4, 768, 2048, 4096, false});
    debug.head_dim_override = 32;
    return std::map<std::string, DecoderArgs>{
        {"debugmodel_moe", moe_args_of(debug, {8, 2, 256})},
        {"30B-A3B",
         moe_args_of(args_of({2048, 48, 32, 4, 6144, 151936, 40960, false}), {128, 8, 768})},
        // 30B-A3B's layers, two of them: one GPU's benchmark of the grouped expert GEMMs
        // (tools/gpu_check.sh, beside torchtitan on the same shape).
        {"30B-A3B_2layers",
         moe_args_of(args_of({2048, 2, 32, 4, 6144, 151936, 40960, false}), {128, 8, 768})},
        {"235B-A22B",
         moe_args_of(args_of({4096, 94, 64, 4, 12288, 151936, 40960, false}), {128, 8, 1536})},
    };
  }();
  return flavors;
}

void init_parameter(const DecoderArgs& args, const std::string& name, at::Tensor& param,
                    uint64_t seed) {
  init_decoder_parameter(args, name, param, seed, "qwen3");
}

}  // namespace loom::models::qwen3
