// The mixture-of-experts side of parallelize_decoder, after the wrappers materialized the
// parameters: the routed tokens' dispatch over the ep group (parallel/expert_parallel.h), the
// job's routing settings (debug.moe_force_load_balance, model.moe_load_balance_coeff,
// model.moe_aux_loss_coeff), each layer's balancing bias as checkpointed state, the auxiliary
// loss's scale, and the hook after each optimizer step that updates the biases from the token
// counts of every rank and reports the load metrics ("moe/..." in metrics.jsonl).
#pragma once

#include <memory>
#include <vector>

#include "loom/protocols/causal_lm.h"
#include "loom/parallel/parallelize.h"

namespace loom::models {

// Does nothing for parts without mixture-of-experts layers.
void parallelize_moe_layers(parallel::ParallelModel& out,
                            const std::vector<std::unique_ptr<CausalLM>>& parts,
                            const parallel::ParallelContext& context);

}  // namespace loom::models
