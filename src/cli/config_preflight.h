// `loom config validate`'s checks beyond the config file itself: what `loom train` would refuse
// before its first step, found without starting a world (no ranks, no model, no data read).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "loom/config/diagnostics.h"
#include "loom/config/job_config.h"

namespace loom::cli {

struct PreflightWorld {
  std::optional<int64_t> world_size;  // --world-size, or --nnodes x --nproc-per-node
};

// Every problem found, in the order train meets them: unimplemented parallel degrees first, then
// the layout arithmetic (for `world.world_size`, or for the world sizes the degrees allow), the
// batch sizes, the tokenizer and the datasets. Empty when train would start.
std::vector<std::string> preflight_problems(const config::JobConfig& config,
                                            const PreflightWorld& world,
                                            const config::Provenance& provenance = {});

// One line describing the layout a world size gives, or the world sizes the degrees allow.
std::string describe_world(const config::JobConfig& config, const PreflightWorld& world);

}  // namespace loom::cli
