// Gradient norm per block (metrics.log_layer_grad_norms): which layer a loss spike came from.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "loom/distributed/comm.h"

namespace loom::metrics {

// The block a parameter belongs to: "layers.<i>" for a transformer block, else the first name
// component ("tok_embeddings", "norm", "output").
std::string block_of(const std::string& parameter_name);

// A local box of a parameter whose gradient counts towards its block's norm.
struct GradientBox {
  std::string name;  // the global parameter name
  at::Tensor tensor;
  bool counted = true;  // false on all but one rank of the box's replica set
};

// The L2 norm of each block's gradient before clipping, the blocks in order of first appearance
// in `model_parameters` (every parameter name of the whole model, the same list on every rank).
// Each rank holds some boxes of some parameters (FSDP shards, TP pieces, a pipeline stage's
// parameters): the counted boxes' squared norms are summed over `all_ranks` (null: one rank).
// Every rank of `all_ranks` calls it.
std::vector<std::pair<std::string, double>> block_grad_norms(
    const std::vector<std::string>& model_parameters, const std::vector<GradientBox>& local,
    distributed::Comm* all_ranks);

}  // namespace loom::metrics
