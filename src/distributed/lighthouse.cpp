#include "loom/distributed/lighthouse.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <optional>

#include "backend.h"
#include "lighthouse_keys.h"
#include "loom/core/check.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/core/rate_limited_log.h"
#include "loom/core/signals.h"
#include "loom/distributed/store_connect.h"

namespace loom::distributed {
namespace {

using namespace lighthouse_keys;
using Clock = std::chrono::steady_clock;

// Plain decimal digits up to `max`; nullopt for anything else (std::stoll would accept "12abc"
// and throw on the rest).
std::optional<int64_t> parse_count(const std::string& text, int64_t max) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value > max) return std::nullopt;
  return value;
}

// A counter the groups bump with add(): read with get() rather than add(key, 0), because the
// store's add on a value that is not a number drops the connection that asked (the deciding
// thread's own). Zero when absent; nullopt when not a counter.
std::optional<int64_t> read_counter(c10d::Store& store, const std::string& key) {
  if (!store.check({key})) return 0;
  return parse_count(text_of(store.get(key)), int64_t{1} << 53);
}

// Why `r`, read under the key of `replica`, cannot take part in a quorum; empty when it can.
// `reached`: the highest max_step of any quorum so far. A group commits at most
// steps_per_quorum steps between quorums (1, or sync_steps when semi-synchronous), so a claim
// beyond reached + that is one nobody could have committed: it would only make every member heal
// from the claimant.
std::string check_request(const QuorumRequest& r, int64_t replica,
                          const std::optional<int64_t>& reached) {
  const std::string who = "the request of replica group " + std::to_string(replica);
  if (r.replica != replica) {
    return who + ": it names replica group " + std::to_string(r.replica);
  }
  if (r.seq < 1 || r.seq > kMaxStep) return who + ": seq " + std::to_string(r.seq);
  if (r.step < 0 || r.step > kMaxStep) return who + ": step " + std::to_string(r.step);
  if (r.group_ranks < 1 || r.group_ranks > kMaxReplicaId) {
    return who + ": group_ranks " + std::to_string(r.group_ranks);
  }
  if (r.incarnation.empty() || r.incarnation.size() > kMaxIncarnationBytes) {
    return who + ": an incarnation of " + std::to_string(r.incarnation.size()) + " bytes";
  }
  if (reached && r.step > *reached + r.steps_per_quorum) {
    return who + ": it claims step " + std::to_string(r.step) +
           ", beyond what any quorum reached (step " + std::to_string(*reached) + ") + " +
           std::to_string(r.steps_per_quorum) + " steps per quorum";
  }
  return "";
}

c10::intrusive_ptr<c10d::TCPStore> connect_own_store(int port) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(10);
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

}  // namespace

std::pair<std::string, int> parse_lighthouse_address(const std::string& text,
                                                     const std::string& source) {
  std::string rest = text.substr(0, text.find('?'));
  for (const char* scheme : {"http://", "https://"}) {
    if (rest.rfind(scheme, 0) == 0) rest = rest.substr(std::string(scheme).size());
  }
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const auto colon = rest.rfind(':');
  LOOM_CHECK_AS(InputError, colon != std::string::npos && colon > 0 && colon + 1 < rest.size(),
                source, ": '", rest,
                "' is not a lighthouse address (expected HOST:PORT or "
                "http://HOST:PORT)");
  std::string host = rest.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port_text = rest.substr(colon + 1);
  int port = 0;
  for (char c : port_text) {
    LOOM_CHECK_AS(InputError, c >= '0' && c <= '9' && port < 65536, source, ": '", rest,
                  "' has no valid port (expected 1-65535)");
    port = port * 10 + (c - '0');
  }
  LOOM_CHECK_AS(InputError, port >= 1 && port <= 65535, source, ": '", rest,
                "' has no valid port (expected 1-65535)");
  return {host, port};
}

// ---------------------------------------------------------------------------------------------
// Lighthouse

struct Lighthouse::State {
  c10::intrusive_ptr<c10d::TCPStore> server;  // hosts the store (on loopback, behind the gate)
  c10::intrusive_ptr<c10d::TCPStore> client;  // the deciding thread's connection
  LighthouseView view;
  int64_t registrations_read = 0;  // entries of ft/registered consumed (good or dropped)
  std::optional<Clock::time_point> registration_missing_since;
  std::vector<int64_t> replicas;     // registered, in order, each once
  std::map<int64_t, int64_t> beats;  // last counter value seen
  std::optional<int64_t> reached;    // the highest max_step of any quorum
  int store_port = 0;
  struct Incarnation {
    std::string name;
    int64_t beat = -1;
    Clock::time_point registered, last_beat;
    bool refused = false;
  };
  std::map<int64_t, std::vector<Incarnation>> incarnations;  // by replica, in registration order
  std::string last_status;
  Clock::time_point last_status_write;
  log::RateLimitedWarning dropped{"lighthouse"};
};

