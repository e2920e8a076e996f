#include "loom/train/supported_features.h"

#include <functional>

#include "loom/core/check.h"
#include "loom/core/strings.h"
#include "loom/models/model_spec.h"
#include "loom/parallel/pipeline/plan.h"
#include "loom/parallel/pipeline/schedule.h"
#include "loom/quantize/convert.h"

namespace loom::train {

bool collect_problem(std::vector<std::string>& problems, const std::function<void()>& check) {
  try {
    check();
    return true;
  } catch (const Error& e) {
    problems.push_back(e.message());
    return false;
  }
}

bool degrees_supported(const config::ParallelismSection& /*p*/) {
  return true;
}

std::vector<std::string> unsupported_features(const config::JobConfig& config,
                                              const config::Provenance& provenance) {
  std::vector<std::string> problems;
  const auto& p = config.parallelism;
  if (p.enable_async_tensor_parallel) {
    problems.push_back(
        "parallelism.enable_async_tensor_parallel = true: async tensor parallelism (overlapping "
        "TP's all-gathers with the matmuls) is not implemented yet; set it to false");
  }
  for (auto& problem : quantize::converter_problems(config)) problems.push_back(problem);
  const models::ModelSpec* spec = nullptr;
  if (!collect_problem(problems, [&] { spec = &models::job_model_spec(config); })) {
    return problems;  // the rest needs the model's shape
  }
  if (spec->check_parallelism) collect_problem(problems, [&] { spec->check_parallelism(config); });
  // The stage split, microbatch count and schedule: on every rank before the rendezvous, so a
  // bad combination is an error naming the keys, never a hang in a send or receive.
  if (p.pipeline_parallel_degree > 1) {
    collect_problem(problems, [&] { models::plan_pipeline(config, provenance); });
  } else if (!p.pipeline_parallel_schedule_csv || p.pipeline_parallel_schedule_csv->empty()) {
    // Unused at pp = 1, but a misspelled name is still a mistake, found before pp grows.
    collect_problem(problems,
                    [&] { parallel::pipeline::parse_schedule_kind(p.pipeline_parallel_schedule); });
  }
  return problems;
}

}  // namespace loom::train
