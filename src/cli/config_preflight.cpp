#include "config_preflight.h"

#include <fmt/format.h>

#include <filesystem>
#include <functional>

#include "loom/core/check.h"
#include "loom/data/documents.h"
#include "loom/data/packed_loader.h"
#include "loom/data/shards.h"
#include "loom/distributed/parallel_dims.h"
#include "loom/train/supported_features.h"
#include "loom/train/trainer.h"

namespace loom::cli {
namespace {

// Runs a check, keeping its InputError's message as a problem.
void collect(std::vector<std::string>& problems, const std::function<void()>& check) {
  try {
    check();
  } catch (const Error& e) {
    problems.push_back(e.message());
  }
}

// The ranks of one data-parallel group when dp_shard is -1: any multiple of the other degrees.
int64_t fixed_degrees(const config::ParallelismSection& p) {
  return p.pipeline_parallel_degree * p.data_parallel_replicate_degree *
         p.context_parallel_degree * p.tensor_parallel_degree *
         (p.data_parallel_shard_degree > 0 ? p.data_parallel_shard_degree : 1);
}

void check_dataset(const std::string& name, const std::optional<std::string>& path,
                   const config::StringList& mixture, const std::string& section) {
  if (!mixture.empty() || (name == "synthetic" && !path)) return;
  const std::string location = data::dataset_location(name, path, section + ".dataset");
  if (data::is_prepared_dataset(location)) return;
  try {
    data::expand_dataset_path(location);
  } catch (const Error& e) {
    LOOM_THROW(InputError, section, path ? ".dataset_path = '" : ".dataset = '",
               path ? *path : name, "': ", e.message());
  }
}

}  // namespace

std::vector<std::string> preflight_problems(const config::JobConfig& config,
                                            const PreflightWorld& world,
                                            const config::Provenance& provenance) {
  std::vector<std::string> problems;
  const auto& p = config.parallelism;
  const size_t before = problems.size();
  collect(problems, [&] { train::check_supported_features(config, provenance); });
  // The arithmetic only once the degrees themselves are ones train can run.
  if (problems.size() == before) {
    collect(problems, [&] {
      const int64_t world_size = world.world_size.value_or(fixed_degrees(p));
      const auto dims = distributed::ParallelDims::from_config(p, world_size);
      const auto& t = config.training;
      const int64_t dp = dims.dp_replicate * dims.dp_shard;
      const int64_t global = t.global_batch_size > 0 ? t.global_batch_size : t.local_batch_size * dp;
      LOOM_CHECK_AS(InputError, global % (t.local_batch_size * dp) == 0,
                    "training.global_batch_size (", global,
                    ") must be a multiple of local_batch_size x dp (", t.local_batch_size, " x ",
                    dp, world.world_size ? "" : ", the smallest world these degrees allow", ")");
    });
  }
  collect(problems, [&] {
    try {
      train::load_job_tokenizer(config);
    } catch (const Error& e) {
      const auto& m = config.model;
      LOOM_THROW(InputError,
                 m.tokenizer_path ? "model.tokenizer_path = '" + *m.tokenizer_path + "'"
                                  : "model.hf_assets_path = '" + m.hf_assets_path + "'",
                 ": ", e.message());
    }
  });
  const auto& t = config.training;
  collect(problems, [&] { check_dataset(t.dataset, t.dataset_path, t.dataset_mixture, "training"); });
  const auto& v = config.validation;
  if (v.enable) {
    collect(problems,
            [&] { check_dataset(v.dataset, v.dataset_path, v.dataset_mixture, "validation"); });
  }
  return problems;
}

std::string describe_world(const config::JobConfig& config, const PreflightWorld& world) {
  const auto& p = config.parallelism;
  if (!world.world_size) {
    const int64_t fixed = fixed_degrees(p);
    return p.data_parallel_shard_degree == -1
               ? fmt::format("runs on any world size that is a multiple of {} (pass --world-size "
                             "N to check one)",
                             fixed)
               : fmt::format("needs a world size of exactly {}", fixed);
  }
  const auto dims = distributed::ParallelDims::from_config(p, *world.world_size);
  return fmt::format("world size {}: pp {}, dp_replicate {}, dp_shard {}, cp {}, tp {}",
                     *world.world_size, dims.pp, dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp);
}

}  // namespace loom::cli
