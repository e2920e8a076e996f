// Everything `loom train` refuses about a job before it builds anything (no rendezvous, no model,
// no data read), collected in one pass so that a user fixes them all at once. `loom train` and
// `loom config validate` both call preflight(), so what validate passes, train starts.
//
// Problems that depend on what only a running job sees (a checkpoint's saved global batch or
// config on resume, the GPUs of each node) stay with the parts that meet them.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/diagnostics.h"
#include "loom/config/job_config.h"
#include "loom/data/tokenizer.h"

namespace loom::train {

struct PreflightWorld {
  // The job's world size; nullopt: the layout arithmetic is checked for the smallest world the
  // degrees allow, and the memory check (which needs the sharding degree) is skipped.
  std::optional<int64_t> world_size;
  at::Device device = at::kCPU;  // where the job would train (training.device resolved)
  bool check_datasets = true;    // false when the caller brings its own batch sources
};

struct Preflight {
  // In the order train meets them: unimplemented degrees and features, the model, the pipeline
  // plan, the layout and batch arithmetic, the sequence lengths, the optimizer, the tokenizer, the
  // datasets, then whether the job fits in memory. Empty when train would start.
  std::vector<std::string> problems;
  // The job's tokenizer when it loaded (null for synthetic data or when it failed).
  std::unique_ptr<data::Tokenizer> tokenizer;
  // Keys set to a value the model leaves without effect (optim::unused_role_factors), each
  // with why: train and validate warn, neither refuses.
  std::vector<std::string> warnings;
};

Preflight preflight(const config::JobConfig& config, const PreflightWorld& world,
                    const config::Provenance& provenance = {});

// "<what> cannot start:\n  - problem\n  - ..." as an InputError; nothing when there is none.
void throw_if_refused(const std::vector<std::string>& problems, const std::string& what);

// One line describing the layout a world size gives, or the world sizes the degrees allow.
std::string describe_world(const config::JobConfig& config, std::optional<int64_t> world_size);

}  // namespace loom::train
