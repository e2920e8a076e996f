#include "loom/launch/elastic_rendezvous.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>

#include "../distributed/backend.h"  // distributed/'s private c10d helpers
#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/distributed/comm.h"
#include "loom/distributed/secured_store.h"
#include "loom/distributed/store_identity.h"
#include "loom/distributed/store_socket.h"

namespace loom::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* kPrefix = "loom/elastic/";
constexpr auto kPollStep = 50ms;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

struct ElasticRendezvous::Store {
  std::unique_ptr<SecuredStore> secured;  // keeps the gate or tunnel of `store` open
  c10::intrusive_ptr<c10d::Store> store;
  int64_t counter(const std::string& k) { return store->add(k, 0); }
  bool has(const std::string& k) { return store->check({k}); }
  std::string get(const std::string& k) { return store_text(store->get(k)); }
  void set(const std::string& k, const std::string& v) { store->set(k, store_bytes(v)); }
};

void apply_rdzv_conf(const std::string& conf, ElasticOptions& options) {
  for (const std::string& item : strings::split_list(conf)) {
    const size_t eq = item.find('=');
    LOOM_CHECK_AS(InputError, eq != std::string::npos, "--rdzv-conf: '", item,
                  "' is not KEY=VALUE");
    const std::string name = item.substr(0, eq);
    const auto value = strings::parse_double(item.substr(eq + 1));
    LOOM_CHECK_AS(InputError, value && *value > 0, "--rdzv-conf ", name,
                  ": expected a positive number, got '", item.substr(eq + 1), "'");
    if (name == "join_timeout") {
      options.join_timeout_s = *value;
    } else if (name == "last_call_timeout") {
      options.last_call_timeout_s = *value;
    } else if (name == "keep_alive_interval") {
      options.keep_alive_interval_s = *value;
    } else if (name == "keep_alive_max_attempt") {
      options.keep_alive_max_attempt = static_cast<int>(*value);
    } else {
      LOOM_THROW(InputError, "--rdzv-conf: unknown key '", name,
                 "' (known: join_timeout, last_call_timeout, keep_alive_interval, "
                 "keep_alive_max_attempt)");
    }
  }
}

SecuredStoreOptions ElasticRendezvous::secured_store_options(const std::string& host,
                                                             int port) const {
  SecuredStoreOptions options;
  options.host = host;
  options.port = port;
  options.secret = options_.secret;
  options.names.server = "elastic rendezvous store";
  options.names.secret_hint = "give every node's launcher the same LOOM_JOB_SECRET";
  options.store.waitWorkers = false;
  return options;
}

ElasticRendezvous::ElasticRendezvous(ElasticOptions options)
    : options_(std::move(options)), store_(std::make_unique<Store>()) {
  if (options_.local_addr.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    options_.local_addr = is_loopback_host(options_.endpoint_host) ? "127.0.0.1" : host;
  }
  SecuredStoreOptions store_options =
      secured_store_options(options_.endpoint_host, options_.endpoint_port);
  const auto timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::max(options_.join_timeout_s, 60.0) * 1000));
  store_options.store.timeout = timeout;
  // The first agent to bind the endpoint hosts the store; the others connect to it.
  try {
    store_->secured = SecuredStore::host(store_options);
    hosts_store_ = true;
  } catch (const std::exception&) {
    try {
      // Reaching the store is part of joining: it gets join_timeout, later operations more.
      store_options.store.timeout = std::chrono::milliseconds(
          static_cast<int64_t>(std::max(options_.join_timeout_s, 1.0) * 1000));
      store_->secured = SecuredStore::connect(store_options);
      store_->secured->store()->setTimeout(timeout);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      LOOM_THROW(CommError, "elastic rendezvous: cannot reach the store at ",
                 options_.endpoint_host, ":", options_.endpoint_port, ": ", message_of(e));
    }
  }
  store_->store = store_->secured->store();
  agree_on_run_id();
  standby_port_ = pick_free_port();
  log::get("launch")->info("elastic rendezvous at {}:{} ({} the store), run {}, nodes {}..{}",
                           options_.endpoint_host, options_.endpoint_port,
                           hosts_store_ ? "hosting" : "client of", options_.run_id,
                           options_.min_nodes, options_.max_nodes);
  keep_alive_ = std::thread([this] { keep_alive_loop(); });
}

