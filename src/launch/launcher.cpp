#include "loom/launch/launcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <utility>

#include "loom/core/check.h"
#include "loom/core/env.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/distributed/store_socket.h"
#include "loom/launch/heartbeat.h"
#include "loom/launch/worker_group.h"
#include "loom/launch/world_info.h"

extern char** environ;

namespace loom::distributed {
namespace {

// Signals arrive through a pipe the agent polls together with the workers' output, so none is
// missed between two checks. SIGCHLD only wakes the loop up.
int g_signal_pipe_write = -1;

extern "C" void on_agent_signal(int signal_number) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  ssize_t ignored = ::write(g_signal_pipe_write, &byte, 1);
  (void)ignored;
  errno = saved;
}

class SignalPipe {
 public:
  SignalPipe() {
    LOOM_CHECK_AS(IoError, ::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) == 0,
                  "cannot create the signal pipe: ", std::strerror(errno));
    g_signal_pipe_write = fds_[1];
    struct sigaction action {};
    action.sa_handler = on_agent_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1}) {
      ::sigaction(sig, &action, &previous_[sig]);
    }
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &previous_[SIGPIPE]);
  }
  ~SignalPipe() {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE, SIGUSR1}) {
      ::sigaction(sig, &previous_[sig], nullptr);
    }
    g_signal_pipe_write = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return fds_[0]; }
  // The first terminating signal read from the pipe since the last call, 0 if none. SIGUSR1 (a
  // flight-recorder dump request) is remembered for take_dump_request().
  int take_terminating() {
    int found = 0;
    unsigned char bytes[64];
    ssize_t n = 0;
    while ((n = ::read(fds_[0], bytes, sizeof(bytes))) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (bytes[i] == SIGUSR1) {
          dump_requested_ = true;
        } else if (bytes[i] != SIGCHLD && found == 0) {
          found = bytes[i];
        }
      }
    }
    return found;
  }
  bool take_dump_request() { return std::exchange(dump_requested_, false); }

 private:
  int fds_[2] = {-1, -1};
  bool dump_requested_ = false;
  struct sigaction previous_[NSIG] = {};
};

// Waits up to `ms` for a terminating signal (SIGCHLD and SIGUSR1 do not end the wait); returns it,
// or 0 when the time passed.
int wait_for_signal(SignalPipe& signals, int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return 0;
    pollfd fd{signals.fd(), POLLIN, 0};
    if (::poll(&fd, 1, static_cast<int>(left)) > 0) {
      if (const int sig = signals.take_terminating(); sig != 0) return sig;
    }
  }
}

constexpr int kMaxRestartBackoffMs = 30000;

// "[launch node<N>]"; an elastic node's rank changes every round, so it goes by its pid.
std::shared_ptr<spdlog::logger> make_logger(const std::string& who) {
  auto logger = std::make_shared<spdlog::logger>(
      "launch", std::make_shared<spdlog::sinks::stderr_color_sink_st>());
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [launch " + who + "] %^%l%$: %v");
  logger->flush_on(spdlog::level::info);
  return logger;
}

std::string describe_worker(const Worker& worker, int node_rank) {
  std::string text = "rank " + std::to_string(worker.spec.global_rank) + " (local rank " +
                     std::to_string(worker.spec.local_rank) + " on node " +
                     std::to_string(node_rank) + ") " + worker.describe_exit();
  if (worker.spec.log_path) {
    text += "; log: " + *worker.spec.log_path;
  } else if (worker.spec.to_console && !worker.spec.routine_to_console) {
    text += "; its warnings and errors are above, prefixed '" + worker.spec.console_prefix +
            "' (--local-ranks-filter all or --log-dir shows all its output)";
  } else if (worker.spec.to_console) {
    text += "; its output is above, prefixed '" + worker.spec.console_prefix + "'";
  } else {
    text += "; its output was filtered out (--local-ranks-filter; use --log-dir to keep it)";
  }
  return text;
}

}  // namespace

