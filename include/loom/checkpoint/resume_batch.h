// Elastic resume keeps the global batch: a job restarted on another world size (a node lost or
// added) goes on with the batch its checkpoint was trained with, and the accumulation steps
// adjust, so the loss curve continues. The trainer asks here before it sizes its batches.
#pragma once

#include <cstdint>
#include <optional>

#include "loom/config/job_config.h"

namespace loom::checkpoint {

// The global batch (samples per step) recorded in the step the checkpoint manager would resume
// from (checkpoint.load_step, else the newest complete step of the run's folder); nullopt when
// checkpointing is off, there is no such step, or the step predates the record.
std::optional<int64_t> resumable_global_batch(const config::JobConfig& config);

// The seed recorded in that step (the run's effective debug.seed, drawn when unset), so that a
// run without debug.seed resumes its data order; nullopt as above.
std::optional<int64_t> resumable_seed(const config::JobConfig& config);

// training.global_batch_size when set (> 0); else, on resume, the checkpoint's global batch
// (logged when it differs from local_batch_size x dp); else local_batch_size x dp. Throws
// loom::InputError naming the keys when the batch does not split into dp x local batches.
int64_t resolve_global_batch(const config::JobConfig& config, int64_t dp);

}  // namespace loom::checkpoint
