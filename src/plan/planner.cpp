#include "loom/plan/planner.h"

#include <algorithm>

#include "loom/core/check.h"
#include "loom/distributed/parallel_dims.h"
#include "loom/models/model_spec.h"
#include "loom/plan/pipeline_costs.h"

namespace loom::plan {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    out.push_back(d);
    if (d != n / d) out.push_back(n / d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The model's own limits on a layout (heads divisible by tp, ...), and the keys' rules.
bool layout_is_valid(const ModelShape& model, const config::JobConfig& config, const Layout& l,
                     const DeviceProfile& profile) {
  const int64_t seq = config.training.seq_len;
  if (l.tp > profile.devices_per_node) return false;  // TP's collectives stay on NVLink
  if (seq % l.tp != 0) return false;
  if (l.cp > 1 && seq % (2 * l.cp * l.tp) != 0) return false;
  if (config.validation.enable && config.validation.seq_len % l.tp != 0) return false;
  if (l.ep > 1 &&
      (model.experts == 0 || model.experts % l.ep != 0 || l.fsdp_degree() % l.ep != 0)) {
    return false;
  }
  if (l.pp > model.n_layers()) return false;
  if (!pipeline_is_valid(config, l, model.n_layers())) return false;
  try {
    const auto& spec = models::find_model_spec(config.model.name);
    if (spec.check_parallelism) spec.check_parallelism(with_layout(config, l));
  } catch (const InputError&) {
    return false;
  }
  return true;
}

std::vector<std::pair<std::string, std::string>> ac_choices(const config::JobConfig& config,
                                                            bool search) {
  if (!search) {
    return {{config.activation_checkpoint.mode, config.activation_checkpoint.selective_ac_option}};
  }
  return {{"none", "2"}, {"selective", "2"}, {"full", "2"}};
}

std::vector<std::pair<std::string, int64_t>> schedule_choices(const config::JobConfig& config,
                                                              bool search) {
  if (!search) {
    const std::string& s = config.parallelism.pipeline_parallel_schedule;
    return {{s, s.rfind("Interleaved", 0) == 0 ? 2 : 1}};
  }
  return {{"GPipe", 1}, {"1F1B", 1}, {"Interleaved1F1B", 2}, {"InterleavedZeroBubble", 2}};
}

}  // namespace

int64_t job_global_batch(const config::JobConfig& config, int64_t world_size) {
  if (config.training.global_batch_size > 0) return config.training.global_batch_size;
  int64_t dp = world_size;
  try {
    dp = layout_of(config, world_size).dp_degree();
  } catch (const InputError&) {
  }
  return config.training.local_batch_size * dp;
}

std::vector<LayoutPlan> search_layouts(const ModelShape& model, const config::JobConfig& config,
                                       int64_t world, const DeviceProfile& profile,
                                       const SearchOptions& options) {
  LOOM_CHECK_AS(InputError, world >= 1 && world <= kMaxPlanWorldSize,
                "--world-size must be a whole number of ranks from 1 to ", kMaxPlanWorldSize,
                ", got ", world);
  const int64_t global =
      options.global_batch_size > 0 ? options.global_batch_size : job_global_batch(config, world);
  std::vector<LayoutPlan> plans;
  for (int64_t pp : divisors(world)) {
    for (int64_t tp : divisors(world / pp)) {
      for (int64_t cp : divisors(world / pp / tp)) {
        const int64_t dp = world / pp / tp / cp;
        if (global % dp != 0) continue;
        const int64_t rows = global / dp;  // per data-parallel rank per step
        for (int64_t dp_replicate : divisors(dp)) {
          const int64_t dp_shard = dp / dp_replicate;
          const bool moe = model.experts > 0;
          for (int64_t ep : moe ? divisors(dp_shard * cp) : std::vector<int64_t>{1}) {
            for (const auto& [ac_mode, ac_option] : ac_choices(config, options.search_ac)) {
              Layout l;
              l.pp = pp;
              l.tp = tp;
              l.cp = cp;
              l.dp_replicate = dp_replicate;
              l.dp_shard = dp_shard;
              l.ep = ep;
              l.ac_mode = ac_mode;
              l.ac_option = ac_option;
              std::vector<Layout> variants;
              if (pp == 1) {
                for (int64_t local : divisors(rows)) {
                  Layout v = l;
                  v.local_batch_size = local;
                  v.accumulation = rows / local;
                  variants.push_back(v);
                }
              } else {
                for (const auto& [schedule, stages] :
                     schedule_choices(config, options.search_schedules)) {
                  for (int64_t mbs : divisors(rows)) {
                    Layout v = l;
                    v.schedule = schedule;
                    v.stages_per_rank = stages;
                    v.local_batch_size = rows;
                    v.microbatch_size = mbs;
                    variants.push_back(v);
                  }
                }
              }
              for (const Layout& v : variants) {
                if (!layout_is_valid(model, config, v, profile)) continue;
                LayoutPlan plan;
                plan.layout = v;
                plan.memory = predict_memory(model, config, v, profile);
                plan.time = predict_step_time(model, config, v, profile);
                plan.fits = plan.memory.peak_bytes <= profile.memory_bytes;
                plans.push_back(std::move(plan));
              }
            }
          }
        }
      }
    }
  }
  LOOM_CHECK_AS(InputError, !plans.empty(), "--world-size ", world, ": no parallel layout of ",
                config.model.name, " ", config.model.flavor,
                " runs on that many ranks with the global batch of ", global,
                " rows (training.global_batch_size; every data-parallel degree must divide it)");
  std::stable_sort(plans.begin(), plans.end(), [](const LayoutPlan& a, const LayoutPlan& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.time.step_seconds != b.time.step_seconds)
      return a.time.step_seconds < b.time.step_seconds;
    return a.memory.peak_bytes < b.memory.peak_bytes;
  });
  return plans;
}

