#include "loom/parallel/parallelize.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "loom/core/check.h"
#include "loom/distributed/parallel_dims.h"

namespace loom::parallel {

bool uses_fsdp(const distributed::ParallelDims& dims, const config::JobConfig& config) {
  return dims.dp_shard * dims.cp > 1 || config.debug.force_fsdp;
}

std::vector<at::Tensor> ParallelModel::tensors() const {
  std::vector<at::Tensor> out;
  out.reserve(parameters.size());
  for (const auto& p : parameters) out.push_back(p.tensor);
  return out;
}

std::vector<Placement> ParallelModel::placements() const {
  std::vector<Placement> out;
  out.reserve(parameters.size());
  for (const auto& p : parameters) out.push_back(p.placement);
  return out;
}

at::Tensor materialize_local(models::CausalLM& model, const std::string& name,
                             const Placement& placement, const at::TensorOptions& options,
                             uint64_t seed) {
  at::NoGradGuard no_grad;
  // The global draw, one parameter at a time: the box's values do not depend on the layout.
  // Drawn in float32 whatever the parameters' dtype, so that a bfloat16 model starts from the
  // float32 model's values, rounded.
  at::Tensor global = at::empty(placement.global_shape, options.dtype(at::kFloat));
  model.init_parameter(name, global, seed);
  global = global.to(options.dtype());
  if (placement.is_whole()) return global;
  return local_view(global, placement).clone();
}

}  // namespace loom::parallel
