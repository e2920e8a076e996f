#include "loom/checkpoint/resume_batch.h"

#include <filesystem>

#include "loom/checkpoint/manager.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "state_io.h"

namespace loom::checkpoint {

namespace {

// A non-negative integer of the train_state.json of the step the manager would resume from;
// nullopt when there is none, it predates the key, or it is unreadable (the manager reports a
// damaged step when it loads).
std::optional<int64_t> resumable_train_state_field(const config::JobConfig& config, const char* key,
                                                   int64_t minimum) {
  const auto& c = config.checkpoint;
  if (!c.enable) return std::nullopt;
  const std::string folder =
      files::output_folder(config.job.dump_folder, c.folder, "checkpoint.folder");
  for (const auto& [step, path] : resume_order(folder)) {
    if (c.load_step >= 0 && step != c.load_step) continue;
    const std::string state_path = path + "/train_state.json";
    try {
      const auto state = json::parse_bounded(detail::read_text(state_path), state_path);
      if (!state.contains(key)) return std::nullopt;
      return json::int_field(state, key, state_path, minimum);
    } catch (const std::exception& e) {
      log::get("checkpoint")->warn("cannot read {} of {}: {}", key, state_path, e.what());
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> resumable_global_batch(const config::JobConfig& config) {
  return resumable_train_state_field(config, "global_batch_size", 1);
}

std::optional<int64_t> resumable_seed(const config::JobConfig& config) {
  return resumable_train_state_field(config, "seed", 0);
}

int64_t resolve_global_batch(const config::JobConfig& config, int64_t dp) {
  const auto& t = config.training;
  const int64_t per_microbatch = t.local_batch_size * dp;
  int64_t global = t.global_batch_size > 0 ? t.global_batch_size : per_microbatch;
  const char* origin = "training.global_batch_size";
  if (t.global_batch_size <= 0) {
    if (auto saved = resumable_global_batch(config); saved && *saved != per_microbatch) {
      log::get("checkpoint")
          ->warn(
              "resuming with the checkpoint's global batch of {} samples (training."
              "global_batch_size is unset, and local_batch_size {} x data-parallel degree {} = "
              "{} on this world size): gradient accumulation makes up the difference",
              *saved, t.local_batch_size, dp, per_microbatch);
      global = *saved;
      origin = "the checkpoint's global batch";
    }
  }
  LOOM_CHECK_AS(InputError, global % per_microbatch == 0, origin, " (", global,
                ") must be a multiple of training.local_batch_size x data-parallel degree (",
                t.local_batch_size, " x ", dp, " = ", per_microbatch,
                "): choose a local_batch_size that divides it on this world size, or set "
                "training.global_batch_size");
  return global;
}

}  // namespace loom::checkpoint
