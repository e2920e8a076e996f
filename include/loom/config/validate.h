// Checks of a complete JobConfig: ranges and choices of single keys (from the schema), then rules
// that involve several keys. Problems go to `diagnostics`, located through `provenance`.
#pragma once

#include "loom/config/diagnostics.h"
#include "loom/config/job_config.h"

namespace loom::config {

void validate(const JobConfig& config, const Provenance& provenance, Diagnostics& diagnostics);

}  // namespace loom::config
