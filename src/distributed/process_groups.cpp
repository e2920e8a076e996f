#include "loom/distributed/process_groups.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "backend.h"
#include "loom/core/logging.h"
#include "loom/core/signals.h"
#include "loom/distributed/secured_store.h"
#include "loom/distributed/store_identity.h"
#include "loom/distributed/store_socket.h"

namespace loom::distributed {

struct ProcessGroups::StoreHolder {
  // Rank 0's store, this rank's tunnel to it, or torchrun's agent store.
  std::unique_ptr<SecuredStore> secured;
  c10::intrusive_ptr<c10d::Store> store;
};

namespace {

// c10d keeps a flight recorder of its own (a process-wide ring, 2000 entries by default) that
// records every Gloo and NCCL collective. loom records them itself (flight_recorder.h), and
// c10d's, shared by every group of the process, corrupted its map when thread ranks recorded at
// once (a crash in the thread-rank tests). Off unless the user sets TORCH_FR_BUFFER_SIZE; once,
// before the first group reads it.
void disable_c10d_flight_recorder() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("TORCH_FR_BUFFER_SIZE") == nullptr &&
        std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE") == nullptr) {
      ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
    }
  });
}

std::string join(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? "," : "") + std::to_string(ranks[i]);
  return text;
}

// The TCPStore at MASTER_ADDR:MASTER_PORT, once this job's identity is checked and every rank
// joined. Rank 0 owns it, behind a gate that admits only holders of the job secret when there is
// one (secured_store.h), unless torchrun's agent hosts it (TORCHELASTIC_USE_AGENT_STORE): that
// store is torchrun's, and admits anyone who reaches it.
std::unique_ptr<SecuredStore> join_rendezvous_store(const CommInit& init) {
  const std::string address = init.master_addr + ":" + std::to_string(init.master_port);
  const bool owner = init.rank == 0 && !init.store_hosted_by_agent;
  SecuredStoreOptions options;
  options.host = init.master_addr;
  options.port = init.master_port;
  options.secret = init.secret;
  options.names.server = "rendezvous store";
  options.names.secret_hint =
      "give every rank the launcher's LOOM_JOB_SECRET (`loom launch` passes it on)";
  options.store.numWorkers = init.world_size;
  // c10d's own wait would count this rank in before it checked whose store it reached:
  // join_store does it after the check.
  options.store.waitWorkers = false;
  options.store.timeout = init.options.init_timeout;
  std::unique_ptr<SecuredStore> secured;
  try {
    if (init.store_hosted_by_agent) {  // torchrun's store speaks no gate
      secured = SecuredStore::connect_plain(options);
    } else {
      secured = owner ? SecuredStore::host(options) : SecuredStore::connect(options);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    LOOM_THROW(CommError, "rendezvous at ", address, " (rank ", init.rank, " of ", init.world_size,
               ") failed: ", message_of(e),
               ". Check MASTER_ADDR/MASTER_PORT, that every rank started, and "
               "comm.init_timeout_seconds");
  }
  c10d::Store& store = *secured->store();
  const StoreIdentity identity{init.run_id, init.world_size};
  const std::string advice = busy_port_advice();
  try {
    if (owner) {
      write_store_identity(store, identity);
    } else if (!init.store_hosted_by_agent) {  // torchrun's agent writes no loom identity
      check_store_identity(store, identity, address, kStoreIdentityWait, advice);
    }
    // Rank 0's store is new with every start; torchrun's agent keeps its store across restarts,
    // so there each restart claims its ranks anew. (Not the restart count with rank 0's store:
    // that count is per node, and a node admitted late starts from 0.)
    const int attempt = init.store_hosted_by_agent ? init.restart_count : 0;
    join_store(store, init.rank, init.world_size, attempt, init.run_id, address,
               init.options.init_timeout, advice);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    LOOM_THROW(CommError, "rendezvous at ", address, " (rank ", init.rank, " of ", init.world_size,
               ") failed: ", message_of(e));
  }
  return secured;
}

}  // namespace

