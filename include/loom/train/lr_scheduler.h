// Learning-rate schedule with torchtitan's semantics: linear warmup, a stable phase, then decay
// (linear, sqrt or cosine) to min_lr_factor over the last decay_ratio of the steps.
#pragma once

#include <cstdint>
#include <string>

#include "loom/config/job_config.h"

namespace loom::train {

class LRSchedule {
 public:
  // training_steps: lr_scheduler.total_steps if set, else training.steps.
  LRSchedule(const config::LRSchedulerSection& section, int64_t training_steps);

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

}  // namespace loom::train
