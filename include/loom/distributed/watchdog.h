// The collective watchdog: one thread per rank that turns a collective stuck past
// comm.train_timeout_seconds into a clean, named failure of this rank within seconds.
//
// Gloo honours its timeout on most paths; NCCL on a dead peer, or a backend thread that never
// returns, may not. A thread blocked in such a collective cannot be unwound, so the watchdog's
// default action does what NCCL's own watchdog does: it names the collective, dumps the flight
// recorder (and asks the other ranks to dump theirs), and ends the process with
// kCollectiveHangExitCode, so the agent (`loom launch`) restarts the group instead of waiting.
//
// It reads the flight recorder (flight_recorder.h): a hang is measured from the moment this
// rank blocked on the collective (Work::wait), so an async collective waited for late is no
// hang. Armed only after the first training step (the init timeout covers the rendezvous).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "loom/distributed/flight_recorder.h"

namespace loom::distributed {

// EX_TEMPFAIL: a temporary failure; retrying (a restart of the group) may succeed.
inline constexpr int kCollectiveHangExitCode = 75;

struct HangInfo {
  CollectiveRecord collective;
  double waited_s = 0;
  std::string message;  // "all_reduce #12 on group 'world' (ranks 0-1) waited 5.1 s ..."
};

class CollectiveWatchdog {
 public:
  using OnHang = std::function<void(const HangInfo&)>;

  // `on_hang` runs once, on the watchdog's thread; null: terminate_on_hang.
  CollectiveWatchdog(std::shared_ptr<FlightRecorder> recorder, OnHang on_hang,
                     std::chrono::milliseconds poll_interval = std::chrono::milliseconds(200));
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // From now on, a collective blocked for more than `timeout` + `grace` is a hang. `timeout`
  // is the backend's own (comm.train_timeout_seconds): the grace lets the backend fail first
  // with its own error when it can.
  void arm(std::chrono::milliseconds timeout, std::chrono::milliseconds grace);
  bool fired() const;

 private:
  void run();

  std::shared_ptr<FlightRecorder> recorder_;
  OnHang on_hang_;
  std::chrono::milliseconds poll_interval_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool fired_ = false;
  std::chrono::milliseconds timeout_{0};  // 0: not armed
  std::chrono::milliseconds grace_{0};
  std::thread thread_;
};

// The default action: logs the hang as an error, marks the collective failed in the flight
// recorder (which dumps and asks the other ranks to dump), flushes the logs and ends the
// process with kCollectiveHangExitCode. Never returns.
[[noreturn]] void terminate_on_hang(FlightRecorder& recorder, const HangInfo& hang);

}  // namespace loom::distributed