void ElasticRendezvous::agree_on_run_id() {
  if (hosts_store_) {
    if (options_.run_id.empty()) options_.run_id = new_run_id();
    write_store_identity(*store_->store, {options_.run_id, 0});
    return;
  }
  const std::string address = options_.endpoint_host + ":" + std::to_string(options_.endpoint_port);
  const std::string advice =
      "give every node of one job the same --rdzv-id (or none), and another job another "
      "--rdzv-endpoint port";
  const std::string theirs = read_store_run_id(*store_->store, address, kStoreIdentityWait, advice);
  LOOM_CHECK_AS(InputError, options_.run_id.empty() || options_.run_id == theirs,
                "the elastic rendezvous store at ", address, " belongs to run '", theirs,
                "' (this node has --rdzv-id '", options_.run_id, "'): ", advice);
  options_.run_id = theirs;
}

ElasticRendezvous::~ElasticRendezvous() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  keep_alive_.join();
  // The store host waits a moment so the other agents read the final keys before it goes.
  if (hosts_store_) std::this_thread::sleep_for(seconds(options_.keep_alive_interval_s));
}

std::string ElasticRendezvous::key(int64_t round, const std::string& name) const {
  return std::string(kPrefix) + "round" + std::to_string(round) + "/" + name;
}

void ElasticRendezvous::keep_alive_loop() {
  const auto interval = seconds(options_.keep_alive_interval_s);
  auto next = Clock::now();
  for (;;) {
    int64_t round;
    int index;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
      round = round_;
      index = index_;
    }
    if (Clock::now() >= next && round >= 0 && index >= 0) {
      try {
        current_store()->add(key(round, "alive/" + std::to_string(index)), 1);
      } catch (const std::exception&) {
        // The store host is gone; the agent notices through its workers.
      }
      next = Clock::now() + interval;
    }
    std::this_thread::sleep_for(kPollStep);
  }
}

// Whether every member of the previous round either left it (joined this one, or is about to)
// or went silent: closing earlier could start the new group before the old one's last
// checkpoint is complete.
bool ElasticRendezvous::previous_members_gone(int64_t round) {
  if (round == 0 || !store_->has(key(round - 1, "closed"))) return true;
  const int members = std::stoi(store_->get(key(round - 1, "closed")));
  for (int j = 0; j < members; ++j) {
    if (store_->has(key(round - 1, "left/" + std::to_string(j)))) continue;
    // A member still keeping round - 1 alive is stopping its workers: wait for it.
    const std::string alive = key(round - 1, "alive/" + std::to_string(j));
    const int64_t before = store_->counter(alive);
    std::this_thread::sleep_for(
        seconds(options_.keep_alive_interval_s * options_.keep_alive_max_attempt));
    if (store_->has(key(round - 1, "left/" + std::to_string(j)))) continue;
    if (store_->counter(alive) != before) return false;
  }
  return true;
}

void ElasticRendezvous::lead(int64_t round) {
  auto logger = log::get("launch");
  const auto deadline = Clock::now() + seconds(options_.join_timeout_s);
  const std::string joined = key(round, "joined");
  while (store_->counter(joined) < options_.min_nodes || !previous_members_gone(round)) {
    LOOM_CHECK_AS(CommError, Clock::now() < deadline, "elastic rendezvous round ", round, ": ",
                  store_->counter(joined), " of at least ", options_.min_nodes,
                  " node(s) joined within join_timeout = ", options_.join_timeout_s, " s");
    std::this_thread::sleep_for(kPollStep);
  }
  const auto last_call = Clock::now() + seconds(options_.last_call_timeout_s);
  while (store_->counter(joined) < options_.max_nodes && Clock::now() < last_call) {
    std::this_thread::sleep_for(kPollStep);
  }
  const int64_t members = std::min<int64_t>(store_->counter(joined), options_.max_nodes);
  store_->set(key(round, "master"), options_.local_addr + ":" + std::to_string(pick_free_port()));
  store_->set(key(round, "closed"), std::to_string(members));
  logger->info("elastic rendezvous round {} closed with {} node(s)", round, members);
}

