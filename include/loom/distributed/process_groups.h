// The job's process groups: one rendezvous through c10d's TCPStore (rank 0 hosts it at
// MASTER_ADDR:MASTER_PORT; the other ranks check that it is their job's, store_identity.h), the
// world group, and sub-groups made from rank lists (the device mesh's dimensions). Each group
// holds Gloo for CPU tensors and, on CUDA jobs, NCCL.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/distributed/comm.h"
#include "loom/distributed/job_secret.h"
#include "loom/distributed/watchdog.h"

namespace loom::distributed {

struct CommInit {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // The job's identity in the store (TORCHELASTIC_RUN_ID): a rank refuses a store of another run.
  std::string run_id = "none";
  // TORCHELASTIC_RESTART_COUNT: keeps each restart's rank claims apart in torchrun's agent store.
  int restart_count = 0;
  CommOptions options;
  bool with_cuda = false;  // also create NCCL backends (CUDA tensors)
  // torchrun's agent already hosts the TCPStore at MASTER_ADDR:MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank connects as a client.
  bool store_hosted_by_agent = false;
  // The job secret (LOOM_JOB_SECRET, or the lighthouse's for fault-tolerant groups): rank 0's
  // store then admits only processes that prove they hold it (secured_store.h). Empty: any
  // loom process that reaches MASTER_ADDR's interface.
  JobSecret secret;
  // Create the store and c10d backends even for a world of one rank (tests of the NCCL path on
  // a single GPU); otherwise one rank is the local path.
  bool backends_for_single_rank = false;
  // Flight recorder (comm.trace_buf_size entries per rank; 0: off) and the file this rank dumps
  // it to (empty: no dumps). With both, a watcher thread dumps on SIGUSR1 and whenever any rank
  // asks through the store (a collective of its failed or timed out).
  size_t trace_buffer_size = 2000;
  std::string trace_dump_path;
  // The collective watchdog (watchdog.h), armed by use_train_timeout(): a collective blocked
  // past train_timeout + watchdog_grace runs `on_hang` (null: name it, dump, end the process).
  // Off by default: a test whose threads are ranks must not have its process ended.
  bool collective_watchdog = false;
  std::chrono::milliseconds watchdog_grace{std::chrono::seconds(3)};
  std::function<void(const HangInfo&)> on_hang;
};

class ProcessGroups {
 public:
  // Blocks until every rank joined (or throws CommError after options.init_timeout).
  explicit ProcessGroups(const CommInit& init);
  ~ProcessGroups();
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;

  int rank() const { return init_.rank; }
  int world_size() const { return init_.world_size; }
  Comm& world() { return *world_; }
  std::shared_ptr<Comm> world_ptr() { return world_; }

  // The group of `global_ranks` (ascending or not: their order defines group ranks), which must
  // contain this rank. Every member calls it with the same name and ranks; other ranks do not
  // call it. A one-rank group is local; the world's rank list returns the world group.
  std::shared_ptr<Comm> new_group(const std::string& name, const std::vector<int>& global_ranks);

  // After the first step: every group switches to comm.train_timeout_seconds, and the
  // collective watchdog (when enabled) is armed.
  void use_train_timeout();

  // Wire bytes this rank sent over every group, by collective (indexed by Collective), and their
  // sum.
  std::array<uint64_t, kCollectiveKinds> wire_bytes_by_collective() const;
  uint64_t total_wire_bytes() const;
  const std::vector<std::shared_ptr<Comm>>& groups() const { return groups_; }
  // Every group's counters (in groups() order), and setting them back (step_graph.h).
  std::vector<TrafficCounts> traffic() const;
  void set_traffic(const std::vector<TrafficCounts>& traffic);
  // Collectives of CUDA tensors run on host copies over Gloo (CommOptions::cuda_through_host).
  bool cuda_through_host() const { return init_.options.cuda_through_host; }
  // This rank's flight recorder; null when comm.trace_buf_size = 0 or the world has one rank.
  FlightRecorder* recorder() { return init_.options.recorder.get(); }

 private:
  struct StoreHolder;
  void start_flight_recorder();

  CommInit init_;
  std::unique_ptr<StoreHolder> store_;
  std::unique_ptr<DumpWatcher> dump_watcher_;
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  std::shared_ptr<Comm> world_;
  std::vector<std::shared_ptr<Comm>> groups_;  // world first
};

}  // namespace loom::distributed