Lighthouse::Lighthouse(LighthouseOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>()) {
  // The store itself only on loopback: strangers reach it through the gate or not at all.
  int store_port = 0;
  const int store_fd = listen_on_local_address("127.0.0.1", 0, "lighthouse store", store_port);
  c10d::TCPStoreOptions store;
  store.port = static_cast<std::uint16_t>(store_port);
  store.isServer = true;
  store.waitWorkers = false;
  store.timeout = std::chrono::seconds(30);
  store.masterListenFd = store_fd;
  try {
    state_->server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store);
  } catch (const std::exception& e) {
    LOOM_THROW(InputError, "lighthouse: cannot start its store: ", message_of(e));
  }
  state_->server->set(kIdentity, bytes_of("1"));
  state_->store_port = store_port;
  state_->client = connect_own_store(store_port);
  GateOptions gate;
  gate.host = options_.host;
  gate.port = options_.port;
  gate.secret = options_.secret;
  gate.backend_port = store_port;
  gate_ = std::make_unique<AuthGate>(gate);
  if (options_.host == "0.0.0.0" || options_.host == "::") {
    log::get("lighthouse")
        ->warn(
            "lighthouse: listening on every interface ({}); bind the address of the job's "
            "private network instead where the host has a public one",
            options_.host);
  }
  port_ = gate_->port();
  log::get("lighthouse")
      ->info("lighthouse at {} ({}): min_replicas {}, join_timeout {} ms, heartbeat_timeout {} ms",
             address(), options_.secret.empty() ? "open to anyone" : "job secret required",
             options_.rules.min_replicas, options_.rules.join_timeout.count(),
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

std::string Lighthouse::worker_address() const {
  const bool wildcard = options_.host == "0.0.0.0" || options_.host == "::";
  std::string host = wildcard ? "127.0.0.1" : options_.host;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  const std::string base = host + ":" + std::to_string(port_);
  return options_.secret.empty() ? base : base + "?secret=" + to_hex(options_.secret);
}

void Lighthouse::drop(const std::string& why) {
  ++entries_dropped_;
  state_->dropped.warn("lighthouse: dropped " + why);
}

void Lighthouse::loop() {
  while (!stop_) {
    try {
      tick();
    } catch (const std::exception& e) {  // the store connection failed: a fresh one next tick
      state_->dropped.warn("lighthouse: " + message_of(e));
      try {
        state_->client = connect_own_store(state_->store_port);
      } catch (const std::exception&) {  // logged on the next failure
      }
    }
    std::this_thread::sleep_for(options_.tick);
  }
}

void Lighthouse::tick() {
  State& s = *state_;
  const auto now = Clock::now();
  read_registrations();
  for (int64_t replica : s.replicas) {
    try {
      read_group(replica, now);
    } catch (const std::exception& e) {  // this group's entries only; the others go on
      drop("an entry of replica group " + std::to_string(replica) + ": " + message_of(e));
    }
  }
  QuorumDecision decision = decide_quorum(s.view, now, options_.rules);
  if (decision.quorum) {
    answer(*decision.quorum, now);
    const Quorum& q = *decision.quorum;
    decision.waiting_for = "quorum " + std::to_string(q.id) + " formed at step " +
                           std::to_string(q.max_step) + " (replica groups " + q.participants() +
                           ")";
  }
  write_status(decision, now);
}

// New entries of ft/registered (each a replica id, written after the counter is bumped): a bad
// one is skipped for good; one that never appears is skipped after a grace period; a burst is
// read a bounded number at a time.
void Lighthouse::read_registrations() {
  State& s = *state_;
  const auto count = read_counter(*s.client, kRegistered);
  if (!count) {  // reset: new registrations count from where this lighthouse has read
    drop(std::string(kRegistered) + ": not a counter (reset)");
    s.client->set(kRegistered, bytes_of(std::to_string(s.registrations_read)));
    return;
  }
  const int64_t registered = *count;
  for (int budget = 0; s.registrations_read < registered && budget < kMaxRegistrationsPerTick;
       ++budget) {
    const std::string key = std::string(kRegistered) + "/" + std::to_string(s.registrations_read);
    if (!s.client->check({key})) {
      if (!s.registration_missing_since) s.registration_missing_since = Clock::now();
      if (Clock::now() - *s.registration_missing_since < kRegistrationGrace) return;
      drop(key + ": announced but never written");
    } else {
      const auto replica = parse_count(text_of(s.client->get(key)), kMaxReplicaId);
      if (!replica) {
        drop(key + ": not a replica id (an integer 0.." + std::to_string(kMaxReplicaId) + ")");
      } else if (std::find(s.replicas.begin(), s.replicas.end(), *replica) == s.replicas.end()) {
        s.replicas.push_back(*replica);
      }
    }
    s.registration_missing_since.reset();
    ++s.registrations_read;
  }
}

// One group's heartbeat and request. A heartbeat that is not a counter is reset (so the group's
// next beat counts again); a request that does not parse, names another replica or claims a
// step the quorum cannot reach is deleted (the group waits for its answer until its timeout).
void Lighthouse::read_group(int64_t replica, Clock::time_point now) {
  State& s = *state_;
  read_incarnations(replica, now);
  const auto counter = read_counter(*s.client, heartbeat_key(replica));
  if (!counter) {  // the group's next add() starts a fresh counter
    s.client->deleteKey(heartbeat_key(replica));
    LOOM_THROW(InputError, heartbeat_key(replica), ": not a counter (reset)");
  }
  const int64_t beat = *counter;
  auto it = s.beats.find(replica);
  if (it == s.beats.end() || it->second != beat) {
    s.beats[replica] = beat;
    s.view.last_heartbeat[replica] = now;
  }
  if (!s.client->check({request_key(replica)})) return;
  const std::string text = text_of(s.client->get(request_key(replica)));
  const std::string where = "request of replica group " + std::to_string(replica);
  std::optional<QuorumRequest> request;
  std::string why;
  try {
    LOOM_CHECK_AS(InputError, text.size() <= kMaxRequestBytes, where, ": ", text.size(),
                  " bytes (at most ", kMaxRequestBytes, ")");
    request = request_from_json(json::parse_bounded(text, where), where);
    why = check_request(*request, replica, s.reached);
    for (const auto& i : s.incarnations[replica]) {
      if (why.empty() && i.refused && i.name == request->incarnation) {
        why = "the request of replica group " + std::to_string(replica) + " incarnation " + i.name +
              ": refused (another group runs with that replica id)";
      }
    }
  } catch (const std::exception& e) {
    why = message_of(e);
  }
  if (!why.empty()) {
    s.view.requests.erase(replica);
    s.client->deleteKey(request_key(replica));
    drop(why);
    return;
  }
  if (!s.view.first_request) s.view.first_request = now;
  s.view.requests[replica] = *request;
}

// Two incarnations of one replica id that both keep beating are two groups started with the
// same fault_tolerance.replica_id (a restart's old incarnation falls silent within
// heartbeat_timeout). The younger one is refused, by name, once it has beaten alongside the
// older for a whole heartbeat_timeout after registering: a restart is never refused.
void Lighthouse::read_incarnations(int64_t replica, Clock::time_point now) {
  State& s = *state_;
  auto& known = s.incarnations[replica];
  const auto count = read_counter(*s.client, incarnations_key(replica));
  for (auto n = static_cast<int64_t>(known.size());
       count && n < *count && n < kMaxIncarnationsPerReplica; ++n) {
    const std::string key = incarnations_key(replica) + "/" + std::to_string(n);
    if (!s.client->check({key})) break;  // announced, not written yet: next tick
    std::string name = text_of(s.client->get(key));
    if (name.empty() || name.size() > kMaxIncarnationBytes) name = "(invalid)";
    known.push_back({name, -1, now, now, false});
  }
  const State::Incarnation* oldest_live = nullptr;
  for (auto& i : known) {
    const auto beat = read_counter(*s.client, incarnation_beat_key(replica, i.name));
    if (beat && *beat != i.beat) {
      i.beat = *beat;
      i.last_beat = now;
    }
    const bool live = now - i.last_beat <= options_.rules.heartbeat_timeout;
    if (!live || i.refused) continue;
    if (!oldest_live) {
      oldest_live = &i;
    } else if (now - i.registered > options_.rules.heartbeat_timeout) {
      i.refused = true;
      const std::string why =
          "fault_tolerance.replica_id " + std::to_string(replica) +
          " is taken: another replica group (incarnation " + oldest_live->name +
          ") runs with it; give each group its own replica_id (0 .. group_size - 1)";
      s.client->set(refused_key(replica, i.name), bytes_of(why));
      log::get("lighthouse")->warn("refused incarnation {}: {}", i.name, why);
    }
  }
}

void Lighthouse::answer(const Quorum& q, Clock::time_point now) {
  State& s = *state_;
  const std::string text = to_json(q).dump();
  for (const auto& m : q.members) {
    const int64_t seq = s.view.requests.at(m.replica).seq;
    s.client->deleteKey(request_key(m.replica));
    s.view.requests.erase(m.replica);
    s.client->set(answer_key(m.replica, seq), bytes_of(text));
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
    log::get("lighthouse")
        ->info("quorum {}: replica groups {} at step {}{}", q.id, q.participants(), q.max_step,
               heals);
  }
  s.view.previous = q;
  s.reached = std::max(s.reached.value_or(0), q.max_step);
  s.view.first_request.reset();
  if (!s.view.requests.empty()) s.view.first_request = now;
  ++quorums_formed_;
}

// The status: at once when it changes, else twice a second (heartbeat ages move).
void Lighthouse::write_status(const QuorumDecision& decision, Clock::time_point now) {
  State& s = *state_;
  if (decision.waiting_for == s.last_status &&
      now - s.last_status_write <= std::chrono::milliseconds(500)) {
    return;
  }
  nlohmann::json status = {{"status", decision.waiting_for},
                           {"holding_up", decision.holding_up},
                           {"asked", nlohmann::json::object()},
                           {"heartbeat_age_ms", nlohmann::json::object()},
                           {"entries_dropped", entries_dropped_.load()}};
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

}  // namespace loom::distributed
