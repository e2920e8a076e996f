// The lighthouse of fault-tolerant replica groups (torchft's): a process that forms a quorum of
// replica groups for every step (the rules are decide_quorum's, quorum.h) and hosts the store
// their replica process groups rendezvous on. `loom lighthouse` runs one; `loom launch
// --lighthouse` can start one next to its workers. Workers find it through TORCHFT_LIGHTHOUSE
// ("http://HOST:PORT" or "HOST:PORT", as torchft's do).
//
// It speaks c10d's TCPStore protocol (the store is in the lighthouse's process): groups register,
// beat (a counter each, bumped every heartbeat interval by a thread of their own), write their
// request for the next quorum and wait for its answer; a thread in the lighthouse reads them every
// tick, decides, writes each asker's answer and a status line (what the open round waits for,
// which `loom debug hang` prints).
//
// The store is c10d's, which authenticates nobody, so it listens on loopback only and an
// AuthGate (auth_gate.h) owns the public port: only processes that prove they hold the job
// secret reach a key, a quorum or a replica process group's rendezvous. Whatever they write is
// still read as untrusted input: every entry is parsed with bounded size and depth, and a bad
// one is dropped (logged, rate-limited) without holding up the quorum.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json_fwd.hpp>

#include "loom/distributed/auth_gate.h"
#include "loom/distributed/comm.h"
#include "loom/distributed/job_secret.h"
#include "loom/distributed/quorum.h"

namespace loom::distributed {

struct LighthouseOptions {
  std::string host = "127.0.0.1";  // an address of this host (InputError otherwise)
  int port = 29510;                // 0: any free port (tests)
  JobSecret secret;                // empty: admits anyone (`loom lighthouse --insecure`; warns)
  QuorumRules rules;
  std::chrono::milliseconds tick{20};
};

class Lighthouse {
 public:
  // Binds and starts deciding; throws InputError when the address cannot be bound.
  explicit Lighthouse(LighthouseOptions options);
  ~Lighthouse();
  Lighthouse(const Lighthouse&) = delete;
  Lighthouse& operator=(const Lighthouse&) = delete;

  int port() const { return port_; }
  std::string address() const;  // "HOST:PORT"
  // What workers put in TORCHFT_LIGHTHOUSE: "HOST:PORT?secret=HEX" (a wildcard host as
  // 127.0.0.1), or "HOST:PORT" for an open lighthouse.
  std::string worker_address() const;
  int64_t quorums_formed() const { return quorums_formed_.load(); }
  // Entries dropped as malformed or unreachable claims (each logged, rate-limited).
  int64_t entries_dropped() const { return entries_dropped_.load(); }
  int64_t connections_refused() const { return gate_ ? gate_->refused() : 0; }

 private:
  struct State;
  void loop();
  void tick();
  void read_registrations();
  void read_group(int64_t replica, std::chrono::steady_clock::time_point now);
  void read_incarnations(int64_t replica, std::chrono::steady_clock::time_point now);
  void answer(const Quorum& q, std::chrono::steady_clock::time_point now);
  void write_status(const QuorumDecision& decision, std::chrono::steady_clock::time_point now);
  void drop(const std::string& why);
  LighthouseOptions options_;
  int port_ = 0;
  std::unique_ptr<State> state_;
  std::unique_ptr<AuthGate> gate_;
  std::atomic<int64_t> entries_dropped_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> quorums_formed_{0};
  std::thread thread_;
};

// "http://HOST:PORT", "HOST:PORT" (either with "?secret=..." or "?secret_file=...", ignored here)
// -> host and port; InputError naming `source` otherwise.
std::pair<std::string, int> parse_lighthouse_address(const std::string& text,
                                                     const std::string& source);

// The lighthouse's view for `loom debug hang --lighthouse`: {"status": what the open round waits
// for, "holding_up": [replica ids that beat but have not asked], "asked": {replica: step},
// "heartbeat_age_ms": {replica: ms}, "quorum": the last quorum}. CommError when nothing answers.
nlohmann::json read_lighthouse_status(const std::string& address,
                                      std::chrono::milliseconds timeout);

// One rank's connection to the lighthouse. Every rank of a group connects (its replica process
// groups rendezvous on the lighthouse's store); the group's first rank also beats and asks.
class LighthouseClient {
 public:
  // `address` as in TORCHFT_LIGHTHOUSE, with the job secret when the lighthouse has one.
  // InputError (one line) when the address is malformed, answers without being a lighthouse, or
  // refuses this client's secret (or its lack of one); CommError when nothing answers within
  // `connect_timeout`.
  LighthouseClient(const std::string& address, int64_t replica,
                   std::chrono::milliseconds connect_timeout);
  ~LighthouseClient();
  LighthouseClient(const LighthouseClient&) = delete;
  LighthouseClient& operator=(const LighthouseClient&) = delete;

  // Registers the group and bumps its heartbeat every `interval` from a thread (its own
  // connection, so a rank blocked in a step or a quorum still beats). With an `incarnation`
  // (the one its requests carry) it also beats under that name, so the lighthouse can tell a
  // restart (the old incarnation falls silent) from a second group started with the same
  // replica id (both keep beating: the younger is refused, and its next request_quorum throws
  // InputError naming the replica id).
  void start_heartbeat(std::chrono::milliseconds interval, const std::string& incarnation = "");
  // Writes `request` and waits for its answer; CommError after `timeout`, naming what the
  // lighthouse was waiting for. A lighthouse that stops answering altogether (SIGSTOP) fails the
  // request within timeout + min(timeout, 5 s) (c10d::DistError or CommError); a stop signal
  // fails it within 20 ms. An answer that does not hold this request (this group with its
  // step and incarnation, a consistent max_step) is discarded and the wait goes on.
  Quorum request_quorum(const QuorumRequest& request, std::chrono::milliseconds timeout);
  // This rank's replica process group of quorum `quorum_id`: the ranks with the same place in
  // every member group (`group_rank`), ranked by member index. Throws CommError when a member
  // does not join within `timeout` (it died after the quorum formed).
  std::shared_ptr<Comm> replica_group(int64_t quorum_id, int group_rank, int member_index,
                                      int members, std::chrono::milliseconds timeout,
                                      const std::string& backend);
  const std::string& address() const { return address_; }  // without the secret
  nlohmann::json status();  // as read_lighthouse_status

 private:
  struct Connection;
  std::unique_ptr<Connection> connect(std::chrono::milliseconds timeout) const;
  Quorum ask(const QuorumRequest& request, std::chrono::milliseconds timeout);
  std::string address_, host_;
  int port_ = 0;
  JobSecret secret_;
  std::unique_ptr<AuthTunnel> tunnel_;  // outlives the connections through it (declared first)
  int64_t replica_ = 0;
  std::string incarnation_;
  std::chrono::milliseconds connect_timeout_;
  std::unique_ptr<Connection> main_;
  std::unique_ptr<Connection> beat_;
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
};

}  // namespace loom::distributed
