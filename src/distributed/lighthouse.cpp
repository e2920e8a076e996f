#include "loom/distributed/lighthouse.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <map>

#include "backend.h"
#include "loom/core/check.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/distributed/store_connect.h"
#include "loom/distributed/store_socket.h"

namespace loom::distributed {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kIdentity = "loom/lighthouse";
constexpr const char* kRegistered = "ft/registered";  // counter; ft/registered/<n> = replica id
constexpr const char* kStatus = "ft/status";

std::string heartbeat_key(int64_t replica) {
  return "ft/heartbeat/" + std::to_string(replica);
}
std::string request_key(int64_t replica) {
  return "ft/request/" + std::to_string(replica);
}
std::string answer_key(int64_t replica, int64_t seq) {
  return "ft/answer/" + std::to_string(replica) + "/" + std::to_string(seq);
}

std::vector<uint8_t> bytes_of(const std::string& text) {
  return {text.begin(), text.end()};
}
std::string text_of(const std::vector<uint8_t>& bytes) {
  return {bytes.begin(), bytes.end()};
}

}  // namespace

std::pair<std::string, int> parse_lighthouse_address(const std::string& text,
                                                     const std::string& source) {
  std::string rest = text;
  for (const char* scheme : {"http://", "https://"}) {
    if (rest.rfind(scheme, 0) == 0) rest = rest.substr(std::string(scheme).size());
  }
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const auto colon = rest.rfind(':');
  LOOM_CHECK_AS(InputError, colon != std::string::npos && colon > 0 && colon + 1 < rest.size(),
                source, ": '", text,
                "' is not a lighthouse address (expected HOST:PORT or "
                "http://HOST:PORT)");
  std::string host = rest.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port_text = rest.substr(colon + 1);
  int port = 0;
  for (char c : port_text) {
    LOOM_CHECK_AS(InputError, c >= '0' && c <= '9' && port < 65536, source, ": '", text,
                  "' has no valid port (expected 1-65535)");
    port = port * 10 + (c - '0');
  }
  LOOM_CHECK_AS(InputError, port >= 1 && port <= 65535, source, ": '", text,
                "' has no valid port (expected 1-65535)");
  return {host, port};
}

// ---------------------------------------------------------------------------------------------
// Lighthouse

struct Lighthouse::State {
  c10::intrusive_ptr<c10d::TCPStore> server;  // hosts the store
  c10::intrusive_ptr<c10d::TCPStore> client;  // the deciding thread's connection
  LighthouseView view;
  std::vector<int64_t> replicas;     // registered, in order
  std::map<int64_t, int64_t> beats;  // last counter value seen
  std::string last_status;
  Clock::time_point last_status_write;
};

Lighthouse::Lighthouse(LighthouseOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>()) {
  c10d::TCPStoreOptions store;
  store.port = static_cast<std::uint16_t>(options_.port);
  store.isServer = true;
  store.waitWorkers = false;
  store.timeout = std::chrono::seconds(30);
  if (options_.port != 0) store.masterListenFd = bind_store_socket(options_.host, options_.port);
  try {
    state_->server = c10::make_intrusive<c10d::TCPStore>(options_.host, store);
  } catch (const std::exception& e) {
    LOOM_THROW(InputError, "lighthouse: cannot listen on ", options_.host, ":", options_.port, ": ",
               message_of(e));
  }
  port_ = static_cast<int>(state_->server->getPort());
  state_->server->set(kIdentity, bytes_of("1"));
  c10d::TCPStoreOptions client_options;
  client_options.port = static_cast<std::uint16_t>(port_);
  client_options.isServer = false;
  client_options.waitWorkers = false;
  const std::string connect_host =
      options_.host == "0.0.0.0" || options_.host == "::" ? "127.0.0.1" : options_.host;
  state_->client = c10::make_intrusive<c10d::TCPStore>(connect_host, client_options);
  log::get("lighthouse")
      ->info("lighthouse at {}: min_replicas {}, join_timeout {} ms, heartbeat_timeout {} ms",
             address(), options_.rules.min_replicas, options_.rules.join_timeout.count(),
             options_.rules.heartbeat_timeout.count());
  thread_ = std::thread([this] { loop(); });
}

Lighthouse::~Lighthouse() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::string Lighthouse::address() const {
  return options_.host + ":" + std::to_string(port_);
}

