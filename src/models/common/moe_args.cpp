#include "loom/models/common/moe_args.h"

#include <algorithm>

#include "loom/core/check.h"

namespace loom::models {

const char* to_string(ScoreFunction f) {
  return f == ScoreFunction::kSoftmax ? "softmax" : "sigmoid";
}

bool MoEArgs::is_moe_layer(int64_t layer) const {
  if (layer < first_dense_layers) return false;
  if ((layer + 1) % sparse_step != 0) return false;  // Qwen's decoder_sparse_step rule
  return std::find(dense_layers.begin(), dense_layers.end(), layer) == dense_layers.end();
}

int64_t MoEArgs::experts_per_group() const {
  return num_expert_groups > 1 ? num_experts / num_expert_groups : num_experts;
}

void MoEArgs::validate(const std::string& family, int64_t n_layers) const {
  LOOM_CHECK_AS(InputError, num_experts > 0 && hidden_dim > 0, family,
                ": moe num_experts and hidden_dim must be positive");
  LOOM_CHECK_AS(InputError, top_k >= 1 && top_k <= num_experts, family, ": moe top_k (", top_k,
                ") must be between 1 and num_experts (", num_experts, ")");
  LOOM_CHECK_AS(InputError, num_shared_experts >= 0 && route_scale > 0, family,
                ": moe num_shared_experts must be >= 0 and route_scale positive");
  if (num_expert_groups > 1) {
    LOOM_CHECK_AS(InputError, num_experts % num_expert_groups == 0, family,
                  ": moe num_experts (", num_experts, ") must divide into num_expert_groups (",
                  num_expert_groups, ")");
    LOOM_CHECK_AS(InputError, num_limited_groups >= 1 && num_limited_groups <= num_expert_groups,
                  family, ": moe num_limited_groups (", num_limited_groups,
                  ") must be between 1 and num_expert_groups (", num_expert_groups, ")");
    LOOM_CHECK_AS(InputError, top_k <= num_limited_groups * experts_per_group(), family,
                  ": moe top_k (", top_k, ") is more than the experts of ", num_limited_groups,
                  " groups");
  }
  LOOM_CHECK_AS(InputError, !(sinkhorn && num_expert_groups > 1), family,
                ": moe sinkhorn routing does not combine with group-limited routing");
  LOOM_CHECK_AS(InputError, load_balance_coeff >= 0 && aux_loss_coeff >= 0 && capacity_factor >= 0,
                family, ": moe load_balance_coeff, aux_loss_coeff and capacity_factor must be >= 0");
  LOOM_CHECK_AS(InputError, sparse_step >= 1 && first_dense_layers >= 0 &&
                                first_dense_layers <= n_layers && sinkhorn_iterations >= 1,
                family, ": moe sparse_step, first_dense_layers or sinkhorn_iterations out of range");
}

}  // namespace loom::models
