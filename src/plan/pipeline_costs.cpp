#include "loom/plan/pipeline_costs.h"

#include <map>
#include <mutex>
#include <tuple>

#include "loom/core/check.h"
#include "loom/parallel/pipeline/schedule.h"
#include "loom/parallel/pipeline/simulate.h"

namespace loom::plan {

namespace pp = parallel::pipeline;

namespace {

struct ScheduleFacts {
  double bubble = 0;
  std::vector<int> live;  // per rank
};

// Simulated once per (schedule, pp, V, microbatches).
const ScheduleFacts& schedule_facts(const Layout& l) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int64_t, int64_t, int64_t>, ScheduleFacts> cache;
  const auto kind = pp::parse_schedule_kind(l.schedule);
  const auto key =
      std::make_tuple(static_cast<int>(kind), l.pp, l.stages_per_rank, l.microbatches());
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const pp::Schedule s =
      pp::make_schedule(kind, static_cast<int>(l.pp), static_cast<int>(l.stages_per_rank),
                        static_cast<int>(l.microbatches()));
  ScheduleFacts facts;
  facts.bubble = pp::simulate(s).bubble_fraction();
  for (int r = 0; r < s.pp; ++r) facts.live.push_back(pp::peak_live_activations(s, r));
  return cache.emplace(key, std::move(facts)).first->second;
}

}  // namespace

std::vector<pp::StagePart> rank_stage_parts(const config::JobConfig& config, const Layout& l,
                                            int64_t n_layers, int pipeline_rank) {
  if (l.pp <= 1) {
    pp::StagePart whole;
    whole.first_layer = 0;
    whole.end_layer = n_layers;
    whole.embedding = whole.head = true;
    return {whole};
  }
  const auto& p = config.parallelism;
  const auto parts = pp::generate_stage_parts(static_cast<int>(l.pp * l.stages_per_rank), n_layers,
                                              p.pipeline_parallel_first_stage_less_layers,
                                              p.pipeline_parallel_last_stage_less_layers);
  std::vector<pp::StagePart> mine;
  for (const auto& part : parts) {
    if (part.stage % l.pp == pipeline_rank) mine.push_back(part);
  }
  return mine;
}

double rank_live_microbatches(const config::JobConfig& /*config*/, const Layout& l,
                              int64_t /*n_layers*/, int pipeline_rank) {
  if (l.pp <= 1) return 1;
  return schedule_facts(l).live.at(static_cast<size_t>(pipeline_rank));
}

double pipeline_bubble(const Layout& l) {
  if (l.pp <= 1) return 0;
  return schedule_facts(l).bubble;
}

bool pipeline_is_valid(const config::JobConfig& config, const Layout& l, int64_t n_layers) {
  if (l.pp <= 1) return true;
  if (l.microbatch_size <= 0 || l.local_batch_size % l.microbatch_size != 0) return false;
  try {
    const auto kind = pp::parse_schedule_kind(l.schedule);
    const int m = static_cast<int>(l.microbatches());
    if (m < pp::min_microbatches(kind, static_cast<int>(l.pp))) return false;
    if (pp::needs_microbatches_multiple_of_pp(kind) && m % l.pp != 0) return false;
    const auto parts = rank_stage_parts(config, l, n_layers, 0);
    for (int r = 0; r < l.pp; ++r) {
      for (const auto& part : rank_stage_parts(config, l, n_layers, r)) {
        if (part.layers() < 1 && !part.embedding && !part.head) return false;
      }
    }
    (void)parts;
    schedule_facts(l);
  } catch (const InputError&) {
    return false;
  }
  return true;
}

}  // namespace loom::plan
