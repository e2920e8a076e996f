#include "loom/distributed/parallel_dims.h"

#include <optional>
#include <utility>
#include <vector>

#include "loom/core/check.h"

namespace loom::distributed {
namespace {

using Factor = std::pair<const char*, int64_t>;  // config key (without "parallelism."), degree

// The product of the degrees, or nullopt when it does not fit in int64 (only absurd configs).
std::optional<int64_t> product(const std::vector<Factor>& factors) {
  int64_t result = 1;
  for (const auto& [key, degree] : factors) {
    if (__builtin_mul_overflow(result, degree, &result)) return std::nullopt;
  }
  return result;
}

// "pipeline_parallel_degree (2) x context_parallel_degree (1) = 2"
std::string product_text(const std::vector<Factor>& factors) {
  std::string text;
  for (const auto& [key, degree] : factors) {
    if (!text.empty()) text += " x ";
    text += detail::concat(key, " (", degree, ")");
  }
  auto total = product(factors);
  return text + (total ? detail::concat(" = ", *total) : std::string(" = more than 2^63"));
}

void check_degree(const char* key, int64_t degree) {
  LOOM_CHECK_AS(InputError, degree >= 1, "parallelism.", key, " must be >= 1, got ", degree);
}

}  // namespace

ParallelDims ParallelDims::from_config(const config::ParallelismSection& p, int64_t world_size) {
  LOOM_CHECK_AS(InputError, world_size >= 1, "the world size must be >= 1, got ", world_size);
  check_degree("pipeline_parallel_degree", p.pipeline_parallel_degree);
  check_degree("data_parallel_replicate_degree", p.data_parallel_replicate_degree);
  check_degree("context_parallel_degree", p.context_parallel_degree);
  check_degree("tensor_parallel_degree", p.tensor_parallel_degree);
  check_degree("expert_parallel_degree", p.expert_parallel_degree);
  check_degree("expert_tensor_parallel_degree", p.expert_tensor_parallel_degree);
  LOOM_CHECK_AS(InputError, p.data_parallel_shard_degree == -1 || p.data_parallel_shard_degree >= 1,
                "parallelism.data_parallel_shard_degree must be >= 1, or -1 for the ranks left "
                "over by the other degrees, got ",
                p.data_parallel_shard_degree);
  ParallelDims dims;
  dims.pp = p.pipeline_parallel_degree;
  dims.dp_replicate = p.data_parallel_replicate_degree;
  dims.cp = p.context_parallel_degree;
  dims.tp = p.tensor_parallel_degree;
  dims.ep = p.expert_parallel_degree;
  dims.world_size = world_size;
  dims.disable_loss_parallel = p.disable_loss_parallel;

  if (p.data_parallel_shard_degree == -1) {
    std::vector<Factor> others = {{"pipeline_parallel_degree", dims.pp},
                                  {"data_parallel_replicate_degree", dims.dp_replicate},
                                  {"context_parallel_degree", dims.cp},
                                  {"tensor_parallel_degree", dims.tp}};
    auto rest = product(others);
    LOOM_CHECK_AS(InputError, rest && world_size % *rest == 0,
                  "parallelism: data_parallel_shard_degree = -1 takes the ranks left over, but "
                  "the world size ",
                  world_size, " is not a multiple of ", product_text(others));
    dims.dp_shard = world_size / *rest;
  } else {
    dims.dp_shard = p.data_parallel_shard_degree;
  }

  std::vector<Factor> all = {{"pipeline_parallel_degree", dims.pp},
                             {"data_parallel_replicate_degree", dims.dp_replicate},
                             {"data_parallel_shard_degree", dims.dp_shard},
                             {"context_parallel_degree", dims.cp},
                             {"tensor_parallel_degree", dims.tp}};
  auto total = product(all);
  LOOM_CHECK_AS(InputError, total && *total == world_size, "parallelism: ", product_text(all),
                ", but the world size is ", world_size);
  // Expert parallelism borrows its ranks from dp_shard (torchtitan borrows from dp_shard x cp;
  // loom has no context parallelism yet).
  LOOM_CHECK_AS(InputError, dims.dp_shard % dims.ep == 0,
                "parallelism.expert_parallel_degree = ", dims.ep,
                " must divide data_parallel_shard_degree = ", dims.dp_shard,
                ": expert-parallel ranks are taken from the FSDP ranks, which split the tokens");
  LOOM_CHECK_AS(InputError,
                p.expert_tensor_parallel_degree == 1 || p.expert_tensor_parallel_degree == dims.tp,
                "parallelism.expert_tensor_parallel_degree = ", p.expert_tensor_parallel_degree,
                " must be 1 or tensor_parallel_degree (", dims.tp,
                "): experts are split over the tensor-parallel ranks like the dense layers");
  return dims;
}

std::string ParallelDims::describe() const {
  return detail::concat("world ", world_size, " = pp ", pp, " x dp_replicate ", dp_replicate,
                        " x dp_shard ", dp_shard, " x cp ", cp, " x tp ", tp,
                        ep > 1 ? detail::concat(" (ep ", ep, " of dp_shard)") : std::string());
}

std::string ParallelDims::layout() const {
  return detail::concat("pp ", pp, ", dp_replicate ", dp_replicate, ", dp_shard ", dp_shard,
                        ", cp ", cp, ", tp ", tp,
                        ep > 1 ? detail::concat(", ep ", ep) : std::string());
}

}  // namespace loom::distributed