ProcessGroups::ProcessGroups(const CommInit& init) : init_(init) {
  LOOM_CHECK_AS(InputError, init.world_size >= 1 && init.rank >= 0 && init.rank < init.world_size,
                "rank ", init.rank, " is outside the world of ", init.world_size, " ranks");
  store_ = std::make_unique<StoreHolder>();
  disable_c10d_flight_recorder();
  if (init.world_size == 1 && !init.backends_for_single_rank) {
    world_ = Comm::single("world");
    groups_.push_back(world_);
    return;
  }
  LOOM_CHECK_AS(InputError, init.master_port > 0 && init.master_port < 65536,
                "MASTER_PORT must be a TCP port (1-65535), got ", init.master_port);
  const auto start = std::chrono::steady_clock::now();
  store_->secured = join_rendezvous_store(init);
  store_->store = store_->secured->store();
  start_flight_recorder();
  std::vector<int> all(init.world_size);
  for (int r = 0; r < init.world_size; ++r) all[r] = r;
  world_ = new_group("world", all);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log::get("comm")->info("rank {} of {} joined at {}:{} in {:.2f} s ({}{})", init.rank,
                         init.world_size, init.master_addr, init.master_port, seconds, "gloo",
                         !init.with_cuda                  ? ""
                         : init.options.cuda_through_host ? " (CUDA tensors through the host)"
                                                          : " + nccl");
}

namespace {
// Keys of the store every rank polls for dump requests.
constexpr const char* kDumpRequests = "loom/flight_recorder/requests";
constexpr const char* kDumpReason = "loom/flight_recorder/reason";
constexpr const char* kDumped = "loom/flight_recorder/dumped";
// How long a rank whose collective failed waits for the others to dump before it goes on to
// fail (and perhaps exit, taking the store down if it hosts it). A SIGTERM ends the wait: the
// launcher stops the job (a dead rank never dumps, and every rank waited out the full 10 s
// before the launcher's grace period ran out and it killed them).
constexpr auto kWaitForDumps = std::chrono::seconds(10);
}  // namespace

// With comm.trace_buf_size = 0 the watchdog still needs to see the collectives in flight: a
// small ring that is never dumped.
constexpr size_t kWatchdogOnlyRing = 64;

