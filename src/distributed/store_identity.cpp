#include "loom/distributed/store_identity.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <thread>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"
#include "loom/distributed/store_text.h"

namespace loom::distributed {
namespace {

constexpr const char* kRunIdKey = "loom/job/run_id";
constexpr const char* kWorldSizeKey = "loom/job/world_size";

// Whether `key` appears within `wait`: c10d's wait, whose timeout also logs two c10d warnings
// (fine for a rendezvous that failed anyway).
bool appears(c10d::Store& store, const std::string& key, std::chrono::milliseconds wait) {
  try {
    store.wait({key}, wait);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

// The same by polling, silent: for the identity, whose absence is an expected error.
bool appears_quietly(c10d::Store& store, const std::string& key, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    if (store.check({key})) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string attempt_prefix(int attempt) {
  return "loom/job/attempt" + std::to_string(attempt) + "/";
}

}  // namespace

void write_store_identity(c10d::Store& store, const StoreIdentity& identity) {
  // The world size first: a client that sees the run id finds it there too.
  if (identity.world_size > 0)
    store.set(kWorldSizeKey, store_bytes(std::to_string(identity.world_size)));
  store.set(kRunIdKey, store_bytes(identity.run_id));
}

std::string read_store_run_id(c10d::Store& store, const std::string& address,
                              std::chrono::milliseconds wait, const std::string& advice) {
  LOOM_CHECK_AS(InputError, appears_quietly(store, kRunIdKey, wait), "the store at ", address,
                " holds no loom run id after ", wait.count() / 1000.0,
                " s: it is not this job's (another program or job listens there); ", advice);
  return store_text(store.get(kRunIdKey));
}

void check_store_identity(c10d::Store& store, const StoreIdentity& mine, const std::string& address,
                          std::chrono::milliseconds wait, const std::string& advice) {
  const std::string theirs = read_store_run_id(store, address, wait, advice);
  LOOM_CHECK_AS(InputError, theirs == mine.run_id, "the rendezvous store at ", address,
                " belongs to run '", theirs, "' (this job is run '", mine.run_id,
                "'): another job uses this port; ", advice);
  if (mine.world_size <= 0 || !store.check({kWorldSizeKey})) return;
  const std::string world = store_text(store.get(kWorldSizeKey));
  LOOM_CHECK_AS(InputError, world == std::to_string(mine.world_size), "the rendezvous store at ",
                address, " belongs to a job of ", world, " ranks (run '", theirs,
                "'; this job has ", mine.world_size, "): another job uses this port; ", advice);
}

void join_store(c10d::Store& store, int rank, int world_size, int attempt,
                const std::string& run_id, const std::string& address,
                std::chrono::milliseconds timeout, const std::string& advice) {
  const std::string prefix = attempt_prefix(attempt);
  const int64_t claims = store.add(prefix + "rank/" + std::to_string(rank), 1);
  LOOM_CHECK_AS(InputError, claims == 1, "rank ", rank, " already joined the rendezvous store at ",
                address, " (run '", run_id, "'): another job with the same run id uses this port; ",
                advice);
  const std::string joined = prefix + "joined";
  const std::string complete = prefix + "complete";
  if (store.add(joined, 1) == world_size) store.set(complete, store_bytes("1"));
  if (appears(store, complete, timeout)) return;
  std::string count = "fewer";
  try {
    count = std::to_string(store.add(joined, 0));
  } catch (const std::exception&) {
    // The store's owner is gone; the count is lost with it.
  }
  LOOM_THROW(CommError, "rendezvous at ", address, ": ", count, " of ", world_size,
             " ranks joined within comm.init_timeout_seconds = ", timeout.count() / 1000.0,
             " s; check that every rank started, with the same MASTER_ADDR and MASTER_PORT");
}

}  // namespace loom::distributed
