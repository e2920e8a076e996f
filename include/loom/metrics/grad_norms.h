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

// The L2 norm of each block's gradient, in order of first appearance, before clipping. Each
// rank holds `parameters` whole or as shards: `shard_group` (FSDP's) sums the squared norms of
// the shards, null when the gradients are whole. Every rank of `shard_group` calls it.
std::vector<std::pair<std::string, double>> block_grad_norms(
    const std::vector<std::pair<std::string, at::Tensor>>& parameters,
    distributed::Comm* shard_group);

}  // namespace loom::metrics