void ProcessGroups::start_flight_recorder() {
  if (init_.options.recorder) return;
  if (init_.trace_buffer_size == 0) {
    if (!init_.collective_watchdog) return;
    init_.options.recorder =
        std::make_shared<FlightRecorder>(init_.rank, init_.world_size, kWatchdogOnlyRing);
    watchdog_ = std::make_unique<CollectiveWatchdog>(init_.options.recorder, init_.on_hang);
    return;
  }
  auto recorder =
      std::make_shared<FlightRecorder>(init_.rank, init_.world_size, init_.trace_buffer_size);
  init_.options.recorder = recorder;
  if (init_.collective_watchdog) {
    watchdog_ = std::make_unique<CollectiveWatchdog>(recorder, init_.on_hang);
  }
  if (init_.trace_dump_path.empty()) return;
  recorder->set_dump_path(init_.trace_dump_path);
  c10::intrusive_ptr<c10d::Store> store = store_->store;
  // A failed collective: dump here, ask every rank to dump too, and give them time to.
  const int world = init_.world_size;
  recorder->set_failure_callback([recorder, store, world](const std::string& what) {
    if (!recorder->dump(what, true)) return;  // this rank already took part in a dump
    try {
      store->add(kDumped, 1);
      store->set(kDumpReason, what);
      store->add(kDumpRequests, 1);
      const auto deadline = std::chrono::steady_clock::now() + kWaitForDumps;
      while (store->add(kDumped, 0) < world && std::chrono::steady_clock::now() < deadline &&
             !signals::shutdown_requested()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    } catch (const std::exception& e) {
      log::get("comm")->warn("flight recorder: cannot ask the other ranks to dump: {}",
                             message_of(e));
    }
  });
  auto poll = [store]() -> std::optional<DumpWatcher::Request> {
    try {
      DumpWatcher::Request request;
      request.count = static_cast<uint64_t>(store->add(kDumpRequests, 0));
      if (request.count > 0) {
        const auto reason = store->get(kDumpReason);
        request.reason = "requested by another rank: " + store_text(reason);
      }
      return request;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  auto acknowledge = [store] {
    try {
      store->add(kDumped, 1);
    } catch (const std::exception&) {
      // The requester is gone; nothing waits for the count.
    }
  };
  dump_watcher_ = std::make_unique<DumpWatcher>(recorder, poll, acknowledge);
}

ProcessGroups::~ProcessGroups() {
  // The watcher polls the store: it stops first. Groups before the store they rendezvoused
  // through.
  watchdog_.reset();
  dump_watcher_.reset();
  groups_.clear();
  world_.reset();
}

std::shared_ptr<Comm> ProcessGroups::new_group(const std::string& name,
                                               const std::vector<int>& global_ranks) {
  auto me = std::find(global_ranks.begin(), global_ranks.end(), init_.rank);
  LOOM_CHECK(me != global_ranks.end(), "group '", name, "' [", join(global_ranks),
             "] does not contain rank ", init_.rank);
  const int group_rank = static_cast<int>(me - global_ranks.begin());
  if (global_ranks.size() == 1 && !(init_.backends_for_single_rank && !world_)) {
    auto comm = Comm::single(name);
    groups_.push_back(comm);
    return comm;
  }
  if (world_ && global_ranks == world_->global_ranks()) return world_;
  // Keys are private to the group, so ranks outside it never take part in its rendezvous.
  const std::string prefix = "loom/" + name + "/" + join(global_ranks) + "/";
  const int size = static_cast<int>(global_ranks.size());
  std::shared_ptr<Backend> cpu, cuda;
  try {
    cpu = make_gloo_backend(c10::make_intrusive<c10d::PrefixStore>(prefix + "gloo", store_->store),
                            group_rank, size, init_.options.init_timeout, init_.master_addr);
    if (init_.with_cuda && !init_.options.cuda_through_host) {
      cuda =
          make_nccl_backend(c10::make_intrusive<c10d::PrefixStore>(prefix + "nccl", store_->store),
                            group_rank, size, init_.options.init_timeout);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    LOOM_THROW(CommError, "creating group '", name, "' [", join(global_ranks), "] on rank ",
               init_.rank, " failed: ", message_of(e));
  }
  auto comm = std::make_shared<Comm>(name, global_ranks, group_rank, cpu, cuda, init_.options);
  groups_.push_back(comm);
  return comm;
}

void ProcessGroups::use_train_timeout() {
  for (auto& g : groups_) g->use_train_timeout();
  if (watchdog_) watchdog_->arm(init_.options.train_timeout, init_.watchdog_grace);
}

std::array<uint64_t, kCollectiveKinds> ProcessGroups::wire_bytes_by_collective() const {
  std::array<uint64_t, kCollectiveKinds> bytes{};
  for (const auto& g : groups_) {
    for (size_t c = 0; c < bytes.size(); ++c) {
      bytes[c] += g->counters()[static_cast<Collective>(c)].wire_bytes.load();
    }
  }
  return bytes;
}

std::vector<TrafficCounts> ProcessGroups::traffic() const {
  std::vector<TrafficCounts> out;
  for (const auto& g : groups_) out.push_back(g->counters().values());
  return out;
}

void ProcessGroups::set_traffic(const std::vector<TrafficCounts>& traffic) {
  LOOM_CHECK(traffic.size() == groups_.size(), "set_traffic: ", traffic.size(), " counts for ",
             groups_.size(), " groups");
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g]->counters().set(traffic[g]);
}

uint64_t ProcessGroups::total_wire_bytes() const {
  uint64_t total = 0;
  for (const uint64_t bytes : wire_bytes_by_collective()) total += bytes;
  return total;
}

}  // namespace loom::distributed