c10::intrusive_ptr<c10d::Store> ElasticRendezvous::current_store() {
  std::lock_guard<std::mutex> lock(mutex_);
  return store_->store;
}

RendezvousResult ElasticRendezvous::next_rendezvous(int /*attempt*/) {
  for (;;) {
    try {
      return join_next_round();
    } catch (const c10::DistError& e) {
      log::get("launch")->warn("elastic rendezvous: the store at {}:{} stopped answering ({})",
                               options_.endpoint_host, options_.endpoint_port, message_of(e));
      if (!fail_over()) throw;
    }
  }
}

bool ElasticRendezvous::fail_over() {
  auto logger = log::get("launch");
  if (standbys_.empty() || standby_index_ < 0) return false;
  const auto deadline = Clock::now() + seconds(options_.join_timeout_s);
  // Each lower node gets a window per pass to come up as the host; the first pass gives the
  // lowest survivor time to notice the loss itself.
  const auto window = std::chrono::milliseconds(static_cast<int64_t>(
      1000 * std::max(2.0, 2 * options_.keep_alive_interval_s * options_.keep_alive_max_attempt)));
  while (Clock::now() < deadline) {
    for (int j = 0; j <= standby_index_; ++j) {
      const std::string& address = standbys_[static_cast<size_t>(j)];
      const size_t colon = address.rfind(':');
      const std::string host = address.substr(0, colon);
      const int port = std::stoi(address.substr(colon + 1));
      SecuredStoreOptions options = secured_store_options(host, port);
      options.names.server = "standby rendezvous store";
      options.store.timeout = window;
      try {
        std::unique_ptr<SecuredStore> secured;
        if (j == standby_index_) {
          secured = SecuredStore::host(options);
          write_store_identity(*secured->store(), {options_.run_id, 0});
          // The survivors join the round after the last one (keys of the old store are gone).
          secured->store()->set(std::string(kPrefix) + "round",
                                store_bytes(std::to_string(round_ + 1)));
        } else {
          secured = SecuredStore::connect(options);
          const std::string theirs = read_store_run_id(*secured->store(), address, window, "");
          if (theirs != options_.run_id) continue;
        }
        {
          std::lock_guard<std::mutex> lock(mutex_);
          store_->store = secured->store();
          store_->secured = std::move(secured);
          hosts_store_ = j == standby_index_;
        }
        logger->warn("elastic rendezvous: {} the store at {} (node {} of the last round)",
                     hosts_store_ ? "took over" : "moved to", address, j);
        return true;
      } catch (const std::exception&) {
        // Not up (yet), or this node's standby port is taken: the next candidate.
      }
    }
  }
  return false;
}

