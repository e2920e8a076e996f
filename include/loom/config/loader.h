// Loading a job config: defaults, then a TOML or JSON file, then command-line overrides
// (precedence CLI > file > defaults), then validation. Every problem is reported at once.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "loom/config/diagnostics.h"
#include "loom/config/job_config.h"

namespace loom::config {

// One `--section.key value` from the command line; no value means a boolean flag set to true.
struct Override {
  std::string key;  // "training.steps"
  std::optional<std::string> value;
};

struct LoadedConfig {
  JobConfig config;
  Provenance provenance;
  // Keys set by the user that loom accepts for torchtitan compatibility but does not implement.
  std::vector<std::string> unimplemented_keys;
  // Keys set by the user that another key's value makes inert in this job, each with why
  // ("model.mtp_scale (model.num_mtp_layers = 0)").
  std::vector<std::string> inert_keys;
};

// Reads `path` (.toml or .json; none = defaults only), applies the overrides and validates.
// An override of job.config_file names the file when `path` is empty. Throws ConfigError listing
// every problem, or loom::IoError when the file cannot be read.
LoadedConfig load_job_config(const std::optional<std::string>& path,
                             const std::vector<Override>& overrides);

// Same, from text already in memory (`source_name` names it in messages; its extension picks the
// format: .json is JSON, anything else TOML).
LoadedConfig load_job_config_text(const std::string& text, const std::string& source_name,
                                  const std::vector<Override>& overrides);

// Logs the single warning listing keys that are accepted but have no effect yet, and the one
// listing keys this job's other keys make inert.
void warn_unimplemented(const LoadedConfig& loaded);

}  // namespace loom::config
