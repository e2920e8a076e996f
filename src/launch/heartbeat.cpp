#include "loom/launch/heartbeat.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "loom/core/check.h"
#include "loom/core/env.h"
#include "loom/core/strings.h"

namespace loom::distributed {

HeartbeatSender::HeartbeatSender(int fd, std::chrono::milliseconds interval)
    : fd_(fd), interval_(interval) {
  // Never block on a full pipe (an agent that stopped reading): a beat lost is harmless.
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  ::fcntl(fd_, F_SETFD, FD_CLOEXEC);  // not inherited by what this worker starts
  thread_ = std::thread([this] { run(); });
}

HeartbeatSender::~HeartbeatSender() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  ::close(fd_);
}

void HeartbeatSender::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  do {
    const char beat = 'b';
    ssize_t ignored = ::write(fd_, &beat, 1);  // EAGAIN or EPIPE: the agent is not listening
    (void)ignored;
  } while (!wake_.wait_for(lock, interval_, [this] { return stop_; }));
}

std::unique_ptr<HeartbeatSender> HeartbeatSender::from_environment() {
  const auto fd_text = env::get(kHeartbeatFdEnv);
  if (!fd_text) return nullptr;
  const auto fd = strings::parse_int(*fd_text);
  LOOM_CHECK_AS(InputError, fd && *fd > 2 && *fd < 65536, kHeartbeatFdEnv,
                " must be a file descriptor number > 2, got '", *fd_text, "'");
  LOOM_CHECK_AS(InputError, ::fcntl(static_cast<int>(*fd), F_GETFD) >= 0, kHeartbeatFdEnv, "=",
                *fd, " is not an open file descriptor (set only by `loom launch`)");
  int64_t interval_ms = 1000;
  if (const auto text = env::get(kHeartbeatIntervalEnv)) {
    const auto parsed = strings::parse_int(*text);
    LOOM_CHECK_AS(InputError, parsed && *parsed >= 1 && *parsed <= 600000, kHeartbeatIntervalEnv,
                  " must be milliseconds in [1, 600000], got '", *text, "'");
    interval_ms = *parsed;
  }
  return std::make_unique<HeartbeatSender>(static_cast<int>(*fd),
                                           std::chrono::milliseconds(interval_ms));
}

std::chrono::milliseconds heartbeat_interval_for(double timeout_s) {
  const auto quarter = static_cast<int64_t>(timeout_s * 1000.0 / 4.0);
  return std::chrono::milliseconds(std::clamp<int64_t>(quarter, 10, 1000));
}

}  // namespace loom::distributed
