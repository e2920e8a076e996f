// `loom launch`: a torchrun-compatible launcher, built as an agent in torchelastic's sense.
//
//   RendezvousHandler  decides who is in the job and which global ranks this node's workers get
//                      (StaticRendezvous: fixed --nnodes, global rank = node_rank * nproc +
//                      local_rank). A dynamic rendezvous (c10d store, --nnodes MIN:MAX) plugs in
//                      here: the agent asks for a new round before every (re)start.
//   WorkerGroup        spawns, watches and stops one round's workers (worker_group.h).
//   LocalAgent         the loop: rendezvous -> start -> watch -> on failure stop and restart (up
//                      to --max-restarts) or report; forwards SIGINT/SIGTERM/SIGHUP.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace spdlog {
class logger;
}

namespace loom::distributed {

struct WorkerSpec;
class WorkerGroup;

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 0: pick a free port (single node only)
  // The job's identity, given to the workers as TORCHELASTIC_RUN_ID: a rank refuses a
  // rendezvous store of another run (store_identity.h). --rdzv-id, else a fresh one (new_run_id)
  // for one node; several static nodes must agree without talking, so "none" unless given.
  std::string run_id = "none";
  int max_restarts = 0;
  std::optional<std::set<int>> local_ranks_filter;  // local ranks shown on the console
  // Without a filter: local rank 0 (each node's console; rank 0 on the first node) shows
  // everything, the other ranks only what is not a routine (info) log line, as torchtitan's
  // LOG_RANK=0 default but keeping their warnings. false: every rank shows everything
  // (--local-ranks-filter all).
  bool quiet_other_ranks = true;
  std::optional<std::string> log_dir;  // <log_dir>/attempt_<k>/rank_<r>.log
  double monitor_interval_s = 0.1;
  double grace_period_s = 30.0;  // SIGTERM -> SIGKILL (--grace-period, --term-timeout)
  // A worker that beat once and then stays silent this long is hung (SIGSTOP, wedged): the
  // agent kills it and restarts the group. 0: heartbeats off.
  double heartbeat_timeout_s = 30.0;
  std::string role = "rank";         // console prefix "[<role><rank>]: "
  std::vector<std::string> program;  // each worker's argv
  // Called before each (re)start with the round's world size: arguments to append to
  // `program` for that many ranks (`loom launch --replan-layout`: a parallel layout planned for
  // them). Empty: `program` as given.
  std::function<std::vector<std::string>(int world_size)> extra_args_for_world;
};

// Throws loom::InputError naming the flag for any bad value.
void validate(const LaunchOptions& options);

// --nproc-per-node: an integer, "cpu" (logical CPUs), "gpu" (visible NVIDIA GPUs: error when
// none) or "auto" (GPUs if any, else CPUs). Throws InputError for anything else.
int resolve_nproc_per_node(const std::string& value);
// The visible NVIDIA GPUs, without CUDA: CUDA_VISIBLE_DEVICES when set, else the driver's
// /proc/driver/nvidia/gpus entries.
int visible_gpu_count();
// CPUs this process may run on (its affinity mask: taskset, cpusets), at least 1.
int available_cpus();
// OMP_NUM_THREADS for each of `ranks_per_node` workers sharing `cpus`: an equal share, at least
// 1, so the workers' intra-op pools together use every CPU without oversubscribing them.
int threads_per_rank(int cpus, int ranks_per_node);

// A fresh random run id (16 hex digits), for a launch without --rdzv-id.
std::string new_run_id();

// A TCP port the kernel says is free now (the workers bind it moments later: a small race that
// torchrun's standalone mode accepts too).
int pick_free_port();

// One rendezvous round's outcome for this node.
struct RendezvousResult {
  int world_size = 1;
  int group_rank = 0;        // this node
  int group_world_size = 1;  // nodes
  int local_world_size = 1;
  std::vector<int> global_ranks;  // by local rank
  std::string master_addr;
  int master_port = 0;
  std::string run_id = "none";  // TORCHELASTIC_RUN_ID
  bool job_done = false;        // elastic: the job finished while this node waited to be admitted
};

// What the agent learns about the group while its workers run (elastic rendezvous only).
enum class Membership {
  kStable,
  kNodeWaiting,  // a node asks to join: stop at the next step boundary and re-form the group
  kRoundEnded,   // another node failed, left or was lost: stop and re-form the group
};

class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;
  // Called before each (re)start of the worker group; `round` counts from 0.
  virtual RendezvousResult next_rendezvous(int round) = 0;
  virtual std::string name() const = 0;
  // Called every monitor interval while the workers run; cheap (throttled store reads).
  virtual Membership poll_membership() { return Membership::kStable; }
  // This node ends the round for everyone (its workers failed, or it admits a waiting node).
  virtual void end_round(const std::string& /*reason*/) {}
  // Whether some node ended the current round (the workers' exit was not the job's end).
  virtual bool round_ended() { return false; }
  // Every worker of this node finished training: the job is done.
  virtual void job_finished() {}
};

// Fixed membership: every node is told its rank and the job size up front.
class StaticRendezvous : public RendezvousHandler {
 public:
  // On node 0 (where rank 0 hosts the store), a port something already listens on is an
  // InputError here, before any worker starts (check_store_port_free).
  explicit StaticRendezvous(const LaunchOptions& options);
  RendezvousResult next_rendezvous(int round) override;
  std::string name() const override { return "static"; }

 private:
  LaunchOptions options_;
  int port_ = 0;  // resolved once, so restarts keep the same address
};

class LocalAgent {
 public:
  LocalAgent(LaunchOptions options, std::unique_ptr<RendezvousHandler> rendezvous);
  // Runs the job to the end; returns the launcher's exit code (0: every worker succeeded).
  int run();

 private:
  std::vector<WorkerSpec> make_specs(const RendezvousResult& round, int restart_count) const;
  std::vector<std::string> worker_env(const RendezvousResult& round, int local_rank,
                                      int restart_count) const;
  // Heartbeats: kills the workers silent past --heartbeat-timeout, naming them.
  void kill_silent_workers(WorkerGroup& group, int node_rank, spdlog::logger& logger) const;

  LaunchOptions options_;
  std::unique_ptr<RendezvousHandler> rendezvous_;
  int omp_threads_ = 0;  // OMP_NUM_THREADS given to each worker; 0: left as it is
};

}  // namespace loom::distributed
