// Which job a rendezvous store belongs to. c10d's TCPStore accepts any client, so a rank started
// with another job's MASTER_PORT (two jobs on one host, one port) would join that job's store
// and its Gloo rendezvous. The handshake, in this order:
//
//   owner    right after it binds: writes its run id (the launcher's TORCHELASTIC_RUN_ID,
//   torchrun's
//            --rdzv-id) and, for a workers' store, the world size;
//   client   right after it connects, before it writes anything: reads them (a short wait: the
//            owner writes them first) and refuses a store of another run, or one without a run
//            id (another program's), with one line naming both runs and the address;
//   everyone claims its rank (a second claim means another job with the same run id and world
//            uses the store) and waits until the whole world has joined.
#pragma once

#include <chrono>
#include <string>

namespace c10d {
class Store;
}

namespace loom::distributed {

struct StoreIdentity {
  std::string run_id;
  int world_size = 0;  // 0: not fixed (the elastic agents' store)
};

// How long a client waits for the owner's identity: the owner writes it right after binding,
// so only a store that is not a loom job's runs this out.
inline constexpr std::chrono::milliseconds kStoreIdentityWait{10000};

// The owner, right after binding.
void write_store_identity(c10d::Store& store, const StoreIdentity& identity);

// The run id the store's owner wrote; InputError naming `address` when there is none within
// `wait` (a store of another program, or of a loom without this handshake).
std::string read_store_run_id(c10d::Store& store, const std::string& address,
                              std::chrono::milliseconds wait, const std::string& advice);

// A client, right after connecting: InputError naming both run ids (or world sizes), `address`
// and `advice` (how to pick another port) when the store belongs to another job.
void check_store_identity(c10d::Store& store, const StoreIdentity& mine, const std::string& address,
                          std::chrono::milliseconds wait, const std::string& advice);

// Claims `rank` for `attempt` (InputError when it was claimed already: another job of the same
// run id and world uses the store), then waits until every rank of `world_size` joined
// (CommError naming how many did within `timeout`). `attempt` separates the joins of restarts
// that share one store (torchrun's agent store); a store rank 0 hosts is new each start (0).
void join_store(c10d::Store& store, int rank, int world_size, int attempt,
                const std::string& run_id, const std::string& address,
                std::chrono::milliseconds timeout, const std::string& advice);

}  // namespace loom::distributed
