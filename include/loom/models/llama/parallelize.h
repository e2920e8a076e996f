// How Llama 3 is parallelized (registered on its ModelSpec): tensor parallelism (when it lands),
// activation checkpointing, then FSDP/HSDP (units: the embedding, each block, [norm + output])
// or DDP, and the materialization of every local parameter.
#pragma once

#include <memory>
#include <vector>

#include "loom/models/causal_lm.h"
#include "loom/parallel/fsdp.h"
#include "loom/parallel/parallelize.h"

namespace loom::models::llama {

parallel::ParallelModel parallelize_llama(std::unique_ptr<CausalLM> model,
                                          const parallel::ParallelContext& context);

// FSDP's units for a Llama model part, in forward order.
std::vector<parallel::FsdpUnit> fsdp_units(CausalLM& model);

}  // namespace loom::models::llama
