#include "loom/train/lr_scheduler.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "loom/core/logging.h"

namespace loom::train {

LRSchedule::LRSchedule(const config::LRSchedulerSection& section, int64_t training_steps, bool warn)
    : decay_type_(section.decay_type), min_lr_factor_(section.min_lr_factor) {
  auto log = log::get("lr");
  warmup_ = section.warmup_steps;
  if (warmup_ > training_steps) {
    if (warn) {
      log->warn(
          "lr_scheduler.warmup_steps ({}) exceeds the {} training steps; warming up over all "
          "of them",
          warmup_, training_steps);
    }
    warmup_ = training_steps;
  }
  if (section.decay_ratio) {
    decay_ = static_cast<int64_t>(
        std::lround(static_cast<double>(training_steps) * *section.decay_ratio));
    if (warmup_ + decay_ > training_steps) {
      if (warn) {
        log->warn(
            "lr_scheduler: warmup ({}) + decay ({}) steps exceed the {} training steps; decaying "
            "over {}",
            warmup_, decay_, training_steps, training_steps - warmup_);
      }
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

LRSchedule LRSchedule::of_job(const config::JobConfig& config, bool warn) {
  return LRSchedule(config.lr_scheduler,
                    config.lr_scheduler.total_steps.value_or(config.training.steps), warn);
}

std::optional<std::string> describe_schedule_change(const config::JobConfig& saved,
                                                    const config::JobConfig& current,
                                                    int64_t schedule_step, int64_t last_step) {
  if (schedule_step <= 0) return std::nullopt;  // nothing run under the old schedule
  const LRSchedule before = LRSchedule::of_job(saved, false);
  const LRSchedule after = LRSchedule::of_job(current, false);
  const double last = saved.optimizer.lr * before.factor(schedule_step - 1);
  const double would_be = saved.optimizer.lr * before.factor(schedule_step);
  const double now = current.optimizer.lr * after.factor(schedule_step);
  if (std::abs(now - would_be) <= 1e-12 * std::max(std::abs(now), std::abs(would_be))) {
    return std::nullopt;
  }
  std::string keys;
  auto changed = [&](const std::string& key, const std::string& old_value,
                     const std::string& new_value) {
    if (old_value == new_value) return;
    keys += fmt::format("{}{} {} -> {}", keys.empty() ? "" : ", ", key, old_value, new_value);
  };
  const auto& a = saved.lr_scheduler;
  const auto& b = current.lr_scheduler;
  auto text = [](const auto& optional) {
    return optional ? fmt::format("{}", *optional) : std::string("(unset)");
  };
  changed("training.steps", fmt::format("{}", saved.training.steps),
          fmt::format("{}", current.training.steps));
  changed("optimizer.lr", fmt::format("{}", saved.optimizer.lr),
          fmt::format("{}", current.optimizer.lr));
  changed("lr_scheduler.warmup_steps", fmt::format("{}", a.warmup_steps),
          fmt::format("{}", b.warmup_steps));
  changed("lr_scheduler.decay_ratio", text(a.decay_ratio), text(b.decay_ratio));
  changed("lr_scheduler.decay_type", a.decay_type, b.decay_type);
  changed("lr_scheduler.min_lr_factor", fmt::format("{}", a.min_lr_factor),
          fmt::format("{}", b.min_lr_factor));
  changed("lr_scheduler.total_steps", text(a.total_steps), text(b.total_steps));
  // More steps with the old shape: the old run's length as the schedule's.
  const std::string keep =
      saved.training.steps != current.training.steps && !a.total_steps && !b.total_steps
          ? fmt::format("; lr_scheduler.total_steps = {} keeps the checkpoint's schedule",
                        saved.training.steps)
          : "";
  return fmt::format(
      "{} changes the learning-rate schedule: lr at step {} was {:.3g}, at step {} it is now "
      "{:.3g} (the checkpoint's schedule would give {:.3g}){}",
      keys.empty() ? "the config" : keys, last_step, last, last_step + 1, now, would_be, keep);
}

}  // namespace loom::train
