// What the planner needs to know about a model: per transformer block its parameters and the
// activation widths one token leaves behind, and the embedding and head. Read once from the
// model built on the meta device (no memory allocated), then everything else is arithmetic, so
// tests can write a ModelShape by hand and check byte counts against a hand computation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::config {
struct JobConfig;
}
namespace loom::models {
struct ModelSummary;
}

namespace loom::plan {

struct BlockShape {
  int64_t params = 0;         // every parameter of the block
  int64_t expert_params = 0;  // of those, the routed experts' (sharded over ep)
  int64_t largest_param = 0;  // the biggest single tensor (FSDP's gather granularity is the block)
  // Activation widths per token (elements): the attention's query and key/value widths, the
  // feed-forward hidden width a token goes through (a mixture of experts: top_k routed experts
  // plus the shared ones) and the copies of a token its dispatch and combine make (2 x top_k).
  int64_t q_dim = 0;
  int64_t kv_dim = 0;
  int64_t hidden = 0;
  int64_t routed_copies = 0;
  bool moe = false;
};

struct ModelShape {
  std::string family;
  std::string flavor;
  int64_t dim = 0;
  int64_t vocab = 0;
  int64_t n_heads = 0;  // attention heads (TP must divide them)
  int64_t n_kv_heads = 0;
  int64_t experts = 0;  // routed experts per MoE block (0: dense)
  int64_t embedding_params = 0;
  int64_t head_params = 0;      // final norm + output projection
  bool tied_embedding = false;  // the output reuses the embedding table
  int64_t total_params = 0;
  double flops_per_token = 0;  // training (fwd + bwd) FLOPs per token at seq_len
  int64_t seq_len = 0;
  std::vector<BlockShape> blocks;
  // Multi-token-prediction blocks: with the head, never split by the pipeline.
  std::vector<BlockShape> mtp_blocks;
  // The optimizer's state tensors per parameter element (AdamW: 2; Muon: 1 on its matrices) and
  // their names, from the optimizer registry (optim::state_footprint).
  double optimizer_states = 2.0;
  std::string optimizer_state_names = "AdamW's exp_avg + exp_avg_sq";
  // Muon: its Newton-Schulz FLOPs per step (the whole model once) and the elements of the
  // matrices it gathers whole when FSDP or TP cut them (optim::StateFootprint).
  double optimizer_matrix_flops = 0;
  double optimizer_whole_elements = 0;        // 2-D matrices
  double optimizer_whole_stack_elements = 0;  // 3-D expert stacks (gathered only over TP)
  // The largest of those (elements, unsharded) and that stack's experts: the step's working set.
  double optimizer_largest_matrix = 0;
  double optimizer_largest_stack = 0;
  double optimizer_largest_stack_experts = 1;
  // The state tensors per element of the transformer blocks' parameters (MTP's included) and of
  // the rest (embedding, final norm, head): under Muon 1 on the blocks' matrices, 2 elsewhere,
  // so a pipeline stage's state depends on what it holds.
  double optimizer_states_blocks = 2.0;
  double optimizer_states_other = 2.0;
  // Of the blocks' parameter elements, the share the optimizer needs whole: matrices and expert
  // stacks (Muon's exchange buffers, memory_model.cpp).
  double optimizer_whole_block_share = 0;
  double optimizer_whole_stack_block_share = 0;

  int64_t n_layers() const { return static_cast<int64_t>(blocks.size()); }
  // Saved activation elements per token of block `b` without checkpointing: norm inputs and
  // outputs, q/k/v, rotated q/k, attention output, w1/w3 outputs, SiLU and product
  // (4 dim + 3 q + 3 kv + 4 hidden) plus the routed copies.
  double block_activation_elements(int64_t b) const;
  // Under torchtitan's per-op selective policy ("op"): the block input, the outputs of wq, wv,
  // w1 and w2 (every second matmul) and of attention: 2 dim + 2 q + kv + hidden.
  double block_op_policy_elements(int64_t b) const;
};

// The job's model (model.name, model.flavor, training.seq_len) with `vocab` (0: the flavor's
// published vocabulary), built on the meta device.
ModelShape read_model_shape(const config::JobConfig& config, int64_t vocab);
// The same from a summary the caller already holds (the trainer's, built once at start-up).
ModelShape model_shape_of(const config::JobConfig& config, const models::ModelSummary& summary);

}  // namespace loom::plan
