#include "loom/train/supported_features.h"

#include "loom/core/check.h"
#include "loom/core/strings.h"
#include "loom/models/model_spec.h"
#include "loom/parallel/pipeline/plan.h"

namespace loom::train {

void check_supported_features(const config::JobConfig& config,
                              const config::Provenance& provenance) {
  const auto& p = config.parallelism;
  LOOM_CHECK_AS(InputError, p.context_parallel_degree == 1,
                "parallelism.context_parallel_degree = ", p.context_parallel_degree,
                ": context parallelism is not implemented yet; set it to 1");
  LOOM_CHECK_AS(InputError, !p.enable_async_tensor_parallel,
                "parallelism.enable_async_tensor_parallel: async tensor parallelism (overlapping "
                "TP's all-gathers with the matmuls) is not implemented yet; set it to false");
  LOOM_CHECK_AS(InputError, config.model.converters.empty(),
                "model.converters = [", strings::join(config.model.converters, ", "),
                "]: model converters (float8 linear layers) are not implemented yet; remove "
                "the key");
  const auto& spec = models::find_model_spec(config.model.name);
  models::check_flavor(spec, config.model.flavor);
  if (spec.check_parallelism) spec.check_parallelism(config);
  // The stage split, microbatch count and schedule: on every rank before the rendezvous, so a
  // bad combination is an error naming the keys, never a hang in a send or receive.
  if (p.pipeline_parallel_degree > 1) {
    parallel::pipeline::plan_pipeline(config, models::count_layers(config), provenance);
  }
}

}  // namespace loom::train
