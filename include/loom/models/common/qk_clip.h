// QK-clip (MuonClip, Kimi K2; Megatron-Core's qk_clip): after each optimizer step, every
// attention head whose largest logit of the step S_h (max_logits.h) passed the threshold tau has
// its query and key projections scaled down, so that the step's inputs would now give at most
// tau: gamma_h = tau / max(S_h, tau), split between query and key by alpha.
//
//   grouped-query  wq rows of head h     *= gamma_h ^ alpha
//                  wk rows of kv head g  *= (min of gamma over g's query heads) ^ (1 - alpha)
//                  (each head's logit shrinks by at least gamma_h; heads sharing a key with an
//                  offender shrink too; Megatron instead scales the whole group by its max)
//   latent (MLA)   wq / wq_b rows of head h: the no-rope part *= gamma^alpha, the rope part *=
//                  gamma; wkv_b's key rows of head h *= gamma^(1 - alpha); values and the shared
//                  rotary key (wkv_a) stay, so no other head changes (Kimi K2's rule)
//
// Weights and their biases (the bound stays exact); optimizer state is untouched. Each rank scales
// the rows of its own box (tensor-parallel heads, FSDP row shards) after S is reduced (max) over
// the ranks holding the same heads (data and context parallel). QK-norm makes it moot (the norm
// undoes a scale), so such models refuse it (check_decoder_parallelism).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "loom/models/common/attention.h"
#include "loom/models/common/latent_attention.h"
#include "loom/parallel/parallelize.h"
#include "loom/protocols/causal_lm.h"

namespace loom::models {

struct QkClipOptions {
  double threshold = 100.0;  // tau (optimizer.qk_clip_threshold)
  double alpha = 0.5;        // the query's share of the scale (optimizer.qk_clip_alpha)
};

// gamma per local query head [h] (float): tau / max(S, tau), 1 where S <= tau or -inf.
at::Tensor qk_clip_gammas(const at::Tensor& max_logits, double threshold);

// The factors of the rows of this rank's tensor-parallel piece of a layer's projections, by
// module name under the attention ("wq" -> [rows] float, for its weight and bias), from the
// gammas of the local query heads.
using RowFactors = std::vector<std::pair<std::string, at::Tensor>>;
RowFactors grouped_query_row_factors(const at::Tensor& gammas, int64_t kv_heads, int64_t head_dim,
                                     double alpha);
// `query_module`: "wq" (no query LoRA) or "wq_b".
RowFactors latent_row_factors(const at::Tensor& gammas, const MLAArgs& mla,
                              const std::string& query_module, double alpha);

// Turns the statistic on in every attention layer of `parts` and returns ParallelModel's
// after-step hook: reduce S over `same_heads` (max), scale the local boxes of `parameters`,
// reset S; on logged steps {"max_attention_logit": the max over every layer and head, reduced
// over `all_ranks`}. A skipped step (AfterStep::skipped) scales nothing.
std::function<parallel::ModelMetrics(const parallel::AfterStep& step)> make_qk_clip(
    const std::vector<std::unique_ptr<CausalLM>>& parts,
    const std::vector<parallel::ModelParameter>& parameters, const QkClipOptions& options,
    std::shared_ptr<distributed::Comm> same_heads, std::shared_ptr<distributed::Comm> all_ranks);

}  // namespace loom::models
