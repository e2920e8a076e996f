// A warning that input from outside (a peer, a store entry) can trigger at any rate: logged at
// most once per `period`, with how many were suppressed since, so a hostile or broken peer can
// neither flood the log nor hide behind it.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "loom/core/logging.h"

namespace loom::log {

class RateLimitedWarning {
 public:
  explicit RateLimitedWarning(std::string component,
                              std::chrono::milliseconds period = std::chrono::seconds(10))
      : component_(std::move(component)), period_(period) {}

  void warn(const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (logged_once_ && now - last_ < period_) {
      ++suppressed_;
      return;
    }
    if (suppressed_ > 0) {
      get(component_)->warn("{} ({} more like it suppressed)", message, suppressed_);
    } else {
      get(component_)->warn("{}", message);
    }
    logged_once_ = true;
    last_ = now;
    suppressed_ = 0;
  }

 private:
  std::string component_;
  std::chrono::milliseconds period_;
  std::mutex mutex_;
  bool logged_once_ = false;
  std::chrono::steady_clock::time_point last_;
  int64_t suppressed_ = 0;
};

}  // namespace loom::log
