// LighthouseClient: a rank's connection to the lighthouse (lighthouse.h), through an AuthTunnel
// that proves the job secret to the lighthouse's gate.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <thread>

#include "backend.h"
#include "lighthouse_keys.h"
#include "loom/core/check.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/core/signals.h"
#include "loom/distributed/lighthouse.h"
#include "loom/distributed/store_connect.h"

namespace loom::distributed {

using namespace lighthouse_keys;
using Clock = std::chrono::steady_clock;

// What a request may take beyond its own timeout for the store operations around the wait.
constexpr std::chrono::milliseconds kStoreGrace{5000};
// How long the heartbeat thread tries to reconnect at a time.
constexpr std::chrono::milliseconds kReconnect{1000};

// ---------------------------------------------------------------------------------------------
// LighthouseClient

struct LighthouseClient::Connection {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

LighthouseClient::LighthouseClient(const std::string& address, int64_t replica,
                                   std::chrono::milliseconds connect_timeout)
    : replica_(replica), connect_timeout_(connect_timeout) {
  LighthouseTarget target = split_lighthouse_target(address, "TORCHFT_LIGHTHOUSE");
  address_ = target.address;
  secret_ = std::move(target.secret);
  std::tie(host_, port_) = parse_lighthouse_address(address_, "TORCHFT_LIGHTHOUSE");
  try {
    tunnel_ = std::make_unique<AuthTunnel>(host_, port_, secret_, address_, connect_timeout);
  } catch (const IoError& e) {
    LOOM_THROW(CommError, "no lighthouse answers at ", address_,
               " (TORCHFT_LIGHTHOUSE): ", e.message(),
               ". Start one with `loom lighthouse --bind HOST:PORT`");
  }
  main_ = connect(connect_timeout_);
}

LighthouseClient::~LighthouseClient() {
  stop_ = true;
  tunnel_->shut();  // a beat blocked on a lighthouse that stopped answering fails at once
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::unique_ptr<LighthouseClient::Connection> LighthouseClient::connect(
    std::chrono::milliseconds timeout) const {
  c10d::TCPStoreOptions options;
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = timeout;
  auto c = std::make_unique<Connection>();
  options.port = static_cast<std::uint16_t>(tunnel_->local_port());
  try {
    c->store = connect_store("127.0.0.1", options, "lighthouse");
  } catch (const std::exception& e) {
    LOOM_THROW(CommError, "no lighthouse answers at ", address_,
               " (TORCHFT_LIGHTHOUSE): ", message_of(e),
               ". Start one with `loom lighthouse --bind HOST:PORT`");
  }
  try {
    c->store->wait({kIdentity}, std::chrono::milliseconds(5000));
  } catch (const std::exception&) {
    LOOM_THROW(InputError, address_, " (TORCHFT_LIGHTHOUSE) answers but is not a loom lighthouse");
  }
  return c;
}

void LighthouseClient::start_heartbeat(std::chrono::milliseconds interval,
                                       const std::string& incarnation) {
  beat_ = connect(connect_timeout_);
  incarnation_ = incarnation;
  const int64_t n = beat_->store->add(kRegistered, 1) - 1;
  beat_->store->add(heartbeat_key(replica_), 1);
  beat_->store->set(std::string(kRegistered) + "/" + std::to_string(n),
                    bytes_of(std::to_string(replica_)));
  if (!incarnation_.empty()) {
    const int64_t i = beat_->store->add(incarnations_key(replica_), 1) - 1;
    beat_->store->add(incarnation_beat_key(replica_, incarnation_), 1);
    beat_->store->set(incarnations_key(replica_) + "/" + std::to_string(i), bytes_of(incarnation_));
  }
  heartbeat_ = std::thread([this, interval] {
    while (!stop_) {
      try {
        beat_->store->add(heartbeat_key(replica_), 1);
        if (!incarnation_.empty()) {
          beat_->store->add(incarnation_beat_key(replica_, incarnation_), 1);
        }
      } catch (const std::exception& e) {
        // The store drops a connection whose add fails (the counter was overwritten; the
        // lighthouse resets it): beat on a fresh one.
        if (stop_) break;
        log::get("ft")->warn("heartbeat to the lighthouse at {} failed: {}", address_,
                             message_of(e));
        try {
          // Briefly: c10d retries a refused connection until its timeout, and the destructor
          // waits for this thread (a lighthouse that died must not hold the group up).
          beat_ = connect(std::min<std::chrono::milliseconds>(connect_timeout_, kReconnect));
        } catch (const std::exception&) {  // the next beat tries again
        }
      }
      std::this_thread::sleep_for(interval);
    }
  });
}

// c10d's store reads have no deadline: against a lighthouse that accepts but never answers (a
// SIGSTOPped process) a request would block forever. A guard thread shuts the tunnel when the
// request outlives its deadline (or a stop signal arrives), which fails the blocked read at once;
// the client is then unusable (the caller moves to the next lighthouse or stops).
Quorum LighthouseClient::request_quorum(const QuorumRequest& request,
                                        std::chrono::milliseconds timeout) {
  const auto hard_deadline =
      Clock::now() + timeout + std::min<std::chrono::milliseconds>(timeout, kStoreGrace);
  std::atomic<bool> done{false};
  std::thread guard([this, &done, hard_deadline] {
    while (!done && Clock::now() < hard_deadline && !signals::shutdown_requested()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!done) tunnel_->shut();
  });
  struct Release {
    std::atomic<bool>& done;
    std::thread& guard;
    ~Release() {
      done = true;
      guard.join();
    }
  } release{done, guard};
  try {
    return ask(request, timeout);
  } catch (const c10::DistError& e) {
    if (signals::shutdown_requested()) {
      LOOM_THROW(CommError, "replica group ", replica_, ": stopped by signal ",
                 signals::shutdown_signal(), " while waiting for a quorum");
    }
    if (Clock::now() >= hard_deadline) {
      LOOM_THROW(CommError, "replica group ", replica_, ": the lighthouse at ", address_,
                 " accepted the request but did not answer within ",
                 std::chrono::duration_cast<std::chrono::milliseconds>(
                     timeout + std::min<std::chrono::milliseconds>(timeout, kStoreGrace))
                     .count(),
                 " ms (stopped or overloaded?)");
    }
    throw;
  }
}

Quorum LighthouseClient::ask(const QuorumRequest& request, std::chrono::milliseconds timeout) {
  auto& store = *main_->store;
  store.set(request_key(replica_), bytes_of(to_json(request).dump()));
  const std::string answer = answer_key(replica_, request.seq);
  const auto deadline = Clock::now() + timeout;
  auto next_refusal_check = Clock::now();
  for (;;) {
    while (!store.check({answer})) {
      if (signals::shutdown_requested()) {
        LOOM_THROW(CommError, "replica group ", replica_, ": stopped by signal ",
                   signals::shutdown_signal(), " while waiting for a quorum");
      }
      if (!incarnation_.empty() && Clock::now() >= next_refusal_check) {
        next_refusal_check = Clock::now() + std::chrono::milliseconds(100);
        const std::string refused = refused_key(replica_, incarnation_);
        if (store.check({refused})) {
          LOOM_THROW(InputError, "replica group ", replica_, ": ", text_of(store.get(refused)));
        }
      }
      if (Clock::now() >= deadline) {
        std::string status;
        if (store.check({kStatus})) {
          const auto j = json::parse_or_discard(text_of(store.get(kStatus)));
          if (j.is_object() && j.contains("status") && j["status"].is_string()) {
            status = j["status"];
          }
        }
        LOOM_THROW(CommError, "replica group ", replica_, ": no quorum from the lighthouse at ",
                   address_, " within ", timeout.count(), " ms (lighthouse: ", status, ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const std::string text = text_of(store.get(answer));
    store.deleteKey(answer);
    const std::string where = "quorum answer from the lighthouse at " + address_;
    try {
      LOOM_CHECK_AS(InputError, text.size() <= kMaxAnswerBytes, where, ": ", text.size(), " bytes");
      Quorum q = quorum_from_json(json::parse_bounded(text, where), where);
      check_answer(q, request, where);
      return q;
    } catch (const InputError& e) {  // not the lighthouse's: wait for the real one
      log::get("ft")->warn("discarded a {}", e.message());
    }
  }
}

nlohmann::json read_lighthouse_status(const std::string& address,
                                      std::chrono::milliseconds timeout) {
  LighthouseClient client(address, -1, timeout);
  return client.status();
}

nlohmann::json LighthouseClient::status() {
  auto& store = *main_->store;
  if (!store.check({kStatus})) return nlohmann::json::object();
  return json::parse_bounded(text_of(store.get(kStatus)),
                             "status of the lighthouse at " + address_);
}

std::shared_ptr<Comm> LighthouseClient::replica_group(int64_t quorum_id, int group_rank,
                                                      int member_index, int members,
                                                      std::chrono::milliseconds timeout,
                                                      const std::string& backend) {
  // The "replicas(" prefix makes Comm's errors name fault_tolerance.process_group_timeout_ms.
  const std::string name = "replicas(q" + std::to_string(quorum_id) + ")";
  if (members == 1) return Comm::single(name);
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      "ft/pg/" + std::to_string(quorum_id) + "/" + std::to_string(group_rank) + "/", main_->store);
  std::shared_ptr<Backend> cpu, cuda;
  try {
    cpu = make_gloo_backend(store, member_index, members, timeout, host_);
    if (backend == "nccl") cuda = make_nccl_backend(store, member_index, members, timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    LOOM_THROW(CommError, "replica process group of quorum ", quorum_id, " (member ", member_index,
               " of ", members, "): ", message_of(e));
  }
  std::vector<int> ranks(static_cast<size_t>(members));
  for (int i = 0; i < members; ++i) ranks[static_cast<size_t>(i)] = i;
  CommOptions options;
  options.init_timeout = timeout;
  options.train_timeout = timeout;
  return std::make_shared<Comm>(name, ranks, member_index, cpu, cuda, options);
}

}  // namespace loom::distributed
