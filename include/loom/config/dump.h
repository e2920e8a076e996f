// Writing a JobConfig back out: TOML (what `loom config show` prints and `loom train` saves as
// <dump_folder>/config.toml), JSON, and the Markdown key reference of docs/config.md.
#pragma once

#include <string>

#include "loom/config/job_config.h"

namespace loom::config {

std::string to_toml(const JobConfig& config);
std::string to_json(const JobConfig& config, int indent = 2);
// Markdown tables, one per section: key, type, default, meaning.
std::string reference_markdown();

}  // namespace loom::config