// A port the kernel says is free now; the workers bind it moments later (a small race that
// torchrun's standalone mode accepts too).
int pick_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  LOOM_CHECK_AS(IoError, fd >= 0, "cannot open a socket to pick a port: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int saved = errno;
  ::close(fd);
  LOOM_CHECK_AS(IoError, ok, "cannot pick a free port: ", std::strerror(saved));
  return ntohs(addr.sin_port);
}

std::string new_run_id() {
  std::random_device device;
  const uint64_t value = (static_cast<uint64_t>(device()) << 32) ^ device();
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

void LocalAgent::kill_silent_workers(WorkerGroup& group, int node_rank,
                                     spdlog::logger& logger) const {
  if (options_.heartbeat_timeout_s <= 0) return;
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(options_.heartbeat_timeout_s * 1000));
  for (Worker* worker : group.silent_workers(timeout)) {
    logger.error(
        "rank {} (local rank {} on node {}, pid {}) sent no heartbeat for more than {} s: it is "
        "hung (stopped by SIGSTOP or a debugger, or wedged); killing it and stopping the group",
        worker->spec.global_rank, worker->spec.local_rank, node_rank, worker->pid,
        options_.heartbeat_timeout_s);
    group.kill_hung(*worker);
  }
}

void validate(const LaunchOptions& o) {
  LOOM_CHECK_AS(InputError, o.nproc_per_node >= 1, "--nproc-per-node must be at least 1, got ",
                o.nproc_per_node);
  LOOM_CHECK_AS(InputError, o.nnodes >= 1, "--nnodes must be at least 1, got ", o.nnodes);
  LOOM_CHECK_AS(InputError, o.node_rank >= 0 && o.node_rank < o.nnodes,
                "--node-rank must be in [0, --nnodes=", o.nnodes, "), got ", o.node_rank);
  LOOM_CHECK_AS(InputError, o.master_port >= 0 && o.master_port <= 65535,
                "--master-port must be a TCP port (1..65535, or 0 for a free one), got ",
                o.master_port);
  LOOM_CHECK_AS(InputError, o.master_port != 0 || o.nnodes == 1,
                "--master-port 0 (pick a free port) only works with --nnodes 1: the other nodes "
                "could not know it");
  LOOM_CHECK_AS(InputError, !o.master_addr.empty(), "--master-addr must not be empty");
  LOOM_CHECK_AS(InputError, is_valid_run_id(o.run_id), "--rdzv-id must be 1..128 letters, digits, ",
                "'-', '_', '.' or ':', got '", o.run_id, "'");
  LOOM_CHECK_AS(InputError, o.max_restarts >= 0, "--max-restarts must be >= 0, got ",
                o.max_restarts);
  LOOM_CHECK_AS(InputError, o.monitor_interval_s > 0 && o.monitor_interval_s <= 60,
                "--monitor-interval must be in (0, 60] seconds, got ", o.monitor_interval_s);
  LOOM_CHECK_AS(InputError, o.grace_period_s >= 0,
                "--grace-period (--term-timeout) must be >= 0 seconds, got ", o.grace_period_s);
  LOOM_CHECK_AS(InputError, o.heartbeat_timeout_s >= 0,
                "--heartbeat-timeout must be >= 0 seconds (0: off), got ", o.heartbeat_timeout_s);
  LOOM_CHECK_AS(InputError, !o.program.empty() && !o.program.front().empty(),
                "missing the command to run: loom launch [options] -- <subcommand> [args...]");
  if (o.local_ranks_filter) {
    for (int rank : *o.local_ranks_filter) {
      LOOM_CHECK_AS(InputError, rank >= 0 && rank < o.nproc_per_node,
                    "--local-ranks-filter: ", rank, " is not a local rank (expected 0..",
                    o.nproc_per_node - 1, ")");
    }
  }
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int threads_per_rank(int cpus, int ranks_per_node) {
  return std::max(1, cpus / std::max(1, ranks_per_node));
}

int visible_gpu_count() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    int count = 0;
    for (const std::string& item : strings::split_list(visible)) {
      if (item.rfind("-1", 0) == 0) break;  // CUDA stops at the first invalid index
      ++count;
    }
    return count;
  }
  int count = 0;
  if (DIR* dir = ::opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] != '.') ++count;
    }
    ::closedir(dir);
  }
  return count;
}

