#include "loom/train/preflight.h"

#include <fmt/format.h>

#include <functional>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/data/columnar.h"
#include "loom/data/documents.h"
#include "loom/data/packed_loader.h"
#include "loom/data/shards.h"
#include "loom/distributed/parallel_dims.h"
#include "loom/models/model_spec.h"
#include "loom/optim/registry.h"
#include "loom/train/memory_check.h"
#include "loom/train/supported_features.h"
#include "loom/train/trainer.h"

namespace loom::train {
namespace {

// The ranks of one data-parallel group when dp_shard is -1: any multiple of the other degrees.
int64_t fixed_degrees(const config::ParallelismSection& p) {
  return p.pipeline_parallel_degree * p.data_parallel_replicate_degree * p.context_parallel_degree *
         p.tensor_parallel_degree *
         (p.data_parallel_shard_degree > 0 ? p.data_parallel_shard_degree
                                           : p.expert_parallel_degree);  // ep divides dp_shard
}

void check_dataset(const std::string& name, const std::optional<std::string>& path,
                   const config::StringList& mixture, const std::string& text_field,
                   const std::string& section) {
  if (!mixture.empty() || (name == "synthetic" && !path)) return;
  const std::string location = data::dataset_location(name, path, section + ".dataset");
  if (data::is_prepared_dataset(location)) return;
  try {
    // Columnar files' schemas (footer and schema only, no rows): the text column must be there
    // before any rank starts, not when the loader first reaches the file.
    constexpr size_t kSchemasChecked = 64;
    size_t checked = 0;
    const auto files = data::expand_dataset_path(location);
    LOOM_CHECK_AS(InputError, !files.empty(), "'", location,
                  "' holds no dataset file (.jsonl, .json, .txt, .parquet, .arrow)");
    for (const auto& file : files) {
      files::require_regular_file(file, "dataset file");  // a missing one, before any rank starts
      if (!data::is_columnar_file(file) || checked++ == kSchemasChecked) continue;
      data::ColumnarFile(file, text_field);
    }
  } catch (const Error& e) {
    LOOM_THROW(InputError, section, path ? ".dataset_path = '" : ".dataset = '",
               path ? *path : name, "' (", section, ".dataset_text_field = '", text_field,
               "'): ", e.message());
  }
}

// The layout for the world size (or the smallest the degrees allow) and the batch arithmetic.
std::optional<distributed::ParallelDims> check_layout(const config::JobConfig& config,
                                                      const PreflightWorld& world,
                                                      std::vector<std::string>& problems) {
  std::optional<distributed::ParallelDims> dims;
  collect_problem(problems, [&] {
    const auto& p = config.parallelism;
    dims = distributed::ParallelDims::from_config(p, world.world_size.value_or(fixed_degrees(p)));
    const auto& t = config.training;
    const int64_t dp = dims->dp_replicate * dims->dp_shard;
    const int64_t global = t.global_batch_size > 0 ? t.global_batch_size : t.local_batch_size * dp;
    LOOM_CHECK_AS(InputError, global % (t.local_batch_size * dp) == 0,
                  "training.global_batch_size (", global,
                  ") must be a multiple of local_batch_size x dp (", t.local_batch_size, " x ", dp,
                  world.world_size ? "" : ", the smallest world these degrees allow", ")");
  });
  return dims;
}

// Single keys whose value train refuses for reasons of its own (not the schema's ranges).
void check_training_keys(const config::JobConfig& config, const PreflightWorld& world,
                         std::vector<std::string>& problems) {
  const auto& t = config.training;
  const auto& v = config.validation;
  if (v.enable && v.seq_len > t.seq_len) {
    problems.push_back(
        fmt::format("validation.seq_len ({}) exceeds training.seq_len ({}), the "
                    "longest sequence the model is built for",
                    v.seq_len, t.seq_len));
  }
  for (auto& problem : optim::check_optimizer_section(config.optimizer)) {
    problems.push_back(std::move(problem));
  }
  // Output subfolders: refused here, before any rank writes (files::output_folder's rule).
  const std::pair<const char*, const std::string*> folders[] = {
      {"metrics.save_tb_folder", &config.metrics.save_tb_folder},
      {"profiling.save_traces_folder", &config.profiling.save_traces_folder},
      {"comm.save_traces_folder", &config.comm.save_traces_folder},
      {"checkpoint.folder", &config.checkpoint.folder}};
  for (const auto& [key, value] : folders) {
    try {
      files::output_folder(config.job.dump_folder, *value, key);
    } catch (const InputError& e) {
      problems.push_back(e.message());
    }
  }
  const auto& ft = config.fault_tolerance;
  if (ft.enable && ft.process_group == "nccl" && !world.device.is_cuda()) {
    // Otherwise every replica process group fails to form and the quorum retries forever.
    problems.push_back(
        "fault_tolerance.process_group = \"nccl\" needs a CUDA device, and this "
        "run trains on " +
        world.device.str() + ": use \"gloo\"");
  }
  if (config.metrics.step_breakdown && !world.device.is_cpu()) {
    problems.push_back("metrics.step_breakdown = true on " + world.device.str() +
                       ": it times operators on the host thread and CUDA kernels run "
                       "asynchronously; use profiling.enable_profiling");
  }
}

}  // namespace

Preflight preflight(const config::JobConfig& config, const PreflightWorld& world,
                    const config::Provenance& provenance) {
  Preflight out;
  auto& problems = out.problems;
  problems = unsupported_features(config, provenance);
  std::vector<std::string> ignored;
  const bool model_known = collect_problem(ignored, [&] { models::job_model_spec(config); });
  // The arithmetic only once the degrees themselves are ones train can run.
  std::optional<distributed::ParallelDims> dims;
  if (degrees_supported(config.parallelism)) dims = check_layout(config, world, problems);
  check_training_keys(config, world, problems);
  collect_problem(problems, [&] {
    try {
      out.tokenizer = load_job_tokenizer(config);
    } catch (const Error& e) {
      const auto& m = config.model;
      LOOM_THROW(InputError,
                 m.tokenizer_path ? "model.tokenizer_path = '" + *m.tokenizer_path + "'"
                                  : "model.hf_assets_path = '" + m.hf_assets_path + "'",
                 ": ", e.message());
    }
  });
  if (world.check_datasets) {
    const auto& t = config.training;
    collect_problem(problems, [&] {
      check_dataset(t.dataset, t.dataset_path, t.dataset_mixture, t.dataset_text_field, "training");
    });
    const auto& v = config.validation;
    if (v.enable) {
      collect_problem(problems, [&] {
        check_dataset(v.dataset, v.dataset_path, v.dataset_mixture, v.dataset_text_field,
                      "validation");
      });
    }
  }
  // Role factors need the model's parameter names: built on the meta device, and only when
  // one is set.
  const auto& o = config.optimizer;
  const bool factor_set = o.embedding_lr_factor != 1 || o.head_lr_factor != 1 ||
                          o.routing_lr_factor != 1 || o.scalar_lr_factor != 1 ||
                          o.embedding_weight_decay_factor != 1 || o.head_weight_decay_factor != 1 ||
                          o.routing_weight_decay_factor != 1 || o.scalar_weight_decay_factor != 1;
  if (model_known && factor_set) {
    collect_problem(problems, [&] {
      const auto meta = at::TensorOptions().device(at::kMeta);
      const int64_t vocab = out.tokenizer ? out.tokenizer->vocab_size() : 0;
      const auto summary =
          models::build_model(config, vocab, meta)->summary(config.training.seq_len);
      out.warnings = optim::unused_role_factors(o, summary.parameters);
    });
  }
  // Parameter state is split over FSDP's shards, the tp ranks and (roughly evenly) the pipeline
  // stages; activations are estimated whole: conservative under sequence parallelism.
  if (world.world_size && dims && model_known) {
    const bool sharded = dims->dp_shard * dims->cp > 1 || config.debug.force_fsdp;
    const int64_t shards = (sharded ? dims->dp_shard * dims->cp : 1) * dims->tp * dims->pp;
    collect_problem(problems, [&] {
      check_memory_fits(config, out.tokenizer ? out.tokenizer->vocab_size() : 0, shards,
                        world.device);
    });
  }
  return out;
}

void throw_if_refused(const std::vector<std::string>& problems, const std::string& what) {
  if (problems.empty()) return;
  std::string text = what + ":";
  for (const auto& problem : problems) text += "\n  - " + problem;
  LOOM_THROW(InputError, text);
}

std::string describe_world(const config::JobConfig& config, std::optional<int64_t> world_size) {
  const auto& p = config.parallelism;
  if (!world_size) {
    const int64_t fixed = fixed_degrees(p);
    return p.data_parallel_shard_degree == -1
               ? fmt::format(
                     "runs on any world size that is a multiple of {} (pass --world-size "
                     "N to check one)",
                     fixed)
               : fmt::format("needs a world size of exactly {}", fixed);
  }
  const auto dims = distributed::ParallelDims::from_config(p, *world_size);
  return fmt::format("world size {}: pp {}, dp_replicate {}, dp_shard {}, cp {}, tp {}",
                     *world_size, dims.pp, dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp);
}

}  // namespace loom::train
