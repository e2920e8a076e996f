#include "loom/plan/model_shape.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "loom/config/job_config.h"
#include "loom/core/check.h"
#include "loom/models/model_spec.h"
#include "loom/optim/registry.h"

namespace loom::plan {
namespace {

// Block `summary`'s shapes as its family reports them; its parameters (global names
// "layers.N.*", the checkpoint contract) counted for FSDP's units and the experts' sharding.
BlockShape block_shape(const models::ModelSummary& s, const models::BlockSummary& summary) {
  const std::string prefix = "layers." + std::to_string(summary.layer) + ".";
  BlockShape block;
  for (const auto& p : s.parameters) {
    if (p.name.rfind(prefix, 0) != 0) continue;
    block.params += p.numel;
    block.largest_param = std::max(block.largest_param, p.numel);
    if (p.name.find(".moe.experts.") != std::string::npos) block.expert_params += p.numel;
  }
  block.q_dim = summary.q_dim;
  block.kv_dim = summary.kv_dim;
  block.hidden = summary.hidden;
  block.routed_copies = summary.routed_copies;
  block.moe = summary.experts > 0;
  return block;
}

}  // namespace

double ModelShape::block_activation_elements(int64_t b) const {
  const BlockShape& k = blocks.at(static_cast<size_t>(b));
  return static_cast<double>(4 * dim + 3 * k.q_dim + 3 * k.kv_dim + 4 * k.hidden +
                             k.routed_copies * dim);
}

double ModelShape::block_op_policy_elements(int64_t b) const {
  const BlockShape& k = blocks.at(static_cast<size_t>(b));
  return static_cast<double>(2 * dim + 2 * k.q_dim + k.kv_dim + k.hidden + k.routed_copies * dim);
}

ModelShape read_model_shape(const config::JobConfig& config, int64_t vocab) {
  const auto model =
      models::build_model(config, vocab, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
  return model_shape_of(config, model->summary(config.training.seq_len));
}

ModelShape model_shape_of(const config::JobConfig& config, const models::ModelSummary& s) {
  LOOM_CHECK(!s.blocks.empty() && s.dim > 0 && s.vocab > 0, "the ", s.family,
             " family's summary reports no block shapes; the planner needs them");
  ModelShape shape;
  shape.family = s.family;
  shape.flavor = s.flavor;
  shape.total_params = s.total_params;
  shape.flops_per_token = s.flops_per_token;
  shape.seq_len = s.seq_len;
  shape.embedding_params = s.embedding_params;
  shape.vocab = s.vocab;
  shape.dim = s.dim;
  shape.n_heads = s.n_heads;
  shape.n_kv_heads = s.n_kv_heads;
  shape.tied_embedding = s.tied_embedding;
  for (const auto& p : s.parameters) {
    if (p.name.rfind("layers.", 0) != 0 && p.name != "tok_embeddings.weight") {
      shape.head_params += p.numel;
    }
  }
  for (const auto& block : s.blocks) {
    shape.experts = std::max(shape.experts, block.experts);
    shape.blocks.push_back(block_shape(s, block));
  }
  for (const auto& block : s.mtp_blocks) shape.mtp_blocks.push_back(block_shape(s, block));
  const auto footprint = optim::state_footprint(config.optimizer, s.parameters);
  shape.optimizer_states = footprint.per_parameter;
  shape.optimizer_state_names = config.optimizer.name + ": " + footprint.description;
  shape.optimizer_matrix_flops = footprint.matrix_flops;
  shape.optimizer_whole_elements = footprint.whole_tensor_elements;
  shape.optimizer_whole_stack_elements = footprint.whole_stack_elements;
  shape.optimizer_largest_matrix = footprint.largest_whole_tensor;
  shape.optimizer_largest_stack = footprint.largest_whole_stack;
  shape.optimizer_largest_stack_experts = footprint.largest_whole_stack_experts;
  std::vector<models::ParameterShape> blocks, other;
  for (const auto& p : s.parameters)
    (p.name.rfind("layers.", 0) == 0 ? blocks : other).push_back(p);
  if (!blocks.empty()) {
    const auto in_blocks = optim::state_footprint(config.optimizer, blocks);
    double elements = 0;
    for (const auto& p : blocks) elements += static_cast<double>(p.numel);
    shape.optimizer_states_blocks = in_blocks.per_parameter;
    shape.optimizer_whole_block_share = in_blocks.whole_tensor_elements / elements;
    shape.optimizer_whole_stack_block_share = in_blocks.whole_stack_elements / elements;
  }
  if (!other.empty()) {
    shape.optimizer_states_other = optim::state_footprint(config.optimizer, other).per_parameter;
  }
  return shape;
}

}  // namespace loom::plan
