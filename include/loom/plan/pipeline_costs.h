// The pipeline facts the memory and step-time models need, from the same schedule lists and
// stage split the trainer runs (parallel/pipeline): which stages a rank holds, how many
// microbatches' activations it keeps at once, and the schedule's bubble. Simulations are cached
// (a layout search asks for the same schedules many times).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/parallel/pipeline/stage_split.h"
#include "loom/plan/layout.h"

namespace loom::plan {

// The parts rank `pipeline_rank` builds (the whole model without pp).
std::vector<parallel::pipeline::StagePart> rank_stage_parts(const config::JobConfig& config,
                                                            const Layout& layout, int64_t n_layers,
                                                            int pipeline_rank);

// Microbatch-stages whose activations the rank holds at its peak (1 without pp).
double rank_live_microbatches(const config::JobConfig& config, const Layout& layout,
                              int64_t n_layers, int pipeline_rank);

// The schedule's bubble: idle over busy compute time (simulate.h; forward 1 slot, input and
// weight gradients 1 slot each), 0 without pp. Throws InputError when the schedule cannot run
// with the layout's microbatches.
double pipeline_bubble(const Layout& layout);

// Whether the layout's schedule can run (microbatch count, stage split).
bool pipeline_is_valid(const config::JobConfig& config, const Layout& layout, int64_t n_layers);

}  // namespace loom::plan
