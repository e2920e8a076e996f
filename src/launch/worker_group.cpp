#include "loom/launch/worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>

#include "loom/core/check.h"
#include "loom/launch/heartbeat.h"

namespace loom::distributed {
namespace {

using Clock = std::chrono::steady_clock;

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

void make_pipe(int fds[2]) {
  LOOM_CHECK_AS(IoError, ::pipe2(fds, O_CLOEXEC) == 0,
                "cannot create a pipe for a worker: ", std::strerror(errno));
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
}

// Only async-signal-safe calls between fork and exec.
[[noreturn]] void exec_child(pid_t parent, char* const* argv, char* const* envp, int out_fd,
                             int err_fd, int heartbeat_fd, const std::string& exec_error) {
  // Signals are blocked since before fork: reset the launcher's handlers (they would write into
  // its signal pipe) and ignored signals (they stay ignored across exec) before unblocking, so a
  // SIGTERM sent to the group now takes its default action.
  for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGQUIT}) std::signal(sig, SIG_DFL);
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took effect
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  const int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
  ::dup2(out_fd, STDOUT_FILENO);
  ::dup2(err_fd, STDERR_FILENO);
  if (heartbeat_fd >= 0) ::fcntl(heartbeat_fd, F_SETFD, 0);  // the one pipe end the worker keeps
  ::execvpe(argv[0], argv, envp);
  const int saved = errno;
  ssize_t ignored = ::write(STDERR_FILENO, exec_error.data(), exec_error.size());
  const char* reason = std::strerror(saved);
  ignored = ::write(STDERR_FILENO, reason, std::strlen(reason));
  ignored = ::write(STDERR_FILENO, "\n", 1);
  (void)ignored;
  ::_exit(127);
}

std::vector<char*> c_strings(std::vector<std::string>& items) {
  std::vector<char*> out;
  out.reserve(items.size() + 1);
  for (auto& item : items) out.push_back(item.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

void WorkerGroup::signal_workers(int signal) {
  for (const auto& worker : workers_) {
    if (worker.pid > 0 && !worker.exited()) ::kill(worker.pid, signal);
  }
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    default: return "signal " + std::to_string(signal);
  }
}

bool Worker::succeeded() const {
  return wait_status && WIFEXITED(*wait_status) && WEXITSTATUS(*wait_status) == 0;
}

std::string Worker::describe_exit() const {
  if (!wait_status) return "running";
  if (hung_for_s > 0) {
    return "hung: no heartbeat for " + std::to_string(static_cast<int>(hung_for_s + 0.5)) +
           " s (stopped by SIGSTOP or a debugger, or wedged), killed by the launcher";
  }
  if (WIFEXITED(*wait_status))
    return "exited with code " + std::to_string(WEXITSTATUS(*wait_status));
  const int sig = WTERMSIG(*wait_status);
  return "killed by signal " + signal_name(sig) + " (" + std::to_string(sig) + ")";
}

int Worker::exit_code() const {
  if (!wait_status) return 1;
  if (WIFEXITED(*wait_status)) return WEXITSTATUS(*wait_status);
  return 128 + WTERMSIG(*wait_status);
}

WorkerGroup::WorkerGroup(std::vector<WorkerSpec> specs) {
  workers_.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) workers_[i].spec = std::move(specs[i]);
}

