#include "loom/train/lr_scheduler.h"

#include <algorithm>
#include <cmath>

#include "loom/core/logging.h"

namespace loom::train {

LRSchedule::LRSchedule(const config::LRSchedulerSection& section, int64_t training_steps)
    : decay_type_(section.decay_type), min_lr_factor_(section.min_lr_factor) {
  auto log = log::get("lr");
  warmup_ = section.warmup_steps;
  if (warmup_ > training_steps) {
    log->warn(
        "lr_scheduler.warmup_steps ({}) exceeds the {} training steps; warming up over all of them",
        warmup_, training_steps);
    warmup_ = training_steps;
  }
  if (section.decay_ratio) {
    decay_ = static_cast<int64_t>(
        std::lround(static_cast<double>(training_steps) * *section.decay_ratio));
    if (warmup_ + decay_ > training_steps) {
      log->warn(
          "lr_scheduler: warmup ({}) + decay ({}) steps exceed the {} training steps; decaying "
          "over {}",
          warmup_, decay_, training_steps, training_steps - warmup_);
      decay_ = training_steps - warmup_;
    }
  } else {
    decay_ = training_steps - warmup_;
  }
  // One virtual step past the end keeps the last real step's rate above min_lr_factor * lr.
  stable_ = training_steps + 1 - warmup_ - decay_;
}

double LRSchedule::factor(int64_t step_index) const {
  if (step_index < warmup_) {
    return static_cast<double>(step_index + 1) / static_cast<double>(warmup_);
  }
  if (step_index < warmup_ + stable_) {
    return 1.0;
  }
  double progress =
      static_cast<double>(step_index + 1 - warmup_ - stable_) / static_cast<double>(decay_);
  progress = std::clamp(progress, 0.0, 1.0);
  double adjustment = 1.0 - progress;
  if (decay_type_ == "sqrt") {
    adjustment = 1.0 - std::sqrt(progress);
  } else if (decay_type_ == "cosine") {
    adjustment = 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  return min_lr_factor_ + (1.0 - min_lr_factor_) * adjustment;
}

}  // namespace loom::train
