#include "loom/models/deepseek_v3/args.h"

#include <ATen/ATen.h>

#include "loom/models/common/init.h"

namespace loom::models::deepseek_v3 {
namespace {

struct Shape {
  int64_t dim, n_layers, n_dense_layers, n_heads, inter_dim, vocab_size;
  int64_t q_lora_rank;
};

struct Routing {
  int64_t num_experts, num_shared_experts, top_k, expert_groups, limited_groups;
  ScoreFunction score;
  bool route_norm;
  double route_scale;
  int64_t moe_inter_dim;
};

DecoderArgs args_of(const Shape& shape, const Routing& routing, double mscale) {
  DecoderArgs args;
  args.dim = shape.dim;
  args.n_layers = shape.n_layers;
  args.n_heads = shape.n_heads;
  args.hidden_dim = shape.inter_dim;
  args.vocab_size = shape.vocab_size;
  args.max_seq_len = 4096 * 4;
  args.norm_eps = 1e-6;  // DeepSeek-V3's rms_norm_eps
  args.rope_theta = 10000.0;
  args.use_scaled_rope = false;
  args.rope_layout = RopeLayout::kInterleaved;  // as DeepSeek's weights (rope_interleave)
  args.depth_init = true;
  MLAArgs mla;
  mla.q_lora_rank = shape.q_lora_rank;
  mla.kv_lora_rank = 512;
  mla.qk_nope_head_dim = 128;
  mla.qk_rope_head_dim = 64;
  mla.v_head_dim = 128;
  mla.norm_eps = 1e-6;
  args.mla = mla;
  // torchtitan: YaRN (factor 40 over 4096 positions) only for a longer training context.
  YarnScaling yarn;
  yarn.factor = 40.0;
  yarn.original_max_position_embeddings = 4096;
  yarn.mscale = mscale;
  yarn.mscale_all_dim = mscale;
  yarn.only_beyond_original = true;
  args.yarn = yarn;
  MoEArgs moe = deepseek_v3_routing();
  moe.num_experts = routing.num_experts;
  moe.num_shared_experts = routing.num_shared_experts;
  moe.top_k = routing.top_k;
  moe.hidden_dim = routing.moe_inter_dim;
  moe.num_expert_groups = routing.expert_groups;
  moe.num_limited_groups = routing.limited_groups;
  moe.score_function = routing.score;
  moe.route_norm = routing.route_norm;
  moe.route_scale = routing.route_scale;
  moe.first_dense_layers = shape.n_dense_layers;
  args.moe = moe;
  return args;
}

}  // namespace

MoEArgs deepseek_v3_routing() {
  MoEArgs moe;
  moe.score_function = ScoreFunction::kSigmoid;
  moe.route_norm = true;
  moe.group_score = GroupScore::kTopTwoSum;
  moe.load_balance_coeff = 1e-3;
  return moe;
}

const std::map<std::string, DecoderArgs>& deepseek_v3_flavors() {
  static const std::map<std::string, DecoderArgs> flavors = [] {
    // torchtitan's debugmodel shapes (dim 256, MLA 512/128/64/128, 8 experts of width 256, 2
    // shared, top 3), 4 layers with the first dense, routed as the 671B: sigmoid, normalized,
    // scaled by 2.5, 4 groups of which 2 are kept.
    DecoderArgs debug = args_of({256, 4, 1, 16, 1024, 2000, 0},
                                {8, 2, 3, 4, 2, ScoreFunction::kSigmoid, true, 2.5, 256}, 0.70);
    return std::map<std::string, DecoderArgs>{
        {"debugmodel", debug},
        {"16B", args_of({2048, 27, 1, 16, 10944, 102400, 0},
                        {64, 2, 6, 1, 1, ScoreFunction::kSoftmax, false, 1.0, 1408}, 0.70)},
        {"236B", args_of({5120, 60, 1, 128, 12288, 102400, 1536},
                         {160, 2, 6, 8, 3, ScoreFunction::kSoftmax, false, 16.0, 1536}, 1.0)},
        {"671B", args_of({7168, 61, 3, 128, 18432, 129280, 1536},
                         {256, 1, 8, 8, 4, ScoreFunction::kSigmoid, true, 2.5, 2048}, 1.0)},
    };
  }();
  return flavors;
}

void init_parameter(const DecoderArgs& args, const std::string& name, at::Tensor& param,
                    uint64_t seed) {
  init_decoder_parameter(args, name, param, seed, "deepseek_v3");
}

}  // namespace loom::models::deepseek_v3
