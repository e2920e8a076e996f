// Pipeline checks up front (plan.h).
#include "loom/parallel/pipeline/plan.h"

#include <functional>
#include <optional>

#include "loom/core/check.h"
#include "loom/parallel/pipeline/simulate.h"

namespace loom::parallel::pipeline {

namespace {

// Runs `step`; an InputError becomes a diagnostic under `key`, located where the key was set
// (without provenance, as the trainer calls it: the job's config file).
template <typename F>
bool collect(config::Diagnostics& problems, const config::Provenance& provenance,
             const config::Origin& unknown, const std::string& key, F&& step) {
  try {
    step();
    return true;
  } catch (const InputError& e) {
    auto it = provenance.find(key);
    problems.add(it != provenance.end()   ? it->second
                 : provenance.empty()     ? unknown
                                          : config::Origin{"defaults"},
                 key, e.message());
    return false;
  }
}

}  // namespace

PipelinePlan plan_pipeline(const config::JobConfig& c, int64_t n_layers,
                           const config::Provenance& provenance) {
  const auto& p = c.parallelism;
  const std::string prefix = "parallelism.";
  config::Diagnostics problems;
  const config::Origin unknown{c.job.config_file ? *c.job.config_file : "the job config"};
  PipelinePlan plan;
  const int64_t mbs = p.pipeline_parallel_microbatch_size;
  bool microbatches_ok =
      collect(problems, provenance, unknown, prefix + "pipeline_parallel_microbatch_size", [&] {
        LOOM_CHECK_AS(InputError, mbs >= 1 && c.training.local_batch_size % mbs == 0,
                      "must divide training.local_batch_size (", c.training.local_batch_size,
                      ") into whole microbatches, got ", mbs);
      });
  plan.microbatches = microbatches_ok ? c.training.local_batch_size / mbs : 0;

  const bool from_csv =
      p.pipeline_parallel_schedule_csv && !p.pipeline_parallel_schedule_csv->empty();
  std::optional<Schedule> csv;
  std::optional<ScheduleKind> kind;
  bool schedule_ok =
      from_csv
          ? collect(problems, provenance, unknown, prefix + "pipeline_parallel_schedule_csv",
                    [&] {
                      csv = load_schedule_csv(*p.pipeline_parallel_schedule_csv);
                      LOOM_CHECK_AS(InputError, csv->pp == p.pipeline_parallel_degree,
                                    "the schedule has ", csv->pp,
                                    " rows (ranks) but parallelism.pipeline_parallel_degree is ",
                                    p.pipeline_parallel_degree);
                    })
          : collect(problems, provenance, unknown, prefix + "pipeline_parallel_schedule",
                    [&] { kind = parse_schedule_kind(p.pipeline_parallel_schedule); });

  const std::string split_key = p.module_fqns_per_model_part ? "module_fqns_per_model_part"
                                : p.pipeline_parallel_layers_per_stage
                                    ? "pipeline_parallel_layers_per_stage"
                                    : "pipeline_parallel_degree";
  bool split_ok = schedule_ok && collect(problems, provenance, unknown, prefix + split_key, [&] {
                    plan.split = split_stages(
                        p, n_layers, csv ? std::optional<int>(csv->stages()) : std::nullopt);
                  });

  if (split_ok && microbatches_ok) {
    if (csv) {
      collect(problems, provenance, unknown, prefix + "pipeline_parallel_schedule_csv", [&] {
        LOOM_CHECK_AS(InputError, csv->microbatches == plan.microbatches, "the schedule runs ",
                      csv->microbatches,
                      " microbatches but training.local_batch_size / "
                      "parallelism.pipeline_parallel_microbatch_size = ",
                      plan.microbatches);
        plan.schedule = *csv;
      });
    } else {
      collect(problems, provenance, unknown, prefix + "pipeline_parallel_microbatch_size", [&] {
        plan.schedule = make_schedule(*kind, plan.split.pp, plan.split.stages_per_rank,
                                      static_cast<int>(plan.microbatches));
        validate_schedule(plan.schedule);
      });
    }
  }
  problems.throw_if_any();
  return plan;
}

}  // namespace loom::parallel::pipeline
