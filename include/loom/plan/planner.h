// The layout planner: every parallel layout of a job on N ranks that the job's model and loom
// can run, each with its predicted per-rank memory (memory_model.h) and step time
// (step_time_model.h); those that fit the device ranked by step time. The elastic launcher asks
// it for a layout when the world size changes (plan_layout).
//
// Searched: pp, dp_replicate, dp_shard, cp, tp (ep for a mixture of experts) multiplying to N,
// with tp inside a node and dividing the heads (the family's check_parallelism); the pipeline
// schedules (GPipe, 1F1B, Interleaved1F1B and InterleavedZeroBubble with 2 stages per rank) and
// microbatch sizes; the local batch (gradient accumulation makes up the rest of the global
// batch, which stays the job's); activation checkpointing none, selective every 2nd block, full.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/plan/device_profile.h"
#include "loom/plan/layout.h"
#include "loom/plan/memory_model.h"
#include "loom/plan/model_shape.h"
#include "loom/plan/step_time_model.h"

namespace loom::plan {

struct LayoutPlan {
  Layout layout;
  MemoryPlan memory;
  StepTimePlan time;
  bool fits = false;
};

struct SearchOptions {
  // Layouts whose global batch is this many rows (0: the job's, resolved on world_size).
  int64_t global_batch_size = 0;
  bool search_schedules = true;  // every schedule, or only the job's
  bool search_ac = true;         // none / selective 2 / full, or only the job's
  // The best layouts kept (fitting first, then by step time): a million ranks have tens of
  // thousands of valid layouts, and the search's memory stays bounded by this.
  size_t keep = 4096;
};

// What a search looked at beyond the layouts it kept.
struct SearchStats {
  int64_t evaluated = 0;  // valid layouts predicted
  int64_t fitting = 0;    // of those, the ones that fit the device's memory
};

// The most ranks a plan is asked for (a bound that keeps the search and its arithmetic small).
constexpr int64_t kMaxPlanWorldSize = 1 << 20;

// The job's global batch in rows on world_size ranks: training.global_batch_size, or
// local_batch_size x the data-parallel degree of the job's layout (or of plain FSDP over every
// rank when the job's degrees do not fit world_size).
int64_t job_global_batch(const config::JobConfig& config, int64_t world_size);

// The best `options.keep` valid layouts (fitting or not), fitting ones first, each group by step
// time; `stats` (optional) counts every valid layout. A long search logs its progress every few
// seconds. Throws InputError naming --world-size when it is out of range or no layout divides it.
std::vector<LayoutPlan> search_layouts(const ModelShape& model, const config::JobConfig& config,
                                       int64_t world_size, const DeviceProfile& profile,
                                       const SearchOptions& options = {},
                                       SearchStats* stats = nullptr);

// The fastest layout that fits (reads the model's shapes on the meta device). Throws InputError
// when none fits, naming the least memory any layout needs.
LayoutPlan plan_layout(const config::JobConfig& config, int64_t world_size,
                       const DeviceProfile& profile, int64_t vocab_size = 0,
                       const SearchOptions& options = {});

// What an elastic launcher asks before each (re)start (`loom launch --replan-layout`): the
// config overrides (section.key, value) for a round of `world_size` ranks. None while the world
// size is the first round's and the job's own degrees fit it; otherwise the planned layout's
// keys, keeping the first round's global batch (so the run trains on the same batch whatever
// its size; the checkpoint reshards to the new layout).
class LayoutReplanner {
 public:
  LayoutReplanner(config::JobConfig config, DeviceProfile profile, int64_t vocab_size = 0);
  std::vector<std::pair<std::string, std::string>> overrides_for(int64_t world_size);

 private:
  config::JobConfig config_;
  DeviceProfile profile_;
  int64_t vocab_size_ = 0;
  int64_t first_world_ = 0;
  int64_t global_batch_ = 0;
};

}  // namespace loom::plan
