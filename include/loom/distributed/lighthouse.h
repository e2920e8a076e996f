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
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json_fwd.hpp>

#include "loom/distributed/comm.h"
#include "loom/distributed/quorum.h"

namespace loom::distributed {

struct LighthouseOptions {
  std::string host = "0.0.0.0";
  int port = 29510;  // 0: any free port (tests)
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
  int64_t quorums_formed() const { return quorums_formed_.load(); }

 private:
  struct State;
  void loop();
  LighthouseOptions options_;
  int port_ = 0;
  std::unique_ptr<State> state_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> quorums_formed_{0};
  std::thread thread_;
};

// "http://HOST:PORT", "HOST:PORT" -> host and port; InputError naming `source` otherwise.
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
  // InputError when the address is malformed or answers without being a lighthouse; CommError
  // when nothing answers within `connect_timeout`.
  LighthouseClient(const std::string& address, int64_t replica,
                   std::chrono::milliseconds connect_timeout);
  ~LighthouseClient();
  LighthouseClient(const LighthouseClient&) = delete;
  LighthouseClient& operator=(const LighthouseClient&) = delete;

  // Registers the group and bumps its heartbeat every `interval` from a thread (its own
  // connection, so a rank blocked in a step or a quorum still beats).
  void start_heartbeat(std::chrono::milliseconds interval);
  // Writes `request` and waits for its answer; CommError after `timeout`, naming what the
  // lighthouse was waiting for.
  Quorum request_quorum(const QuorumRequest& request, std::chrono::milliseconds timeout);
  // This rank's replica process group of quorum `quorum_id`: the ranks with the same place in
  // every member group (`group_rank`), ranked by member index. Throws CommError when a member
  // does not join within `timeout` (it died after the quorum formed).
  std::shared_ptr<Comm> replica_group(int64_t quorum_id, int group_rank, int member_index,
                                      int members, std::chrono::milliseconds timeout,
                                      const std::string& backend);
  const std::string& address() const { return address_; }
  nlohmann::json status();  // as read_lighthouse_status

 private:
  struct Connection;
  std::unique_ptr<Connection> connect() const;
  std::string address_, host_;
  int port_ = 0;
  int64_t replica_ = 0;
  std::chrono::milliseconds connect_timeout_;
  std::unique_ptr<Connection> main_;
  std::unique_ptr<Connection> beat_;
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
};

}  // namespace loom::distributed
