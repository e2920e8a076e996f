// What this build of loom can train: the parallel degrees and features that are implemented,
// checked before the rendezvous so that every rank fails the same way, naming the keys, instead
// of some ranks hanging in a collective.
#pragma once

#include "loom/config/diagnostics.h"
#include "loom/config/job_config.h"

namespace loom::train {

// Throws InputError naming the keys of the first unimplemented degree or feature (context
// parallelism, async TP, float8 converters), of degrees the model's flavor cannot split (heads
// not divisible by tensor_parallel_degree), or a config::ConfigError listing every problem of
// the pipeline plan (stage split, microbatches, schedule), located by `provenance` when given.
void check_supported_features(const config::JobConfig& config,
                              const config::Provenance& provenance = {});

}  // namespace loom::train
