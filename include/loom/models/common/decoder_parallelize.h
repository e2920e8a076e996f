// How the shared decoder's families (llama3, qwen3) are parallelized, registered on their
// ModelSpecs: tensor and sequence parallelism (decoder_tensor_parallel_plan), activation
// checkpointing, then FSDP/HSDP (units: the embedding, each block, [norm + output]; with tied
// embeddings the table's unit spans the whole forward) or DDP, the materialization of every local
// parameter, TP's gradient all-reduce of the replicated norms, and under pipeline parallelism the
// sum of a tied table's gradients between the first and last stages. Mixture-of-experts layers
// split their routed experts over the ep group (parallel/expert_parallel.h), the rest as above.
#pragma once

#include <memory>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/protocols/causal_lm.h"
#include "loom/models/common/decoder_args.h"
#include "loom/parallel/fsdp.h"
#include "loom/parallel/parallelize.h"
#include "loom/parallel/tensor_parallel.h"

namespace loom::models {

// Every part must be a DecoderModel built on the meta device.
parallel::ParallelModel parallelize_decoder(std::vector<std::unique_ptr<CausalLM>> parts,
                                            const parallel::ParallelContext& context);

// The tensor-parallel plan of one decoder part as data (module -> style), torchtitan's:
// column-parallel wq/wk/wv/w1/w3, row-parallel wo/w2, vocab-parallel embedding, sequence-parallel
// norms, q/k norms replicated with partial gradients, the output column-parallel (logits kept
// vocabulary-sharded for the loss with `loss_parallel`); a tied head projects with the
// embedding's vocabulary rows, which are the rows a column-parallel output would hold.
std::vector<parallel::TpRule> decoder_tensor_parallel_plan(const CausalLM& part,
                                                           bool loss_parallel);

// Throws InputError, naming the keys, where the job's degrees do not fit `args` (heads that do
// not divide by tensor_parallel_degree). Runs before the rendezvous.
void check_decoder_parallelism(const DecoderArgs& args, const config::JobConfig& config);

// FSDP's units for a decoder part, in forward order. A mixture-of-experts block's routed experts
// form a unit of their own after the block's (around its moe module, as torchtitan wraps
// moe.experts), sharded over `expert_group` (null: the wrapper's group).
std::vector<parallel::FsdpUnit> decoder_fsdp_units(
    CausalLM& model, std::shared_ptr<distributed::Comm> expert_group = nullptr);

}  // namespace loom::models