WorkerGroup::~WorkerGroup() {
  signal_groups(SIGKILL);
  for (Worker& worker : workers_) {
    if (worker.pid > 0 && !worker.exited()) {
      int status = 0;
      while (::waitpid(worker.pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    for (int stream : {1, 2}) close_stream(worker, stream);
    if (worker.heartbeat_fd >= 0) ::close(worker.heartbeat_fd);
  }
}

void WorkerGroup::start() {
  for (Worker& worker : workers_) spawn(worker);
}

void WorkerGroup::spawn(Worker& worker) {
  WorkerSpec& spec = worker.spec;
  worker.output =
      std::make_unique<WorkerOutput>(spec.console_prefix, spec.to_console, spec.log_path,
                                     spec.routine_to_console);
  int out_pipe[2];
  int err_pipe[2];
  make_pipe(out_pipe);
  try {
    make_pipe(err_pipe);
  } catch (...) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw;
  }
  // Everything the child needs is built before fork.
  int beat_pipe[2] = {-1, -1};
  std::vector<std::string> env = spec.env;
  if (spec.heartbeat) {
    if (::pipe2(beat_pipe, O_CLOEXEC) != 0) {
      const int saved = errno;
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
      LOOM_THROW(IoError, "cannot create a heartbeat pipe for a worker: ", std::strerror(saved));
    }
    ::fcntl(beat_pipe[0], F_SETFL, ::fcntl(beat_pipe[0], F_GETFL) | O_NONBLOCK);
    env.push_back(std::string(kHeartbeatFdEnv) + "=" + std::to_string(beat_pipe[1]));
    env.push_back(std::string(kHeartbeatIntervalEnv) + "=" +
                  std::to_string(spec.heartbeat_interval.count()));
  }
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> envp = c_strings(env);
  const std::string exec_error = "loom launch: cannot run '" + spec.argv.at(0) + "': ";
  const pid_t parent = ::getpid();
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &previous);
  const pid_t pid = ::fork();
  if (pid == 0) {
    exec_child(parent, argv.data(), envp.data(), out_pipe[1], err_pipe[1], beat_pipe[1],
               exec_error);
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (beat_pipe[1] >= 0) ::close(beat_pipe[1]);
  worker.fds[0] = out_pipe[0];
  worker.fds[1] = err_pipe[0];
  worker.heartbeat_fd = beat_pipe[0];
  LOOM_CHECK_AS(IoError, pid > 0, "cannot start worker for rank ", spec.global_rank,
                " (fork failed): ", std::strerror(fork_errno));
  ::setpgid(pid, pid);  // also in the child: whichever runs first, signals find the group
  worker.pid = pid;
}

bool WorkerGroup::poll(int timeout_ms, int wake_fd) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, int>> owners;
  for (Worker& worker : workers_) {
    for (int stream : {1, 2}) {
      if (worker.fds[stream - 1] < 0) continue;
      fds.push_back({worker.fds[stream - 1], POLLIN, 0});
      owners.emplace_back(&worker, stream);
    }
    if (worker.heartbeat_fd >= 0) {
      fds.push_back({worker.heartbeat_fd, POLLIN, 0});
      owners.emplace_back(&worker, 0);
    }
  }
  if (wake_fd >= 0) fds.push_back({wake_fd, POLLIN, 0});
  const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
  LOOM_CHECK_AS(IoError, ready >= 0 || errno == EINTR, "poll failed: ", std::strerror(errno));
  bool woke = false;
  if (ready > 0) {
    for (size_t i = 0; i < owners.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (owners[i].second == 0) {
        read_heartbeats(*owners[i].first);
      } else {
        read_ready(*owners[i].first, owners[i].second);
      }
    }
    woke = wake_fd >= 0 && (fds.back().revents & POLLIN) != 0;
  }
  reap();
  return woke;
}

void WorkerGroup::read_ready(Worker& worker, int stream) {
  char buffer[65536];
  // A bounded number of reads per wake-up, so one chatty worker cannot starve the others.
  for (int round = 0; round < 16; ++round) {
    const ssize_t n = ::read(worker.fds[stream - 1], buffer, sizeof(buffer));
    if (n > 0) {
      worker.output->on_bytes(stream, std::string_view(buffer, static_cast<size_t>(n)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close_stream(worker, stream);  // end of stream (or a read error: nothing more will come)
    return;
  }
}

void WorkerGroup::read_heartbeats(Worker& worker) {
  char buffer[256];
  for (;;) {
    const ssize_t n = ::read(worker.heartbeat_fd, buffer, sizeof(buffer));
    if (n > 0) {
      worker.last_beat = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // The worker closed it (it exited, or stopped beating on purpose): nothing more to watch.
    ::close(worker.heartbeat_fd);
    worker.heartbeat_fd = -1;
    worker.last_beat.reset();
    return;
  }
}

std::vector<Worker*> WorkerGroup::silent_workers(std::chrono::milliseconds timeout) {
  std::vector<Worker*> silent;
  const auto now = Clock::now();
  for (Worker& worker : workers_) {
    if (worker.exited() || worker.hung_for_s > 0 || !worker.last_beat) continue;
    if (now - *worker.last_beat > timeout) silent.push_back(&worker);
  }
  return silent;
}

void WorkerGroup::kill_hung(Worker& worker) {
  worker.hung_for_s =
      std::chrono::duration<double>(Clock::now() - worker.last_beat.value_or(Clock::now()))
          .count();
  if (worker.pid > 0 && !worker.exited()) ::kill(-worker.pid, SIGKILL);
}

void WorkerGroup::close_stream(Worker& worker, int stream) {
  int& fd = worker.fds[stream - 1];
  if (fd < 0) return;
  ::close(fd);
  fd = -1;
  if (worker.output) worker.output->on_end(stream);
}

void WorkerGroup::reap() {
  for (Worker& worker : workers_) {
    if (worker.pid <= 0 || worker.exited()) continue;
    int status = 0;
    const pid_t done = ::waitpid(worker.pid, &status, WNOHANG);
    if (done == worker.pid) {
      worker.wait_status = status;
      worker.exit_order = exits_seen_++;
    }
  }
}

void WorkerGroup::signal_groups(int signal) {
  // The group outlives its leader while children it started still run: signal it either way.
  for (const Worker& worker : workers_) {
    if (worker.pid > 0) ::kill(-worker.pid, signal);
  }
}

void WorkerGroup::stop(int signal, double grace_s, int wake_fd,
                       const std::function<bool()>& escalate) {
  signal_groups(signal);
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int>(grace_s * 1000));
  bool killed = signal == SIGKILL;
  while (!all_exited()) {
    if (!killed && Clock::now() >= deadline) {
      signal_groups(SIGKILL);
      killed = true;
    }
    const int timeout = killed ? 50 : std::min(50, ms_until(deadline));
    if (poll(timeout, wake_fd) && escalate && escalate() && !killed) {
      signal_groups(SIGKILL);
      killed = true;
    }
  }
  signal_groups(SIGKILL);  // leftovers (a shell's background children) must not outlive the group
  drain_output(1000);
}

void WorkerGroup::drain_output(int max_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(max_ms);
  auto open_streams = [this] {
    for (const Worker& worker : workers_) {
      if (worker.fds[0] >= 0 || worker.fds[1] >= 0) return true;
    }
    return false;
  };
  while (open_streams() && Clock::now() < deadline) poll(std::min(50, ms_until(deadline)), -1);
  for (Worker& worker : workers_) {
    for (int stream : {1, 2}) close_stream(worker, stream);
  }
}

bool WorkerGroup::all_exited() const {
  for (const Worker& worker : workers_) {
    if (worker.pid > 0 && !worker.exited()) return false;
  }
  return true;
}

bool WorkerGroup::all_succeeded() const {
  for (const Worker& worker : workers_) {
    if (!worker.succeeded()) return false;
  }
  return true;
}

std::vector<const Worker*> WorkerGroup::failures() const {
  std::vector<const Worker*> failed;
  for (const Worker& worker : workers_) {
    if (worker.exited() && !worker.succeeded()) failed.push_back(&worker);
  }
  std::sort(failed.begin(), failed.end(),
            [](const Worker* a, const Worker* b) { return a->exit_order < b->exit_order; });
  return failed;
}

const Worker* WorkerGroup::first_failure() const {
  auto failed = failures();
  return failed.empty() ? nullptr : failed.front();
}

}  // namespace loom::distributed
