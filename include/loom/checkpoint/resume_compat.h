// Resuming with a changed config: which keys changed since a checkpoint was written, and
// whether the state being loaded can follow each change. A change the loaded state cannot
// follow (training.seq_len with the data loader's position, model.flavor with the weights) is
// a user's decision, not a corrupt checkpoint: it is named once with what to do, and the run
// stops (InputError, exit 2) instead of falling back to older checkpoints that share the problem.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "loom/config/job_config.h"

namespace loom::checkpoint {

struct ConfigChange {
  std::string key;  // "training.seq_len"
  std::string saved, current;  // values as JSON text
};

// Every key whose value differs (flattened "section.key" of the effective configs).
std::vector<ConfigChange> config_changes(const config::JobConfig& saved,
                                         const config::JobConfig& current);

// The changes that the parts being loaded cannot follow, each with what it means and what to do;
// empty when resuming is fine. `model_only`: only the weights are loaded.
std::vector<std::string> resume_conflicts(const std::vector<ConfigChange>& changes,
                                          const config::JobConfig& current, bool model_only);

// Compares `step_folder`/config.toml (when there is one) with `current`: logs the harmless
// changes once, throws InputError naming the conflicting ones. Returns the saved config (nullopt
// when the folder has none, or it is unreadable).
std::optional<config::JobConfig> check_resume_compatible(const std::string& step_folder,
                                                         const config::JobConfig& current,
                                                         bool model_only);

}  // namespace loom::checkpoint
