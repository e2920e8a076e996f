// Heartbeats from each worker to its agent (`loom launch`), so the agent notices a worker that
// is stopped (SIGSTOP, a debugger) or wedged as a whole process, which no collective timeout
// catches when the worker is not inside a collective.
//
// The agent gives each worker the write end of a pipe (LOOM_HEARTBEAT_FD) and the beat interval
// (LOOM_HEARTBEAT_INTERVAL_MS); a thread in the worker writes one byte per interval. The agent
// watches a worker only once its first beat arrived, so programs that do not beat (any
// --no-python command) are never declared hung.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace loom::distributed {

inline constexpr const char* kHeartbeatFdEnv = "LOOM_HEARTBEAT_FD";
inline constexpr const char* kHeartbeatIntervalEnv = "LOOM_HEARTBEAT_INTERVAL_MS";

class HeartbeatSender {
 public:
  // Beats into `fd` (owned from now on) every `interval`; the first beat goes out at once.
  HeartbeatSender(int fd, std::chrono::milliseconds interval);
  ~HeartbeatSender();
  HeartbeatSender(const HeartbeatSender&) = delete;
  HeartbeatSender& operator=(const HeartbeatSender&) = delete;

  // The sender the agent asked for through the environment; null when not launched by an agent
  // that watches heartbeats. Throws loom::InputError for malformed variables.
  static std::unique_ptr<HeartbeatSender> from_environment();

 private:
  void run();

  int fd_;
  std::chrono::milliseconds interval_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// The beat interval for a heartbeat timeout: several beats per timeout, at most one a second.
std::chrono::milliseconds heartbeat_interval_for(double timeout_s);

}  // namespace loom::distributed
