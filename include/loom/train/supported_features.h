// What this build of loom can train: the parallel degrees and features that are implemented,
// checked before the rendezvous so that every rank fails the same way, naming the keys, instead
// of some ranks hanging in a collective.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "loom/config/diagnostics.h"
#include "loom/config/job_config.h"

namespace loom::train {

// Runs `check`; a loom Error it throws becomes one more entry of `problems` (its message, without
// the source location), so that a validation lists every problem at once. Returns whether the
// check passed.
bool collect_problem(std::vector<std::string>& problems, const std::function<void()>& check);

// Every unimplemented degree or feature (context and expert parallelism, async TP, float8
// converters), an unknown model or flavor, degrees the flavor cannot split (heads not divisible
// by tensor_parallel_degree), and the problems of the pipeline plan (stage split, microbatches,
// schedule; located by `provenance` when given), each naming its keys. Empty when all is
// supported.
std::vector<std::string> unsupported_features(const config::JobConfig& config,
                                              const config::Provenance& provenance = {});

// Whether the parallel degrees alone are ones this build runs (context and expert parallelism
// are not): the layout arithmetic is only meaningful then.
bool degrees_supported(const config::ParallelismSection& parallelism);

}  // namespace loom::train
