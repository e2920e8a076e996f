// Which layers each pipeline stage holds, from torchtitan's parallelism keys (pure arithmetic).
//
// The stage count is pp x V: V = 1 for single-stage schedules (GPipe, 1F1B), 2 by default for the
// interleaved ones, or ceil((n_layers + first_less + last_less) / layers_per_stage) stages when
// pipeline_parallel_layers_per_stage is set. The layers are then spread as torchtitan's
// generate_llm_fqn_per_model_part does: the embedding counts as first_stage_less_layers layers
// and norm + output as last_stage_less_layers, so those stages get fewer transformer layers, and
// any remainder goes one layer each to the first stages. module_fqns_per_model_part replaces all
// of this with explicit module names per stage. Stage s runs on rank s % pp (schedule.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/job_config.h"

namespace loom::parallel::pipeline {

// One stage's part of the model: transformer layers [first_layer, end_layer), with the token
// embedding before them (stage 0) and the final norm, output and loss after them (last stage).
// The same fields as models::ModelPart (model_parts.h converts).
struct StagePart {
  int stage = 0;
  int64_t first_layer = 0;
  int64_t end_layer = 0;
  bool embedding = false;
  bool head = false;

  int64_t layers() const { return end_layer - first_layer; }
  // torchtitan's module names: "tok_embeddings", "layers.N", ..., "norm", "output".
  std::vector<std::string> modules() const;
  bool operator==(const StagePart& o) const {
    return stage == o.stage && first_layer == o.first_layer && end_layer == o.end_layer &&
           embedding == o.embedding && head == o.head;
  }
};

struct StageSplit {
  int pp = 1;
  int stages_per_rank = 1;
  std::vector<StagePart> stages;  // by stage index

  // The parts a rank builds, one per virtual stage, in stage order (r, r + pp, ...).
  std::vector<StagePart> parts_of_rank(int rank) const;
};

// The split a job asks for: parallelism.pipeline_parallel_degree, _layers_per_stage,
// _first_stage_less_layers, _last_stage_less_layers, module_fqns_per_model_part and, for the
// number of stages per rank, _schedule (or the stage count of _schedule_csv, `csv_stages`).
// Throws InputError naming the keys when the layers do not split as asked.
StageSplit split_stages(const config::ParallelismSection& parallelism, int64_t n_layers,
                        std::optional<int> csv_stages = std::nullopt);

// The generated split of n_layers over `stages` stages (torchtitan's weighting; see above).
std::vector<StagePart> generate_stage_parts(int stages, int64_t n_layers, int64_t input_weight,
                                            int64_t output_weight);

// Explicit module names per stage; checks that every layer appears once and in order, the
// embedding only first and norm + output only last.
std::vector<StagePart> parse_stage_modules(const std::vector<std::vector<std::string>>& modules,
                                           int64_t n_layers);

}  // namespace loom::parallel::pipeline
