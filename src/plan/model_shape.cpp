#include "loom/plan/model_shape.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "loom/config/job_config.h"
#include "loom/models/model_spec.h"
#include "loom/optim/registry.h"

namespace loom::plan {
namespace {

const models::ParameterShape* find(const models::ModelSummary& s, const std::string& name) {
  for (const auto& p : s.parameters) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

int64_t extent(const models::ModelSummary& s, const std::string& name, size_t d) {
  const auto* p = find(s, name);
  return p != nullptr && p->shape.size() > d ? p->shape[d] : 0;
}

// Block `b`'s shapes from its parameter names (llama/qwen3: wq/wk/wv, w1; deepseek_v3: latent
// attention's wq_b (or wq) and wkv_b, dense or MoE feed-forward).
BlockShape block_shape(const models::ModelSummary& s, int64_t b, int64_t experts_per_token) {
  const std::string prefix = "layers." + std::to_string(b) + ".";
  BlockShape block;
  for (const auto& p : s.parameters) {
    if (p.name.rfind(prefix, 0) != 0) continue;
    block.params += p.numel;
    block.largest_param = std::max(block.largest_param, p.numel);
    if (p.name.find(".moe.experts.") != std::string::npos) block.expert_params += p.numel;
  }
  block.q_dim = std::max(extent(s, prefix + "attention.wq.weight", 0),
                         extent(s, prefix + "attention.wq_b.weight", 0));
  block.kv_dim = std::max(extent(s, prefix + "attention.wk.weight", 0),
                          extent(s, prefix + "attention.wkv_b.weight", 0) / 2);
  block.hidden = extent(s, prefix + "feed_forward.w1.weight", 0);
  if (block.hidden == 0 && find(s, prefix + "moe.experts.w1") != nullptr) {
    block.moe = true;
    block.hidden = experts_per_token * extent(s, prefix + "moe.experts.w1", 1) +
                   extent(s, prefix + "moe.shared_experts.w1.weight", 0);
    block.routed_copies = 2 * experts_per_token;
  }
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
  const models::ModelSummary s = model->summary(config.training.seq_len);
  ModelShape shape;
  shape.family = s.family;
  shape.flavor = s.flavor;
  shape.total_params = s.total_params;
  shape.flops_per_token = s.flops_per_token;
  shape.seq_len = s.seq_len;
  shape.embedding_params = s.embedding_params;
  shape.vocab = extent(s, "tok_embeddings.weight", 0);
  shape.dim = extent(s, "tok_embeddings.weight", 1);
  shape.tied_embedding = find(s, "output.weight") == nullptr;
  int64_t n_blocks = 0;
  for (const auto& p : s.parameters) {
    if (p.name.rfind("layers.", 0) == 0) {
      n_blocks =
          std::max<int64_t>(n_blocks, std::stoll(p.name.substr(7, p.name.find('.', 7) - 7)) + 1);
    } else if (p.name != "tok_embeddings.weight") {
      shape.head_params += p.numel;
    }
    if (p.name.find(".moe.experts.w1") != std::string::npos && p.shape.size() == 3) {
      shape.experts = p.shape[0];
    }
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    shape.blocks.push_back(block_shape(s, b, s.experts_per_token));
  }
  const auto footprint = optim::state_footprint(config.optimizer, s.parameters);
  shape.optimizer_states = footprint.per_parameter;
  shape.optimizer_state_names = config.optimizer.name + ": " + footprint.description;
  shape.optimizer_matrix_flops = footprint.matrix_flops;
  shape.optimizer_whole_elements = footprint.whole_tensor_elements;
  return shape;
}

}  // namespace loom::plan
