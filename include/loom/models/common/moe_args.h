// The arguments of the shared mixture-of-experts feed-forward (common/moe.h): token-choice top-k
// routing over `num_experts` SwiGLU experts, plus optional shared experts every token passes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::models {

enum class ScoreFunction { kSoftmax, kSigmoid };
const char* to_string(ScoreFunction f);

// Megatron's moe_aux_loss_type: the switch-transformer balance loss over each sequence's tokens
// ("seq_aux_loss", DeepSeek-V3's complementary loss) or over the micro-batch ("aux_loss").
enum class AuxLossType { kSequence, kGlobal };

// How group-limited routing scores a group: by its best expert (DeepSeek-V2) or by the sum of its
// best two (DeepSeek-V3's noaux_tc, torchtitan, transformers' DeepseekV3TopkRouter).
enum class GroupScore { kBestExpert, kTopTwoSum };

struct MoEArgs {
  int64_t num_experts = 8;
  int64_t top_k = 1;
  int64_t hidden_dim = 0;          // each routed expert's SwiGLU width (moe_intermediate_size)
  int64_t num_shared_experts = 0;  // one SwiGLU of num_shared_experts * hidden_dim every token uses
  ScoreFunction score_function = ScoreFunction::kSoftmax;
  bool route_norm = false;   // gate values of a token's k experts divided by their sum
  double route_scale = 1.0;  // gate values multiplied by this
  // Group-limited routing (DeepSeek-V3): experts in num_expert_groups equal groups, a token picks
  // its experts within its num_limited_groups best groups. 0: off.
  int64_t num_expert_groups = 0;
  int64_t num_limited_groups = 0;
  GroupScore group_score = GroupScore::kTopTwoSum;
  // Sinkhorn-balanced expert choice while training (gpt-neox, Megatron's "sinkhorn" router): the
  // experts are picked from the Sinkhorn-normalized scores, gate values stay the plain scores.
  bool sinkhorn = false;
  int64_t sinkhorn_iterations = 100;  // at most; stops earlier at tolerance 1e-4
  // DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias added to the scores to pick
  // experts (never to the gate values), moved by coeff * sign(mean load - load) after each
  // optimizer step. 0: no bias.
  double load_balance_coeff = 0.0;
  // Megatron's moe_aux_loss_coeff (0: off) and type.
  double aux_loss_coeff = 0.0;
  AuxLossType aux_loss_type = AuxLossType::kGlobal;
  // Tokens an expert takes at most: ceil(capacity_factor * tokens * top_k / num_experts), later
  // tokens dropped (counted). 0: dropless.
  double capacity_factor = 0.0;
  // at::_grouped_mm where the device and dtype have it; false: a loop over experts (benchmarks).
  bool use_grouped_mm = true;
  // Which layers are mixtures: all but the first `first_dense_layers` (DeepSeek-V3), every
  // `sparse_step`-th (Qwen's decoder_sparse_step) and none in `dense_layers` (mlp_only_layers).
  int64_t first_dense_layers = 0;
  int64_t sparse_step = 1;
  std::vector<int64_t> dense_layers;
  // gpt-oss: a bias on the router's logits, biases on every expert's projections (w1_bias,
  // w3_bias [E, F], w2_bias [E, D]), and its clamped SwiGLU when swiglu_limit > 0:
  // g = min(w1 x, limit), u = clamp(w3 x, -limit, limit), (u + 1) * g * sigmoid(swiglu_alpha g).
  bool router_bias = false;
  bool expert_biases = false;
  double swiglu_limit = 0.0;
  double swiglu_alpha = 1.702;

  bool is_moe_layer(int64_t layer) const;
  int64_t experts_per_group() const;
  // Throws loom::InputError naming `family` and the first inconsistent argument.
  void validate(const std::string& family, int64_t n_layers) const;
};

}  // namespace loom::models
