#include "loom/train/supported_features.h"

#include "loom/core/check.h"
#include "loom/core/strings.h"
#include "loom/models/model_spec.h"

namespace loom::train {

void check_supported_features(const config::JobConfig& config) {
  const auto& p = config.parallelism;
  LOOM_CHECK_AS(InputError, p.pipeline_parallel_degree == 1 && p.context_parallel_degree == 1,
                "parallelism: pipeline and context parallel degrees other than 1 are not "
                "implemented yet (pipeline_parallel_degree = ",
                p.pipeline_parallel_degree, ", context_parallel_degree = ",
                p.context_parallel_degree, ")");
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
}

}  // namespace loom::train
