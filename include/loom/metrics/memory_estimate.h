// Peak memory per component on one rank, estimated from the model's parameter shapes before the
// first step (the start-up log): parameters, gradients, optimizer state and activations.
//
// Activations count what eager autograd keeps per token in each transformer block (norm inputs
// and outputs, q/k/v, rotated q/k, attention output, the feed-forward's w1/w3 outputs, SiLU and
// product: 4·dim + 3·q_dim + 3·kv_dim + 4·hidden elements); a checkpointed block keeps only its
// input, plus one block recomputed at a time in backward. The output layer adds the logits (in
// the compute dtype, and float32 for the loss). One microbatch is live at a time, or under
// pipeline parallelism as many as the rank's schedule keeps (MemoryInputs). Tensor parallelism
// divides weights and activations tp ways. Allocator fragmentation, communication buffers and
// temporary workspaces come on top.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/models/model_spec.h"

namespace loom::metrics {

struct MemoryInputs {
  int64_t shard_degree = 1;  // ranks sharing the parameters (FSDP); 1 without sharding
  int param_bytes = 4;       // element size of the optimizer's parameters
  int compute_bytes = 4;     // element size of activations (the autocast / mixed-precision dtype)
  // Tensor parallelism splits the weights (and their gradients and moments) and, with sequence
  // and loss parallelism, the activations tp ways (the replicated norms are left out).
  int64_t tp_degree = 1;
  // Rows of one forward: training.local_batch_size, or a pipeline's microbatch size (0: the
  // former); and how many such forwards' activations are alive at once, per stage of the model
  // given (a pipeline rank's peak of live microbatch-stages over its stage count).
  int64_t microbatch_rows = 0;
  double live_microbatches = 1;
};

struct MemoryEstimate {
  double parameters_gib = 0;  // FSDP: local shards plus two gathered units (current, prefetched)
  double gradients_gib = 0;
  double optimizer_gib = 0;  // the optimizer's state tensors (optim::state_footprint)
  double activations_gib = 0;
  double total_gib() const {
    return parameters_gib + gradients_gib + optimizer_gib + activations_gib;
  }
  std::string describe() const;
};

// `model`: what this rank holds before sharding (the whole model, or a pipeline rank's stages:
// the logits count only where the output projection is).
MemoryEstimate estimate_memory(const models::ModelSummary& model, const config::JobConfig& config,
                               const MemoryInputs& inputs);

// The summary of several model parts (a pipeline rank's stages) as one: their parameters.
models::ModelSummary combine_summaries(const std::vector<models::ModelSummary>& parts);

}  // namespace loom::metrics