LayoutPlan plan_layout(const config::JobConfig& config, int64_t world_size,
                       const DeviceProfile& profile, int64_t vocab_size,
                       const SearchOptions& options) {
  LOOM_CHECK_AS(InputError, world_size >= 1 && world_size <= kMaxPlanWorldSize,
                "world size must be from 1 to ", kMaxPlanWorldSize, ", got ", world_size);
  const ModelShape model = read_model_shape(config, vocab_size);
  auto plans = search_layouts(model, config, world_size, profile, options);
  if (!plans.front().fits) {
    double least = plans.front().memory.peak_bytes;
    for (const auto& p : plans) least = std::min(least, p.memory.peak_bytes);
    LOOM_THROW(InputError, "no layout of ", config.model.name, " ", config.model.flavor, " on ",
               world_size, " rank(s) fits the ", profile.name, "'s ",
               format_bytes(profile.memory_bytes), ": the smallest needs ", format_bytes(least),
               " per rank; add ranks, shorten training.seq_len or lower the global batch");
  }
  return plans.front();
}

LayoutReplanner::LayoutReplanner(config::JobConfig config, DeviceProfile profile,
                                 int64_t vocab_size)
    : config_(std::move(config)), profile_(std::move(profile)), vocab_size_(vocab_size) {}

std::vector<std::pair<std::string, std::string>> LayoutReplanner::overrides_for(
    int64_t world_size) {
  if (first_world_ == 0) {
    first_world_ = world_size;
    global_batch_ = job_global_batch(config_, world_size);
  }
  if (world_size == first_world_) {
    try {
      layout_of(config_, world_size);
      return {};  // the job as written
    } catch (const InputError&) {
    }
  }
  SearchOptions options;
  options.global_batch_size = global_batch_;
  return layout_keys(plan_layout(config_, world_size, profile_, vocab_size_, options).layout);
}

}  // namespace loom::plan
