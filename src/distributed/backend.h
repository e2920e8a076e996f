// The c10d side of loom's Comm: a c10d backend (Gloo or NCCL) and in-flight work. Private to
// src/distributed; the rest of loom sees only loom/distributed/comm.h.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "loom/distributed/comm.h"
#include "loom/distributed/store_text.h"

namespace loom::distributed {

// An exception's message without c10's C++ backtrace ("Exception raised from ...", one line per
// frame), which would bury the one line a user needs.
inline std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

// Appended to a collective's failure: the usual cause is on another rank.
inline constexpr const char* kPeerHint =
    ". Another rank may have exited or stopped calling collectives (its log says why)";

class Backend {
 public:
  Backend(std::string kind, c10::intrusive_ptr<c10d::Backend> impl)
      : kind_(std::move(kind)), impl_(std::move(impl)) {}
  const std::string& kind() const { return kind_; }  // "gloo" | "nccl"
  c10d::Backend& get() { return *impl_; }

 private:
  std::string kind_;
  c10::intrusive_ptr<c10d::Backend> impl_;
};

class Work::Impl {
 public:
  // `finish` runs once after the collective completed (a fallback's local post-processing).
  Impl(std::string what, c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish)
      : what_(std::move(what)), work_(std::move(work)), finish_(std::move(finish)) {}
  // Blocks until the collective completed, runs `finish`, then drops the backend's work and
  // `finish` (and with them every tensor they hold) on this thread.
  void wait();
  // Runs `next` after `finish` once the collective completed (at once when it already has).
  void then(std::function<void()> next);
  // Blocks while another thread is in wait().
  bool completed() const;
  // The flight recorder's entry: completed or failed when wait() returns or throws.
  void track(std::shared_ptr<FlightRecorder> recorder, uint64_t id);
  // Gloo's worker thread holds its own reference to the work, and so the collective's tensors,
  // until just after it marks the work complete. With this set, wait() waits for the worker to
  // let go before it drops its own: the buffers are then freed on the waiting thread at the
  // wait, not on the worker at a moment that varies from step to step. Under HSDP 2x2 about 4%
  // of waits found the worker still holding on, and the late frees moved the peak RSS up by
  // 8 MiB at random steps (docs/performance.md).
  void settle_on_wait() { settle_ = true; }

 private:
  void release_backend_work();

  std::string what_;
  std::shared_ptr<FlightRecorder> recorder_;
  uint64_t record_id_ = 0;
  c10::intrusive_ptr<c10d::Work> work_;  // null: completed locally
  std::function<void()> finish_;
  mutable std::mutex mutex_;
  bool done_ = false;
  bool settle_ = false;
};

// Backend factories; `timeout` is the default for every collective of the group.
std::shared_ptr<Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout,
                                           const std::string& master_addr);
// Throws InputError when this build has no NCCL.
std::shared_ptr<Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout);

}  // namespace loom::distributed
