#include "loom/launch/worker_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loom/core/check.h"

namespace loom::distributed {
namespace {

// Writes all of `data`, retrying short writes. A closed console (EPIPE) or a full disk must not
// stop the launcher from supervising its workers, so failures are dropped.
void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

void LineSplitter::feed(std::string_view bytes, const LineFn& on_line) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      pending_.append(bytes);
      while (pending_.size() >= kMaxLine) {
        on_line(std::string(pending_, 0, kMaxLine) + "\n");
        pending_.erase(0, kMaxLine);
      }
      return;
    }
    if (pending_.empty()) {
      on_line(bytes.substr(0, newline + 1));
    } else {
      pending_.append(bytes.substr(0, newline + 1));
      on_line(pending_);
      pending_.clear();
    }
    bytes.remove_prefix(newline + 1);
  }
}

void LineSplitter::finish(const LineFn& on_line) {
  if (pending_.empty()) return;
  pending_ += '\n';
  on_line(pending_);
  pending_.clear();
}

bool is_routine_log_line(std::string_view line) {
  // loom's log pattern (core/logging.cpp): "[date time] [rankN] [component] level: message".
  if (line.empty() || line.front() != '[') return false;
  const size_t level_end = line.find(": ");
  if (level_end == std::string_view::npos) return false;
  const size_t component_end = line.rfind("] ", level_end);
  if (component_end == std::string_view::npos) return false;
  const std::string_view level = line.substr(component_end + 2, level_end - component_end - 2);
  return level == "info" || level == "debug" || level == "trace";
}

WorkerOutput::WorkerOutput(std::string console_prefix, bool to_console,
                           const std::optional<std::string>& log_path, bool routine_to_console)
    : prefix_(std::move(console_prefix)),
      to_console_(to_console),
      routine_to_console_(routine_to_console) {
  if (log_path) {
    log_fd_ = ::open(log_path->c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0644);
    LOOM_CHECK_AS(IoError, log_fd_ >= 0, "cannot create log file '", *log_path,
                  "': ", std::strerror(errno));
  }
}

WorkerOutput::~WorkerOutput() {
  if (log_fd_ >= 0) ::close(log_fd_);
}

void WorkerOutput::on_bytes(int stream, std::string_view bytes) {
  splitters_[stream - 1].feed(bytes, [&](std::string_view line) { emit(stream, line); });
}

void WorkerOutput::on_end(int stream) {
  splitters_[stream - 1].finish([&](std::string_view line) { emit(stream, line); });
}

void WorkerOutput::emit(int stream, std::string_view line) {
  if (log_fd_ >= 0) write_all(log_fd_, line);
  bool& in_routine = in_routine_[stream - 1];
  // A multi-line message continues with indented lines (and may end with an empty one).
  const bool continuation =
      !line.empty() && (line.front() == ' ' || line.front() == '\t' || line.front() == '\n');
  in_routine = is_routine_log_line(line) || (in_routine && continuation);
  if (to_console_ && (routine_to_console_ || !in_routine)) {
    // One write per line keeps lines of different workers from interleaving mid-line.
    std::string prefixed;
    prefixed.reserve(prefix_.size() + line.size());
    prefixed.append(prefix_).append(line);
    write_all(stream == 1 ? STDOUT_FILENO : STDERR_FILENO, prefixed);
  }
}

}  // namespace loom::distributed
