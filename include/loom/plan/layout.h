// A parallel layout: how a job's ranks split into pp x dp_replicate x dp_shard x cp x tp (with
// ep borrowed from dp_shard x cp), the pipeline schedule, the rows of one forward and the
// activation checkpointing, with the config keys that carry it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loom/config/job_config.h"

namespace loom::plan {

struct Layout {
  int64_t pp = 1;
  int64_t dp_replicate = 1;
  int64_t dp_shard = 1;
  int64_t cp = 1;
  int64_t tp = 1;
  int64_t ep = 1;
  std::string schedule = "1F1B";  // pipeline schedule (pp > 1)
  int64_t stages_per_rank = 1;    // virtual stages of the interleaved schedules
  int64_t local_batch_size = 1;   // training.local_batch_size: rows of one step's forward(s)
  int64_t microbatch_size = 1;    // pipeline_parallel_microbatch_size (pp > 1)
  int64_t accumulation = 1;       // gradient accumulation steps (global batch / rows per step)
  std::string ac_mode = "none";   // activation_checkpoint.mode: none, full, selective
  std::string ac_option = "2";    // selective_ac_option: "op" or every N-th block

  int64_t world() const { return pp * dp_replicate * dp_shard * cp * tp; }
  int64_t fsdp_degree() const { return dp_shard * cp; }
  int64_t dp_degree() const { return dp_replicate * dp_shard; }
  int64_t microbatches() const { return pp > 1 ? local_batch_size / microbatch_size : 1; }
  // "dp_shard 4 x tp 2, 1F1B (8 mb of 1), ac full"
  std::string describe() const;
  // "fsdp 4 tp 2" short form for tables.
  std::string short_name() const;
};

// The job's own layout on `world_size` ranks (data_parallel_shard_degree = -1 resolved). Throws
// InputError naming the keys when the degrees do not multiply to the world size.
Layout layout_of(const config::JobConfig& config, int64_t world_size);

// The config keys (section.key, value) that make a job run `layout`.
std::vector<std::pair<std::string, std::string>> layout_keys(const Layout& layout);
// `config` with the layout's keys set.
config::JobConfig with_layout(config::JobConfig config, const Layout& layout);

}  // namespace loom::plan
