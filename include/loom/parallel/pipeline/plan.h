// Pipeline parallelism's checks up front: everything the job's keys decide about the pipeline
// (the stage split, the microbatch count, the schedule), computed and validated before any
// process group exists, so that a bad combination fails on every rank with the keys named
// instead of hanging in a send or receive. `loom config validate` and the trainer call it.
#pragma once

#include <cstdint>

#include "loom/config/diagnostics.h"
#include "loom/config/job_config.h"
#include "loom/parallel/pipeline/schedule.h"
#include "loom/parallel/pipeline/stage_split.h"

namespace loom::parallel::pipeline {

struct PipelinePlan {
  StageSplit split;
  Schedule schedule;  // with communication; validated
  int64_t microbatches = 1;
};

// microbatches = training.local_batch_size / parallelism.pipeline_parallel_microbatch_size; the
// split from the model's n_layers; the schedule from pipeline_parallel_schedule or
// pipeline_parallel_schedule_csv. Throws config::ConfigError listing every problem, each under
// its key and where the key was set (`provenance`, as the config loader returns it).
PipelinePlan plan_pipeline(const config::JobConfig& config, int64_t n_layers,
                           const config::Provenance& provenance = {});

}  // namespace loom::parallel::pipeline