RendezvousResult ElasticRendezvous::join_next_round() {
  auto logger = log::get("launch");
  const std::string round_key = std::string(kPrefix) + "round";
  if (round_ >= 0) {
    // Leave the round and open the next one (only the first node to leave moves it on).
    store_->set(key(round_, "left/" + std::to_string(index_)), "1");
    store_->store->compareSet(round_key, store_bytes(std::to_string(round_)),
                              store_bytes(std::to_string(round_ + 1)));
  }
  const auto deadline = Clock::now() + seconds(options_.join_timeout_s);
  int64_t registered_waiting = -1;
  for (;;) {
    LOOM_CHECK_AS(
        CommError, Clock::now() < deadline,
        "elastic rendezvous: not admitted within join_timeout = ", options_.join_timeout_s, " s");
    RendezvousResult result;
    if (store_->has(std::string(kPrefix) + "done")) {
      result.job_done = true;
      return result;
    }
    store_->store->compareSet(round_key, {}, store_bytes("0"));
    const int64_t round = std::stoll(store_->get(round_key));
    if (store_->has(key(round, "closed"))) {
      if (registered_waiting != round) {
        logger->info(
            "elastic rendezvous round {} is running: waiting to be admitted at its "
            "next step boundary",
            round);
        store_->store->add(key(round, "waiting"), 1);
        registered_waiting = round;
      }
      std::this_thread::sleep_for(kPollStep * 2);
      continue;
    }
    const int index = static_cast<int>(store_->store->add(key(round, "joined"), 1) - 1);
    store_->set(key(round, "nproc/" + std::to_string(index)),
                std::to_string(options_.nproc_per_node));
    store_->set(key(round, "standby/" + std::to_string(index)),
                options_.local_addr + ":" + std::to_string(standby_port_));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      round_ = round;
      index_ = index;
    }
    if (index == 0) lead(round);
    while (!store_->has(key(round, "closed"))) {
      LOOM_CHECK_AS(CommError, Clock::now() < deadline, "elastic rendezvous round ", round,
                    " was not closed within join_timeout = ", options_.join_timeout_s,
                    " s (its leader may have died)");
      std::this_thread::sleep_for(kPollStep);
    }
    const int members = std::stoi(store_->get(key(round, "closed")));
    if (index >= members) {  // joined after it closed: wait for the next one
      store_->set(key(round, "left/" + std::to_string(index)), "1");
      store_->store->add(key(round, "waiting"), 1);
      registered_waiting = round;
      continue;
    }
    standbys_.clear();
    for (int j = 0; j < members; ++j) {
      standbys_.push_back(store_->get(key(round, "standby/" + std::to_string(j))));
    }
    standby_index_ = index;
    int offset = 0, world = 0;
    for (int j = 0; j < members; ++j) {
      const int nproc = std::stoi(store_->get(key(round, "nproc/" + std::to_string(j))));
      if (j < index) offset += nproc;
      world += nproc;
    }
    const std::string master = store_->get(key(round, "master"));
    const size_t colon = master.rfind(':');
    result.world_size = world;
    result.group_rank = index;
    result.group_world_size = members;
    result.local_world_size = options_.nproc_per_node;
    for (int local = 0; local < options_.nproc_per_node; ++local) {
      result.global_ranks.push_back(offset + local);
    }
    result.master_addr = master.substr(0, colon);
    result.master_port = std::stoi(master.substr(colon + 1));
    result.run_id = options_.run_id;
    members_ = members;
    alive_seen_.clear();
    return result;
  }
}

Membership ElasticRendezvous::poll_membership() {
  const auto now = Clock::now();
  if (round_ < 0 || now - last_poll_ < 500ms) return Membership::kStable;
  last_poll_ = now;
  try {
    if (store_->counter(key(round_, "ended")) > 0) return Membership::kRoundEnded;
    if (members_ < options_.max_nodes && store_->counter(key(round_, "waiting")) > 0) {
      return Membership::kNodeWaiting;
    }
    const auto lost_after =
        seconds(options_.keep_alive_interval_s * options_.keep_alive_max_attempt);
    for (int j = 0; j < members_; ++j) {
      if (j == index_) continue;
      const int64_t beats = store_->counter(key(round_, "alive/" + std::to_string(j)));
      auto [it, fresh] = alive_seen_.try_emplace(j, beats, now);
      if (fresh || it->second.first != beats) {
        it->second = {beats, now};
      } else if (now - it->second.second > lost_after) {
        log::get("launch")->error("node {} of round {} sent no keep-alive for {:.0f} s: lost", j,
                                  round_, std::chrono::duration<double>(lost_after).count());
        end_round("node " + std::to_string(j) + " lost");
        return Membership::kRoundEnded;
      }
    }
  } catch (const std::exception& e) {
    log::get("launch")->warn("elastic rendezvous: store unreachable ({})", message_of(e));
  }
  return Membership::kStable;
}

void ElasticRendezvous::end_round(const std::string& reason) {
  if (round_ < 0) return;
  log::get("launch")->warn("ending elastic round {} for every node: {}", round_, reason);
  try {
    store_->store->add(key(round_, "ended"), 1);
  } catch (const std::exception&) {
    // Store gone: the other agents see their workers fail.
  }
}

bool ElasticRendezvous::round_ended() {
  if (round_ < 0) return false;
  try {
    return store_->counter(key(round_, "ended")) > 0;
  } catch (const std::exception&) {
    return false;
  }
}

void ElasticRendezvous::job_finished() {
  try {
    store_->set(std::string(kPrefix) + "done", "1");
  } catch (const std::exception&) {
  }
}

}  // namespace loom::distributed
