// The pipeline stage split (stage_split.h).
#include "loom/parallel/pipeline/stage_split.h"

#include "loom/core/check.h"
#include "loom/core/strings.h"
#include "loom/parallel/pipeline/schedule.h"

namespace loom::parallel::pipeline {

namespace {

constexpr const char* kDegree = "parallelism.pipeline_parallel_degree";
constexpr const char* kLayersPerStage = "parallelism.pipeline_parallel_layers_per_stage";
constexpr const char* kFirstLess = "parallelism.pipeline_parallel_first_stage_less_layers";
constexpr const char* kLastLess = "parallelism.pipeline_parallel_last_stage_less_layers";
constexpr const char* kModules = "parallelism.module_fqns_per_model_part";

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The number of stages the keys ask for (checked against the schedule's stages per rank).
int stage_count(const config::ParallelismSection& p, int64_t n_layers, bool single_stage,
                std::optional<int> csv_stages) {
  const int64_t pp = p.pipeline_parallel_degree;
  int64_t stages = pp * (single_stage ? 1 : 2);
  std::string source = single_stage
                           ? "one stage per rank for parallelism.pipeline_parallel_schedule"
                           : "two stages per rank by default for an interleaved schedule";
  if (csv_stages) {
    stages = *csv_stages;
    source = "parallelism.pipeline_parallel_schedule_csv names " + std::to_string(stages);
  }
  if (p.module_fqns_per_model_part) {
    const auto parts = static_cast<int64_t>(p.module_fqns_per_model_part->size());
    LOOM_CHECK_AS(InputError, !csv_stages || parts == stages, kModules, " lists ", parts,
                  " parts but ", source, " stages");
    stages = parts;
    source = std::string(kModules) + " lists " + std::to_string(parts);
  } else if (p.pipeline_parallel_layers_per_stage && !csv_stages) {
    const int64_t lps = *p.pipeline_parallel_layers_per_stage;
    stages = ceil_div(n_layers + p.pipeline_parallel_first_stage_less_layers +
                          p.pipeline_parallel_last_stage_less_layers,
                      lps);
    source = std::string(kLayersPerStage) + " = " + std::to_string(lps) + " makes ceil((" +
             std::to_string(n_layers) + " layers + " + kFirstLess + " + " + kLastLess + ") / " +
             std::to_string(lps) + ") = " + std::to_string(stages);
  }
  LOOM_CHECK_AS(InputError, stages % pp == 0, source, " stages, not a multiple of ", kDegree, " = ",
                pp);
  const int64_t per_rank = stages / pp;
  if (csv_stages) return static_cast<int>(stages);  // a CSV schedule runs any stage count
  LOOM_CHECK_AS(
      InputError, !single_stage || per_rank == 1, source, " stages, ", per_rank,
      " per rank, but parallelism.pipeline_parallel_schedule = ", p.pipeline_parallel_schedule,
      " runs one stage per rank (use an interleaved schedule, or fewer stages)");
  LOOM_CHECK_AS(
      InputError, single_stage || per_rank >= 2, source, " stages, ", per_rank,
      " per rank, but parallelism.pipeline_parallel_schedule = ", p.pipeline_parallel_schedule,
      " interleaves at least 2 stages per rank (use 1F1B, or more stages)");
  return static_cast<int>(stages);
}

}  // namespace

std::vector<std::string> StagePart::modules() const {
  std::vector<std::string> out;
  if (embedding) out.emplace_back("tok_embeddings");
  for (int64_t l = first_layer; l < end_layer; ++l) out.push_back("layers." + std::to_string(l));
  if (head) {
    out.emplace_back("norm");
    out.emplace_back("output");
  }
  return out;
}

std::vector<StagePart> StageSplit::parts_of_rank(int rank) const {
  std::vector<StagePart> out;
  for (int v = 0; v < stages_per_rank; ++v)
    out.push_back(stages.at(static_cast<size_t>(rank + v * pp)));
  return out;
}

std::vector<StagePart> generate_stage_parts(int stages, int64_t n_layers, int64_t input_weight,
                                            int64_t output_weight) {
  LOOM_CHECK_AS(InputError, stages >= 1, "the pipeline needs at least one stage, got ", stages);
  if (stages == 1) return {StagePart{0, 0, n_layers, true, true}};
  const int64_t effective = n_layers + input_weight + output_weight;
  const std::string weights = "(" + std::to_string(n_layers) + " layers + " + kFirstLess + " " +
                              std::to_string(input_weight) + " + " + kLastLess + " " +
                              std::to_string(output_weight) + ")";
  LOOM_CHECK_AS(InputError, stages <= effective, stages, " pipeline stages are more than the ",
                effective, " layers to spread ", weights, "; lower ", kDegree, " or ",
                kLayersPerStage);
  const int64_t per_stage = effective / stages, extra = effective % stages;
  LOOM_CHECK_AS(InputError, input_weight <= per_stage, kFirstLess, " = ", input_weight,
                " exceeds the ", per_stage, " layers of the smallest of ", stages, " stages ",
                weights);
  LOOM_CHECK_AS(InputError, output_weight <= per_stage, kLastLess, " = ", output_weight,
                " exceeds the ", per_stage, " layers of the smallest of ", stages, " stages ",
                weights);
  std::vector<StagePart> parts;
  int64_t next = 0;
  for (int s = 0; s < stages; ++s) {
    int64_t layers = per_stage + (s < extra ? 1 : 0);
    if (s == 0) layers -= input_weight;
    if (s == stages - 1) layers -= output_weight;
    const int64_t end = std::min(n_layers, next + layers);
    parts.push_back({s, next, end, s == 0, s == stages - 1});
    next = end;
  }
  return parts;
}

std::vector<StagePart> parse_stage_modules(const std::vector<std::vector<std::string>>& modules,
                                           int64_t n_layers) {
  LOOM_CHECK_AS(InputError, !modules.empty(), kModules,
                " is empty; list the modules of each stage");
  std::vector<StagePart> parts;
  int64_t next = 0;
  const int last = static_cast<int>(modules.size()) - 1;
  for (int s = 0; s <= last; ++s) {
    const auto& names = modules[static_cast<size_t>(s)];
    const std::string where = std::string(kModules) + " part " + std::to_string(s);
    LOOM_CHECK_AS(InputError, !names.empty(), where, " is empty; every stage needs a module");
    StagePart part{s, next, next, false, false};
    bool norm = false, output = false;
    for (const auto& name : names) {
      if (name == "tok_embeddings") {
        LOOM_CHECK_AS(InputError, s == 0 && part.layers() == 0 && !part.embedding, where,
                      ": tok_embeddings belongs once at the start of the first part");
        part.embedding = true;
      } else if (name == "norm" || name == "output") {
        LOOM_CHECK_AS(InputError, s == last, where, ": ", name, " belongs in the last part");
        (name == "norm" ? norm : output) = true;
      } else if (name.rfind("layers.", 0) == 0) {
        auto index = strings::parse_int(name.substr(7));
        LOOM_CHECK_AS(InputError, index && *index >= 0 && *index < n_layers, where, ": ",
                      strings::quote(name), " is not a layer of a model with ", n_layers,
                      " layers");
        LOOM_CHECK_AS(InputError, *index == part.end_layer && !norm && !output, where, ": ",
                      strings::quote(name), " is out of order; expected layers.", part.end_layer,
                      " next (each layer once, in order, before norm and output)");
        ++part.end_layer;
      } else {
        LOOM_THROW(InputError, where, ": unknown module ", strings::quote(name),
                   "; expected tok_embeddings, layers.N, norm or output");
      }
    }
    LOOM_CHECK_AS(InputError, norm == output, where, ": norm and output go together");
    part.head = norm;
    next = part.end_layer;
    parts.push_back(part);
  }
  LOOM_CHECK_AS(InputError, parts.front().embedding, kModules,
                ": the first part must start with tok_embeddings");
  LOOM_CHECK_AS(InputError, parts.back().head, kModules,
                ": the last part must end with norm and output");
  LOOM_CHECK_AS(InputError, next == n_layers, kModules, " covers layers 0..", next - 1,
                " but the model has ", n_layers, " layers");
  return parts;
}

StageSplit split_stages(const config::ParallelismSection& p, int64_t n_layers,
                        std::optional<int> csv_stages) {
  LOOM_CHECK_AS(InputError, p.pipeline_parallel_degree >= 1, kDegree, " must be >= 1");
  const bool single_stage =
      !csv_stages && is_single_stage(parse_schedule_kind(p.pipeline_parallel_schedule));
  StageSplit split;
  split.pp = static_cast<int>(p.pipeline_parallel_degree);
  const int stages = stage_count(p, n_layers, single_stage, csv_stages);
  split.stages_per_rank = stages / split.pp;
  split.stages =
      p.module_fqns_per_model_part
          ? parse_stage_modules(*p.module_fqns_per_model_part, n_layers)
          : generate_stage_parts(stages, n_layers, p.pipeline_parallel_first_stage_less_layers,
                                 p.pipeline_parallel_last_stage_less_layers);
  return split;
}

}  // namespace loom::parallel::pipeline