int resolve_nproc_per_node(const std::string& value) {
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (value == "cpu") return cpus;
  if (value == "gpu") {
    const int gpus = visible_gpu_count();
    LOOM_CHECK_AS(InputError, gpus > 0,
                  "--nproc-per-node gpu: no NVIDIA GPU is visible (CUDA_VISIBLE_DEVICES / "
                  "/proc/driver/nvidia/gpus)");
    return gpus;
  }
  if (value == "auto") {
    const int gpus = visible_gpu_count();
    return gpus > 0 ? gpus : cpus;
  }
  auto parsed = strings::parse_int(value);
  LOOM_CHECK_AS(InputError, parsed.has_value() && *parsed >= 1 && *parsed <= 4096,
                "--nproc-per-node must be a positive integer, 'cpu', 'gpu' or 'auto', got '", value,
                "'");
  // Oversubscribing works but rarely helps: ranks share devices or cores and run slower.
  const int gpus = visible_gpu_count();
  if (gpus > 0 && *parsed > gpus) {
    log::get("launch")->warn(
        "--nproc-per-node {} is more than the {} visible GPU(s): ranks will "
        "share GPUs",
        *parsed, gpus);
  } else if (gpus == 0 && *parsed > cpus) {
    log::get("launch")->warn(
        "--nproc-per-node {} is more than the {} CPU core(s): ranks will "
        "share cores",
        *parsed, cpus);
  }
  return static_cast<int>(*parsed);
}

StaticRendezvous::StaticRendezvous(const LaunchOptions& options) : options_(options) {
  port_ = options.master_port != 0 ? options.master_port : pick_free_port();
  // Rank 0 binds the port moments later; another job's store there would fail it, and the other
  // ranks would reach that job's store instead: say so once, before starting anyone.
  if (options.node_rank == 0 && options.master_port != 0) {
    check_store_port_free(options.master_addr, port_);
  }
}

RendezvousResult StaticRendezvous::next_rendezvous(int /*round*/) {
  RendezvousResult result;
  result.group_world_size = options_.nnodes;
  result.group_rank = options_.node_rank;
  result.local_world_size = options_.nproc_per_node;
  result.world_size = options_.nnodes * options_.nproc_per_node;
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    result.global_ranks.push_back(options_.node_rank * options_.nproc_per_node + local);
  }
  result.master_addr = options_.master_addr;
  result.master_port = port_;
  result.run_id = options_.run_id;
  return result;
}

LocalAgent::LocalAgent(LaunchOptions options, std::unique_ptr<RendezvousHandler> rendezvous)
    : options_(std::move(options)), rendezvous_(std::move(rendezvous)) {
  validate(options_);
  // Many workers each spinning a full OpenMP pool oversubscribe the CPUs; torchrun gives each
  // one thread, loom an equal share of the CPUs.
  if (options_.nproc_per_node > 1 && !env::get("OMP_NUM_THREADS")) {
    omp_threads_ = threads_per_rank(available_cpus(), options_.nproc_per_node);
  }
}

