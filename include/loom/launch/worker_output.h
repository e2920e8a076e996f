// Where a worker's output goes: its stdout and stderr arrive through pipes in arbitrary chunks;
// they are cut into whole lines, then each line goes to the console (with a "[rank3]: " prefix,
// when the rank is shown) and to the rank's log file (as is). A last line without a newline is
// delivered when the stream ends, never lost.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace loom::distributed {

// Cuts a byte stream into lines (each handed over with its '\n').
class LineSplitter {
 public:
  using LineFn = std::function<void(std::string_view line)>;
  // Lines longer than this are handed over in pieces, so a worker printing without newlines
  // cannot grow the launcher's memory without bound.
  static constexpr size_t kMaxLine = 64 * 1024;

  void feed(std::string_view bytes, const LineFn& on_line);
  // Hands over a pending partial line, completed with '\n'.
  void finish(const LineFn& on_line);
  bool has_pending() const { return !pending_.empty(); }

 private:
  std::string pending_;
};

// Whether a worker's line is a loom log line below warning level ("[...] [rankN] [component]
// info: ..."), which the console leaves out for all ranks but rank 0 by default (with the
// indented continuation lines of such a message). Anything else (warnings, errors, a crash's
// message, plain program output) is kept.
bool is_routine_log_line(std::string_view line);

class WorkerOutput {
 public:
  // `to_console` false: the console shows nothing of this worker; `routine_to_console` false:
  // it shows all but routine log lines (is_routine_log_line). `log_path`: the file gets every
  // line; it is created (truncated) now; throws loom::IoError when it cannot be.
  WorkerOutput(std::string console_prefix, bool to_console,
               const std::optional<std::string>& log_path, bool routine_to_console = true);
  ~WorkerOutput();
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  // `stream` is 1 (stdout) or 2 (stderr); console lines go to the launcher's same stream.
  void on_bytes(int stream, std::string_view bytes);
  // The stream ended: flush its partial line.
  void on_end(int stream);

 private:
  void emit(int stream, std::string_view line);

  std::string prefix_;
  bool to_console_;
  bool routine_to_console_ = true;
  bool in_routine_[2] = {false, false};  // the stream's last line was a routine log line
  int log_fd_ = -1;
  LineSplitter splitters_[2];
};

}  // namespace loom::distributed
