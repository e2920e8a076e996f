// The lifecycle of one node's workers: spawn, watch, stop. It knows nothing about how ranks were
// assigned (that is the rendezvous' job, see launcher.h); the agent builds a new group for each
// restart.
//
// Each worker runs in its own process group, so a signal reaches everything it started (a shell
// and its children, a trainer and its data workers). Workers die with SIGKILL if the launcher
// itself dies (PR_SET_PDEATHSIG), so a crashed launcher never leaves a job hanging in collectives.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/launch/worker_output.h"

namespace loom::distributed {

struct WorkerSpec {
  int local_rank = 0;
  int global_rank = 0;
  std::vector<std::string> argv;  // argv[0] is looked up in PATH when it has no '/'
  std::vector<std::string> env;   // the whole environment, "KEY=VALUE"
  std::string console_prefix;     // e.g. "[rank3]: "
  bool to_console = true;
  bool routine_to_console = true;  // false: the console gets only its warnings, errors, ...
  std::optional<std::string> log_path;
  // A heartbeat pipe (heartbeat.h): the worker beats every `heartbeat_interval`.
  bool heartbeat = false;
  std::chrono::milliseconds heartbeat_interval{1000};
};

struct Worker {
  WorkerSpec spec;
  pid_t pid = -1;
  int fds[2] = {-1, -1};           // read ends of its stdout and stderr pipes, -1 once closed
  std::optional<int> wait_status;  // set once reaped
  int exit_order = -1;             // 0 for the first worker seen to exit, 1 for the next, ...
  std::unique_ptr<WorkerOutput> output;
  int heartbeat_fd = -1;  // read end of its heartbeat pipe, -1 once closed or without one
  std::optional<std::chrono::steady_clock::time_point> last_beat;  // unset until the first beat
  double hung_for_s = 0;  // > 0: the agent killed it after this long without a heartbeat

  bool exited() const { return wait_status.has_value(); }
  bool succeeded() const;
  // "exited with code 3" / "killed by signal SIGKILL (9)"; "running" before it exits.
  std::string describe_exit() const;
  // The launcher's exit code for this worker's failure: its code, or 128 + signal.
  int exit_code() const;
};

// "SIGTERM" for 15; "signal 77" for numbers without a name.
std::string signal_name(int signal);

class WorkerGroup {
 public:
  explicit WorkerGroup(std::vector<WorkerSpec> specs);
  // Kills (SIGKILL) whatever is still running and reaps it.
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Spawns every worker; throws loom::IoError when pipes or fork fail (already started workers
  // are killed by the destructor).
  void start();

  // Waits up to `timeout_ms` for output, a worker exit or a byte on `wake_fd` (-1: none); passes
  // output on, reaps exited workers. Returns true when `wake_fd` is readable.
  bool poll(int timeout_ms, int wake_fd);

  // Stops every worker: `signal` to each process group, up to `grace_s` for them to exit (output
  // keeps flowing), then SIGKILL. `escalate` is called whenever `wake_fd` is readable; returning
  // true sends SIGKILL at once. Leftover processes in the workers' groups are killed too.
  void stop(int signal, double grace_s, int wake_fd, const std::function<bool()>& escalate);

  // After every worker exited: reads what is left in the pipes (bounded by `max_ms`, in case a
  // leftover child holds a pipe open) and flushes partial lines.
  void drain_output(int max_ms);

  // Sends `signal` to each running worker process itself (not its process group: helpers it
  // started keep their default action). SIGUSR1 asks loom workers for flight-recorder dumps.
  void signal_workers(int signal);

  // Running workers that beat at least once and then fell silent for longer than `timeout`.
  std::vector<Worker*> silent_workers(std::chrono::milliseconds timeout);
  // SIGKILL to a hung worker's process group (a stopped process still dies of it); its exit
  // then reports how long it was silent.
  void kill_hung(Worker& worker);

  bool all_exited() const;
  bool all_succeeded() const;
  // The worker that failed first, if any.
  const Worker* first_failure() const;
  // Workers that failed (in exit order), for the final report.
  std::vector<const Worker*> failures() const;
  const std::vector<Worker>& workers() const { return workers_; }

 private:
  void spawn(Worker& worker);
  void reap();
  void read_ready(Worker& worker, int stream);
  void read_heartbeats(Worker& worker);
  void close_stream(Worker& worker, int stream);
  void signal_groups(int signal);

  std::vector<Worker> workers_;
  int exits_seen_ = 0;
};

}  // namespace loom::distributed
