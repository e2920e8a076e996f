// Learning-rate schedule with torchtitan's semantics: linear warmup, a stable phase, then decay
// (linear, sqrt or cosine) to min_lr_factor over the last decay_ratio of the steps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "loom/config/job_config.h"

namespace loom::train {

class LRSchedule {
 public:
  // training_steps: lr_scheduler.total_steps if set, else training.steps. `warn`: log when the
  // warmup or decay do not fit in the steps (off for a schedule built only to compare with).
  LRSchedule(const config::LRSchedulerSection& section, int64_t training_steps, bool warn = true);
  // The job's schedule: over lr_scheduler.total_steps, else training.steps.
  static LRSchedule of_job(const config::JobConfig& config, bool warn = true);

  // Multiplier of optimizer.lr for the optimizer step with 0-based index `step_index`.
  double factor(int64_t step_index) const;

  int64_t warmup_steps() const { return warmup_; }
  int64_t stable_steps() const { return stable_; }
  int64_t decay_steps() const { return decay_; }

 private:
  int64_t warmup_ = 0;
  int64_t stable_ = 0;
  int64_t decay_ = 0;
  std::string decay_type_;
  double min_lr_factor_ = 0;
};

// On resume: when the job's learning rate for the next step differs from what the checkpoint's
// own config would give it (training.steps, lr_scheduler.* or optimizer.lr changed), a line
// naming the changed keys and the learning rate of the last step saved and of the next one;
// nullopt when the schedule goes on unchanged. `schedule_step`: optimizer steps the checkpoint's
// schedule has run; `last_step`: the training step they end at.
std::optional<std::string> describe_schedule_change(const config::JobConfig& saved,
                                                    const config::JobConfig& current,
                                                    int64_t schedule_step, int64_t last_step);

}  // namespace loom::train
