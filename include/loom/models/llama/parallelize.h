// How Llama 3 is parallelized (registered on its ModelSpec): tensor and sequence parallelism
// (tensor_parallel_plan), activation checkpointing, then FSDP/HSDP (units: the embedding, each
// block, [norm + output]) or DDP, the materialization of every local parameter, and TP's
// gradient all-reduce of the sequence-parallel norms.
#pragma once

#include <memory>
#include <vector>

#include "loom/models/causal_lm.h"
#include "loom/parallel/fsdp.h"
#include "loom/parallel/parallelize.h"
#include "loom/parallel/tensor_parallel.h"

namespace loom::models::llama {

parallel::ParallelModel parallelize_llama(std::vector<std::unique_ptr<CausalLM>> parts,
                                          const parallel::ParallelContext& context);

// The tensor-parallel plan as data (module -> style), torchtitan's for Llama: column-parallel
// wq/wk/wv/w1/w3, row-parallel wo/w2, vocab-parallel embedding, sequence-parallel norms, the
// output column-parallel (logits kept vocabulary-sharded for the loss with `loss_parallel`).
std::vector<parallel::TpRule> tensor_parallel_plan(bool loss_parallel);

// Throws InputError, naming the keys, where the job's degrees do not fit the flavor (heads that
// do not divide by tensor_parallel_degree). Runs before the rendezvous.
void check_llama_parallelism(const config::JobConfig& config);

// FSDP's units for a Llama model part, in forward order.
std::vector<parallel::FsdpUnit> fsdp_units(CausalLM& model);

}  // namespace loom::models::llama
