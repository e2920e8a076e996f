#include "loom/distributed/watchdog.h"

#include <fmt/format.h>

#include <cstdlib>

#include "loom/core/clock.h"
#include "loom/core/logging.h"
#include "loom/distributed/hang_report.h"

namespace loom::distributed {
namespace {

double seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

}  // namespace

CollectiveWatchdog::CollectiveWatchdog(std::shared_ptr<FlightRecorder> recorder, OnHang on_hang,
                                       std::chrono::milliseconds poll_interval)
    : recorder_(std::move(recorder)), on_hang_(std::move(on_hang)), poll_interval_(poll_interval) {
  if (!on_hang_) {
    FlightRecorder* raw = recorder_.get();
    on_hang_ = [raw](const HangInfo& hang) { terminate_on_hang(*raw, hang); };
  }
  thread_ = std::thread([this] { run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void CollectiveWatchdog::arm(std::chrono::milliseconds timeout, std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> lock(mutex_);
  timeout_ = timeout;
  grace_ = grace;
}

bool CollectiveWatchdog::fired() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fired_;
}

void CollectiveWatchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, poll_interval_, [this] { return stop_; })) {
    if (timeout_.count() == 0 || fired_) continue;
    const double limit = seconds(timeout_ + grace_);
    const auto oldest = recorder_->longest_wait();
    if (!oldest) continue;
    const double waited = now_unix() - oldest->wait_started_at;
    if (waited <= limit) continue;
    fired_ = true;
    HangInfo hang;
    hang.collective = *oldest;
    hang.waited_s = waited;
    hang.message = fmt::format(
        "{} #{} on group '{}' (ranks {}) has blocked rank {} for {:.1f} s, past "
        "comm.train_timeout_seconds = {:.0f} (+{:.0f} s grace): the collective hangs",
        oldest->op, oldest->seq, oldest->group, format_rank_ranges(oldest->group_ranks),
        recorder_->rank(), waited, seconds(timeout_), seconds(grace_));
    lock.unlock();
    on_hang_(hang);
    lock.lock();
  }
}

void terminate_on_hang(FlightRecorder& recorder, const HangInfo& hang) {
  auto logger = log::get("comm");
  logger->error(
      "watchdog: {}; stopping this rank (exit code {}) so the launcher can restart "
      "the group",
      hang.message, kCollectiveHangExitCode);
  // Dumps this rank's ring and asks the others (bounded wait), as a failed collective does.
  recorder.failed(hang.collective.id, "watchdog: " + hang.message);
  logger->flush();
  std::fflush(nullptr);
  // No unwinding: the training thread is blocked inside the backend and cannot be joined.
  std::_Exit(kCollectiveHangExitCode);
}

}  // namespace loom::distributed
