// loom's Work: waiting on a c10d collective, its local post-processing, the flight recorder's
// entry and the process's time spent waiting (comm.h, backend.h).
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "backend.h"
#include "loom/core/logging.h"

namespace loom::distributed {
namespace {

std::atomic<int64_t> g_wait_ns{0};

// Adds the time from construction to destruction to g_wait_ns (also when the wait throws).
class WaitTimer {
 public:
  WaitTimer() : start_(std::chrono::steady_clock::now()) {}
  ~WaitTimer() {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start_);
    g_wait_ns.fetch_add(ns.count(), std::memory_order_relaxed);
  }
  WaitTimer(const WaitTimer&) = delete;
  WaitTimer& operator=(const WaitTimer&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

double comm_wait_seconds() {
  return static_cast<double>(g_wait_ns.load(std::memory_order_relaxed)) * 1e-9;
}

void Work::Impl::track(std::shared_ptr<FlightRecorder> recorder, uint64_t id) {
  recorder_ = std::move(recorder);
  record_id_ = id;
}

void Work::Impl::wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (done_) return;
  if (recorder_) recorder_->waiting(record_id_);
  RECORD_USER_SCOPE("loom::comm_wait");  // tools/step_breakdown.py's comm_wait
  const WaitTimer timer;
  try {
    if (work_) work_->wait();
    if (finish_) finish_();
  } catch (const std::exception& e) {
    if (recorder_) recorder_->failed(record_id_, message_of(e));
    if (dynamic_cast<const Error*>(&e) != nullptr) throw;
    LOOM_THROW(CommError, what_, " failed: ", message_of(e), kPeerHint);
  }
  if (recorder_) recorder_->completed(record_id_);
  done_ = true;
  release_backend_work();
}

void Work::Impl::release_backend_work() {
  if (settle_ && work_) {
    // The worker lets go right after it marks the work complete; a second is far beyond that,
    // and past it the buffers are simply freed later, by the worker.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (work_.use_count() > 1 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::yield();
    }
    // A backend that keeps its works elsewhere would make every wait cost the full second.
    static std::once_flag warned;
    if (work_.use_count() > 1) {
      std::call_once(warned, [this] {
        log::get("comm")->warn(
            "{}: Gloo still held the finished collective after 1 s; its buffers are freed later "
            "by Gloo's thread (peak memory may step up), and if this repeats every wait costs "
            "that second",
            what_);
      });
    }
  }
  work_.reset();
  finish_ = nullptr;
}

void Work::Impl::then(std::function<void()> next) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (done_) {
    lock.unlock();
    next();
    return;
  }
  finish_ = [first = std::move(finish_), next = std::move(next)]() {
    if (first) first();
    next();
  };
}

bool Work::Impl::completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ || !work_ || work_->isCompleted();
}

void Work::wait() {
  if (impl_) impl_->wait();
}

bool Work::completed() const {
  return !impl_ || impl_->completed();
}

}  // namespace loom::distributed