std::vector<std::string> LocalAgent::worker_env(const RendezvousResult& round, int local_rank,
                                                int restart_count) const {
  std::map<std::string, std::string> vars;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string_view text(*entry);
    const size_t eq = text.find('=');
    if (eq != std::string_view::npos) vars[std::string(text.substr(0, eq))] = text.substr(eq + 1);
  }
  const std::string rank = std::to_string(round.global_ranks.at(local_rank));
  const std::string world = std::to_string(round.world_size);
  vars["RANK"] = rank;
  vars["LOCAL_RANK"] = std::to_string(local_rank);
  vars["WORLD_SIZE"] = world;
  vars["LOCAL_WORLD_SIZE"] = std::to_string(round.local_world_size);
  vars["GROUP_RANK"] = std::to_string(round.group_rank);
  vars["GROUP_WORLD_SIZE"] = std::to_string(round.group_world_size);
  vars["ROLE_RANK"] = rank;
  vars["ROLE_WORLD_SIZE"] = world;
  vars["ROLE_NAME"] = options_.role;
  vars["MASTER_ADDR"] = round.master_addr;
  vars["MASTER_PORT"] = std::to_string(round.master_port);
  vars["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart_count);
  vars["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(options_.max_restarts);
  vars["TORCHELASTIC_RUN_ID"] = round.run_id;
  if (omp_threads_ > 0) vars["OMP_NUM_THREADS"] = std::to_string(omp_threads_);
  std::vector<std::string> env;
  env.reserve(vars.size());
  for (const auto& [key, value] : vars) env.push_back(key + "=" + value);
  return env;
}

std::vector<WorkerSpec> LocalAgent::make_specs(const RendezvousResult& round,
                                               int restart_count) const {
  std::string attempt_dir;
  if (options_.log_dir) {
    attempt_dir = *options_.log_dir + "/attempt_" + std::to_string(restart_count);
    files::create_directories(attempt_dir);
  }
  std::vector<std::string> argv = options_.program;
  if (options_.extra_args_for_world) {
    const auto extra = options_.extra_args_for_world(round.world_size);
    argv.insert(argv.end(), extra.begin(), extra.end());
  }
  std::vector<WorkerSpec> specs;
  for (int local = 0; local < round.local_world_size; ++local) {
    WorkerSpec spec;
    spec.local_rank = local;
    spec.global_rank = round.global_ranks.at(local);
    spec.argv = argv;
    spec.env = worker_env(round, local, restart_count);
    spec.console_prefix = "[" + options_.role + std::to_string(spec.global_rank) + "]: ";
    spec.to_console = !options_.local_ranks_filter || options_.local_ranks_filter->count(local);
    spec.heartbeat = options_.heartbeat_timeout_s > 0;
    spec.heartbeat_interval = heartbeat_interval_for(options_.heartbeat_timeout_s);
    spec.routine_to_console =
        options_.local_ranks_filter || !options_.quiet_other_ranks || local == 0;
    if (options_.log_dir) {
      spec.log_path = attempt_dir + "/rank_" + std::to_string(spec.global_rank) + ".log";
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

int LocalAgent::run() {
  const bool fixed_rank = dynamic_cast<StaticRendezvous*>(rendezvous_.get()) != nullptr;
  auto logger = make_logger(fixed_rank ? "node" + std::to_string(options_.node_rank)
                                       : "pid" + std::to_string(::getpid()));
  if (omp_threads_ > 0) {
    logger->warn(
        "OMP_NUM_THREADS is not set: setting it to {} for each worker ({} CPUs shared by {} "
        "workers) so they do not oversubscribe the CPUs; set it yourself to tune",
        omp_threads_, available_cpus(), options_.nproc_per_node);
  }
  SignalPipe signals;
  int pending_signal = 0;
  auto escalate = [&] {
    const int sig = signals.take_terminating();
    if (sig == 0) return false;
    // A SIGTERM (the scheduler signals every process of the step, and the launcher forwards
    // its own) leaves the workers their grace period for the stop checkpoint, but is kept: the
    // launcher exits after this stop instead of restarting the group.
    if (sig == SIGTERM) {
      if (pending_signal == 0) pending_signal = sig;
      return false;
    }
    if (pending_signal == 0) pending_signal = sig;
    logger->warn("received {} while stopping the workers: killing them now", signal_name(sig));
    return true;
  };
  const int interval_ms = std::max(1, static_cast<int>(options_.monitor_interval_s * 1000));

  // Failures count against --max-restarts; re-forming the group for a membership change does not.
  int failures = 0;
  for (int attempt = 0;; ++attempt) {
    const RendezvousResult round = rendezvous_->next_rendezvous(attempt);
    if (round.job_done) {
      logger->info("the job finished before this node was admitted: nothing to do");
      return 0;
    }
    logger->info(
        "starting {} worker(s): ranks {}-{} of world size {} (node {} of {}), master "
        "{}:{}, run {}, {} rendezvous, restart {} of at most {}",
        round.local_world_size, round.global_ranks.front(), round.global_ranks.back(),
        round.world_size, round.group_rank, round.group_world_size, round.master_addr,
        round.master_port, round.run_id, rendezvous_->name(), failures, options_.max_restarts);

    WorkerGroup group(make_specs(round, attempt));
    group.start();
    int signal = 0;
    Membership change = Membership::kStable;
    while (group.first_failure() == nullptr && !group.all_exited()) {
      if (group.poll(interval_ms, signals.fd())) signal = signals.take_terminating();
      kill_silent_workers(group, round.group_rank, *logger);
      if (signals.take_dump_request()) {
        logger->warn("received SIGUSR1: forwarding it to the workers (flight-recorder dumps)");
        group.signal_workers(SIGUSR1);
      }
      if (signal != 0) break;
      change = rendezvous_->poll_membership();
      if (change != Membership::kStable) break;
    }
    if (signal != 0) {
      // Elastic: the other nodes re-form the group without this one instead of taking the
      // workers' clean stop for the end of the job.
      rendezvous_->end_round("this node received " + signal_name(signal));
      logger->warn("received {}: forwarding it to the workers, waiting up to {} s for them",
                   signal_name(signal), options_.grace_period_s);
      group.stop(signal, options_.grace_period_s, signals.fd(), escalate);
      return 128 + signal;
    }
    if (change != Membership::kStable) {
      if (change == Membership::kNodeWaiting) {
        // Ended first, so the other nodes know their workers' coming stop is no job end.
        rendezvous_->end_round("a node asks to join");
      }
      logger->warn(
          "re-forming the group ({}): SIGTERM to the workers, which finish their step, save a "
          "checkpoint and exit (up to {} s)",
          change == Membership::kNodeWaiting ? "a node asks to join" : "another node left",
          options_.grace_period_s);
      group.stop(SIGTERM, options_.grace_period_s, signals.fd(), escalate);
      if (pending_signal != 0) return 128 + pending_signal;
      continue;
    }
    if (group.all_succeeded()) {
      group.drain_output(2000);
      if (rendezvous_->round_ended()) {
        logger->info("the workers stopped for a membership change: re-forming the group");
        continue;
      }
      rendezvous_->job_finished();
      logger->info("all {} worker(s) finished successfully", round.local_world_size);
      return 0;
    }
    // Workers stopped below exit later, so this stays the first failure.
    const Worker& failed = *group.first_failure();
    logger->error("{}; stopping the other workers", describe_worker(failed, round.group_rank));
    rendezvous_->end_round("rank " + std::to_string(failed.spec.global_rank) + " failed");
    group.stop(SIGTERM, options_.grace_period_s, signals.fd(), escalate);
    if (pending_signal != 0) return 128 + pending_signal;
    // Exit 2 is loom's "bad input" (config, data, checkpoint): a restart fails the same way.
    const bool input_error = failed.exit_code() == 2;
    if (input_error && failures < options_.max_restarts) {
      logger->error(
          "not restarting: exit 2 is an input error (config, data, checkpoint), which "
          "a restart would meet again");
    }
    if (!input_error && failures < options_.max_restarts) {
      ++failures;
      // Exponential backoff, capped: a worker that dies at start would otherwise restart
      // thousands of times a minute.
      const int backoff_ms = std::min(kMaxRestartBackoffMs, 1000 << std::min(failures - 1, 10));
      logger->warn("restarting the worker group in {:.1f} s ({} of at most {} restarts)",
                   backoff_ms / 1000.0, failures, options_.max_restarts);
      if (const int sig = wait_for_signal(signals, backoff_ms); sig != 0) {
        logger->warn("received {} while waiting to restart: stopping", signal_name(sig));
        return 128 + sig;
      }
      continue;
    }
    logger->error(
        "job failed{}: {}",
        failures > 0 ? " after " + std::to_string(failures) + " restart(s)" : std::string(),
        describe_worker(failed, round.group_rank));
    return failed.exit_code() == 0 ? 1 : failed.exit_code();
  }
}

}  // namespace loom::distributed