void Lighthouse::loop() {
  auto log = log::get("lighthouse");
  State& s = *state_;
  while (!stop_) {
    try {
      const auto now = Clock::now();
      const int64_t registered = s.client->add(kRegistered, 0);
      for (auto n = static_cast<int64_t>(s.replicas.size()); n < registered; ++n) {
        const std::string key = std::string(kRegistered) + "/" + std::to_string(n);
        s.replicas.push_back(std::stoll(text_of(s.client->get(key))));
      }
      for (int64_t replica : s.replicas) {
        const int64_t beat = s.client->add(heartbeat_key(replica), 0);
        auto it = s.beats.find(replica);
        if (it == s.beats.end() || it->second != beat) {
          s.beats[replica] = beat;
          s.view.last_heartbeat[replica] = now;
        }
        if (!s.client->check({request_key(replica)})) continue;
        const std::string where = "lighthouse: request of replica group " + std::to_string(replica);
        QuorumRequest request = request_from_json(
            json::parse_bounded(text_of(s.client->get(request_key(replica))), where), where);
        if (!s.view.first_request) s.view.first_request = now;
        s.view.requests[replica] = request;
      }
      QuorumDecision decision = decide_quorum(s.view, now, options_.rules);
      if (decision.quorum) {
        const Quorum& q = *decision.quorum;
        const std::string answer = to_json(q).dump();
        for (const auto& m : q.members) {
          const int64_t seq = s.view.requests.at(m.replica).seq;
          s.client->deleteKey(request_key(m.replica));
          s.view.requests.erase(m.replica);
          s.client->set(answer_key(m.replica, seq), bytes_of(answer));
        }
        if (!s.view.previous || s.view.previous->id != q.id) {
          std::string heals;
          for (size_t i = 0; i < q.members.size(); ++i) {
            const int source = q.heal_source(static_cast<int>(i));
            if (source >= 0) {
              heals += fmt::format("; {} heals from {}", q.members[i].replica,
                                   q.members[static_cast<size_t>(source)].replica);
            }
          }
          log->info("quorum {}: replica groups {} at step {}{}", q.id, q.participants(), q.max_step,
                    heals);
        }
        s.view.previous = q;
        s.view.first_request.reset();
        if (!s.view.requests.empty()) s.view.first_request = now;
        ++quorums_formed_;
        decision.waiting_for = "quorum " + std::to_string(q.id) + " formed at step " +
                               std::to_string(q.max_step) + " (replica groups " + q.participants() +
                               ")";
      }
      // The status: at once when it changes, else twice a second (heartbeat ages move).
      if (decision.waiting_for != s.last_status ||
          now - s.last_status_write > std::chrono::milliseconds(500)) {
        nlohmann::json status = {{"status", decision.waiting_for},
                                 {"holding_up", decision.holding_up},
                                 {"asked", nlohmann::json::object()},
                                 {"heartbeat_age_ms", nlohmann::json::object()}};
        for (const auto& [replica, request] : s.view.requests) {
          status["asked"][std::to_string(replica)] = request.step;
        }
        for (const auto& [replica, at] : s.view.last_heartbeat) {
          status["heartbeat_age_ms"][std::to_string(replica)] =
              std::chrono::duration_cast<std::chrono::milliseconds>(now - at).count();
        }
        if (s.view.previous) status["quorum"] = to_json(*s.view.previous);
        s.client->set(kStatus, bytes_of(status.dump()));
        s.last_status = decision.waiting_for;
        s.last_status_write = now;
      }
    } catch (const std::exception& e) {
      log->warn("lighthouse: {}", message_of(e));
    }
    std::this_thread::sleep_for(options_.tick);
  }
}

// ---------------------------------------------------------------------------------------------
// LighthouseClient

struct LighthouseClient::Connection {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

LighthouseClient::LighthouseClient(const std::string& address, int64_t replica,
                                   std::chrono::milliseconds connect_timeout)
    : address_(address), replica_(replica), connect_timeout_(connect_timeout) {
  std::tie(host_, port_) = parse_lighthouse_address(address, "TORCHFT_LIGHTHOUSE");
  main_ = connect();
}

LighthouseClient::~LighthouseClient() {
  stop_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::unique_ptr<LighthouseClient::Connection> LighthouseClient::connect() const {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port_);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = connect_timeout_;
  auto c = std::make_unique<Connection>();
  try {
    c->store = connect_store(host_, options, "lighthouse");
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

void LighthouseClient::start_heartbeat(std::chrono::milliseconds interval) {
  beat_ = connect();
  const int64_t n = beat_->store->add(kRegistered, 1) - 1;
  beat_->store->add(heartbeat_key(replica_), 1);
  beat_->store->set(std::string(kRegistered) + "/" + std::to_string(n),
                    bytes_of(std::to_string(replica_)));
  heartbeat_ = std::thread([this, interval] {
    while (!stop_) {
      try {
        beat_->store->add(heartbeat_key(replica_), 1);
      } catch (const std::exception& e) {
        log::get("ft")->warn("heartbeat to the lighthouse at {} failed: {}", address_,
                             message_of(e));
      }
      std::this_thread::sleep_for(interval);
    }
  });
}

Quorum LighthouseClient::request_quorum(const QuorumRequest& request,
                                        std::chrono::milliseconds timeout) {
  auto& store = *main_->store;
  store.set(request_key(replica_), bytes_of(to_json(request).dump()));
  const std::string answer = answer_key(replica_, request.seq);
  const auto deadline = Clock::now() + timeout;
  while (!store.check({answer})) {
    if (Clock::now() >= deadline) {
      std::string status;
      if (store.check({kStatus})) {
        const auto j = json::parse_or_discard(text_of(store.get(kStatus)));
        if (j.is_object() && j.contains("status") && j["status"].is_string()) status = j["status"];
      }
      LOOM_THROW(CommError, "replica group ", replica_, ": no quorum from the lighthouse at ",
                 address_, " within ", timeout.count(), " ms (lighthouse: ", status, ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string where = "quorum answer from the lighthouse at " + address_;
  Quorum q = quorum_from_json(json::parse_bounded(text_of(store.get(answer)), where), where);
  store.deleteKey(answer);
  return q;
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
