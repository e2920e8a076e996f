// Peak memory per component on one rank, estimated from the model's parameter shapes before the
// first step (the start-up log): parameters, gradients, optimizer state and activations.
//
// Activations count what eager autograd keeps per token in each transformer block (norm inputs
// and outputs, q/k/v, rotated q/k, attention output, the feed-forward's w1/w3 outputs, SiLU and
// product: 4·dim + 3·q_dim + 3·kv_dim + 4·hidden elements); a checkpointed block keeps only its
// input, plus one block recomputed at a time in backward. The output layer adds the logits (in
// the compute dtype, and float32 for the loss). One microbatch is live at a time. Allocator
// fragmentation, communication buffers and temporary workspaces come on top.
#pragma once

#include <cstdint>
#include <string>

#include "loom/config/job_config.h"
#include "loom/models/model_spec.h"

namespace loom::metrics {

struct MemoryInputs {
  int64_t shard_degree = 1;  // ranks sharing the parameters (FSDP); 1 without sharding
  int param_bytes = 4;       // element size of the optimizer's parameters
  int compute_bytes = 4;     // element size of activations (the autocast / mixed-precision dtype)
};

struct MemoryEstimate {
  double parameters_gib = 0;  // FSDP: local shards plus two gathered units (current, prefetched)
  double gradients_gib = 0;
  double optimizer_gib = 0;  // AdamW: two moments per parameter
  double activations_gib = 0;
  double total_gib() const {
    return parameters_gib + gradients_gib + optimizer_gib + activations_gib;
  }
  std::string describe() const;
};

MemoryEstimate estimate_memory(const models::ModelSummary& model, const config::JobConfig& config,
                               const MemoryInputs& inputs);

}  // namespace loom::metrics
