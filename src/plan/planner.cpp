#include "loom/plan/planner.h"

#include <algorithm>
#include <chrono>

#include "loom/core/check.h"
#include "loom/core/logging.h"
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
    const auto& spec = models::job_model_spec(config);
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

namespace {

bool better_plan(const LayoutPlan& a, const LayoutPlan& b) {
  if (a.fits != b.fits) return a.fits;
  if (a.time.step_seconds != b.time.step_seconds) return a.time.step_seconds < b.time.step_seconds;
  return a.memory.peak_bytes < b.memory.peak_bytes;
}

// The best `keep` of `plans`, in order.
void keep_best(std::vector<LayoutPlan>& plans, size_t keep) {
  if (plans.size() > keep) {
    std::nth_element(plans.begin(), plans.begin() + static_cast<std::ptrdiff_t>(keep), plans.end(),
                     better_plan);
    plans.resize(keep);
  }
  std::stable_sort(plans.begin(), plans.end(), better_plan);
}

// The layouts of one (pp, tp, cp, dp_replicate, dp_shard, ep, AC) choice: batch splits, and
// schedules under pp.
std::vector<Layout> batch_variants(const Layout& l, int64_t rows, const config::JobConfig& config,
                                   const SearchOptions& options) {
  std::vector<Layout> variants;
  if (l.pp == 1) {
    for (int64_t local : divisors(rows)) {
      Layout v = l;
      v.local_batch_size = local;
      v.accumulation = rows / local;
      variants.push_back(v);
    }
    return variants;
  }
  for (const auto& [schedule, stages] : schedule_choices(config, options.search_schedules)) {
    for (int64_t mbs : divisors(rows)) {
      Layout v = l;
      v.schedule = schedule;
      v.stages_per_rank = stages;
      v.local_batch_size = rows;
      v.microbatch_size = mbs;
      variants.push_back(v);
    }
  }
  return variants;
}

}  // namespace

std::vector<LayoutPlan> search_layouts(const ModelShape& model, const config::JobConfig& config,
                                       int64_t world, const DeviceProfile& profile,
                                       const SearchOptions& options, SearchStats* stats) {
  LOOM_CHECK_AS(InputError, world >= 1 && world <= kMaxPlanWorldSize,
                "--world-size must be a whole number of ranks from 1 to ", kMaxPlanWorldSize,
                ", got ", world);
  const int64_t global =
      options.global_batch_size > 0 ? options.global_batch_size : job_global_batch(config, world);
  const int64_t seq = config.training.seq_len;
  const size_t keep = std::max<size_t>(options.keep, 1);
  SearchStats counted;
  std::vector<LayoutPlan> plans;
  auto last_report = std::chrono::steady_clock::now();
  const auto pp_choices = divisors(world);
  for (size_t pp_index = 0; pp_index < pp_choices.size(); ++pp_index) {
    const int64_t pp = pp_choices[pp_index];
    if (pp > model.n_layers()) break;  // divisors are sorted
    for (int64_t tp : divisors(world / pp)) {
      // The rules layout_is_valid would apply to every layout below, applied once here.
      if (tp > profile.devices_per_node) break;
      if (seq % tp != 0) continue;
      for (int64_t cp : divisors(world / pp / tp)) {
        if (cp > 1 && seq % (2 * cp * tp) != 0) continue;
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
              for (const Layout& v : batch_variants(l, rows, config, options)) {
                if (!layout_is_valid(model, config, v, profile)) continue;
                LayoutPlan plan;
                plan.layout = v;
                plan.memory = predict_memory(model, config, v, profile);
                plan.time = predict_step_time(model, config, v, profile);
                plan.fits = plan.memory.peak_bytes <= profile.memory_bytes;
                ++counted.evaluated;
                counted.fitting += plan.fits ? 1 : 0;
                plans.push_back(std::move(plan));
                if (plans.size() >= 2 * keep) keep_best(plans, keep);
              }
            }
          }
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (now - last_report > std::chrono::seconds(5)) {
        last_report = now;
        log::get("plan")->info(
            "searching layouts of {} ranks: {} evaluated, {} fit (pipeline "
            "degree {}, {} of {})",
            world, counted.evaluated, counted.fitting, pp, pp_index + 1, pp_choices.size());
      }
    }
  }
  LOOM_CHECK_AS(InputError, !plans.empty(), "--world-size ", world, ": no parallel layout of ",
                config.model.name, " ", config.model.flavor,
                " runs on that many ranks with the global batch of ", global,
                " rows (training.global_batch_size; every data-parallel degree must divide it)");
  keep_best(plans, keep);
  if (stats) *stats = counted;
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
