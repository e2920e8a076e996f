// Elastic rendezvous for `loom launch --nnodes MIN:MAX`, on a c10d TCPStore at --rdzv-endpoint
// (hosted by the first agent that binds it), after torchelastic's dynamic rendezvous:
//
//   rounds      the job runs in numbered rounds; each round has a fixed membership. A node
//               joins the open round; its first joiner leads it: it waits for MIN nodes (up to
//               join_timeout), then up to last_call_timeout for more (or until MAX), and closes
//               it. Nodes get ranks in join order (reassigned every round); the leader's node
//               hosts the workers' store.
//   late nodes  a node finding the round closed registers as waiting; the running agents stop
//               their workers at the next step boundary (SIGTERM: the trainer saves and exits),
//               and everyone joins the next round.
//   failures    an agent whose workers fail ends the round for everyone; the next round is
//               formed from the nodes still alive (the group shrinks when a node died).
//   keep-alive  every agent bumps a counter every keep_alive_interval; a member silent for
//               keep_alive_max_attempt intervals is lost, and the round ends.
//   run id      the store's host writes the job's run id (--rdzv-id, else a fresh one); an agent
//               without --rdzv-id takes it, one with another --rdzv-id is refused (another job
//               uses the endpoint). Every worker of every round gets it as TORCHELASTIC_RUN_ID.
//
//   takeover    every agent publishes a standby address (its --local-addr, a port it picked)
//               when it joins a round. When the store stops answering (its node died), the
//               survivors of the last closed round fail over in that round's node order: an agent
//               first tries each lower node's standby address, and hosts a new store at its own
//               when none answers; the new host re-publishes the run id and opens the next round,
//               which the survivors join. (torchrun's c10d backend ends the job instead.)
//   secret      with LOOM_JOB_SECRET the store (and every standby) admits only agents that
//               prove they hold it (secured_store.h).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/intrusive_ptr.h>

#include "loom/distributed/job_secret.h"
#include "loom/launch/launcher.h"

namespace c10d {
class Store;
}

namespace loom::distributed {

struct SecuredStoreOptions;

struct ElasticOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  std::string endpoint_host = "127.0.0.1";
  int endpoint_port = 29400;
  std::string local_addr;  // this node's address for the workers' store (leader); "" = auto
  std::string run_id;      // --rdzv-id; "": the store host's (a fresh one on the host)
  double join_timeout_s = 600;
  double last_call_timeout_s = 30;
  double keep_alive_interval_s = 5;
  int keep_alive_max_attempt = 3;
  // LOOM_JOB_SECRET: the agents' store (and each standby) admits only agents that hold it
  // (secured_store.h); empty: c10d's open store on the endpoint's interface.
  JobSecret secret;
};

// Parses torchrun's --rdzv-conf "join_timeout=600,last_call_timeout=30,keep_alive_interval=5,
// keep_alive_max_attempt=3" into `options`; throws InputError naming an unknown key or a bad value.
void apply_rdzv_conf(const std::string& conf, ElasticOptions& options);

class ElasticRendezvous : public RendezvousHandler {
 public:
  explicit ElasticRendezvous(ElasticOptions options);
  ~ElasticRendezvous() override;

  RendezvousResult next_rendezvous(int attempt) override;
  Membership poll_membership() override;
  void end_round(const std::string& reason) override;
  bool round_ended() override;
  void job_finished() override;
  std::string name() const override { return "c10d elastic"; }

 private:
  struct Store;
  // The host writes the run id; the others take it or refuse a store of another run.
  void agree_on_run_id();
  std::string key(int64_t round, const std::string& name) const;
  void lead(int64_t round);
  bool previous_members_gone(int64_t round);
  void keep_alive_loop();
  RendezvousResult join_next_round();
  // The store stopped answering: move to the successor's (or host it); false when this agent
  // knows no successor (no round closed yet).
  bool fail_over();
  c10::intrusive_ptr<c10d::Store> current_store();
  // The agents' store at host:port, with this job's secret.
  SecuredStoreOptions secured_store_options(const std::string& host, int port) const;

  ElasticOptions options_;
  std::unique_ptr<Store> store_;
  bool hosts_store_ = false;
  std::mutex mutex_;  // round_, index_ (read by the keep-alive thread)
  int64_t round_ = -1;
  int index_ = -1;
  int members_ = 0;
  std::chrono::steady_clock::time_point last_poll_;
  std::map<int, std::pair<int64_t, std::chrono::steady_clock::time_point>> alive_seen_;
  int standby_port_ = 0;
  std::vector<std::string> standbys_;  // the last closed round's standby addresses, by node
  int standby_index_ = -1;             // this agent's node index in that round
  bool stop_ = false;
  std::thread keep_alive_;
};

}  // namespace loom::distributed
