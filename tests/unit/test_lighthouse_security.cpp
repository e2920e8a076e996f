// The lighthouse as an attacker meets it (issue 55): a stranger without the job secret can
// neither read a key, nor join a quorum, nor reach a replica process group's rendezvous; an
// insider's malformed writes are dropped and quorums keep forming; forged answers and
// unreachable step claims are not taken; a signal ends the wait for a quorum.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <csignal>
#include <fstream>
#include <future>
#include <optional>
#include <thread>

#include "loom/core/check.h"
#include "loom/core/signals.h"
#include "loom/core/terminal_text.h"
#include "loom/distributed/auth_gate.h"
#include "loom/distributed/job_secret.h"
#include "loom/distributed/lighthouse.h"
#include "loom/distributed/process_groups.h"
#include "loom/distributed/quorum.h"
#include "loom/distributed/secured_store.h"
#include "loom/distributed/store_connect.h"
#include "support/process.h"
#include "support/test_sets.h"

namespace {

using namespace loom::distributed;
using std::chrono::milliseconds;

std::vector<uint8_t> bytes(const std::string& text) {
  return {text.begin(), text.end()};
}

LighthouseOptions secured(int64_t min_replicas = 1) {
  LighthouseOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.rules.min_replicas = min_replicas;
  options.rules.join_timeout = milliseconds(20000);
  options.rules.heartbeat_timeout = milliseconds(2000);
  options.tick = milliseconds(5);
  options.secret = make_job_secret();
  return options;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// A raw TCP connection to 127.0.0.1:port.
int dial(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// What a plain c10d client (no handshake) reads of `key` at 127.0.0.1:port; throws when it
// cannot reach a store there.
std::vector<uint8_t> plain_client_get(int port, const std::string& key) {
  c10d::TCPStoreOptions plain;
  plain.port = static_cast<uint16_t>(port);
  plain.isServer = false;
  plain.waitWorkers = false;
  plain.timeout = milliseconds(1000);
  return connect_store("127.0.0.1", plain, "store")->get(key);
}

std::string read_some(int fd, size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, out.data() + got, n - got, 0);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

// A store client that holds `secret` and speaks the raw c10d protocol: what any insider (or a
// compromised member) could write.
struct Insider {
  Insider(const Lighthouse& lighthouse, const JobSecret& secret)
      : tunnel("127.0.0.1", lighthouse.port(), secret, lighthouse.address(), milliseconds(5000)) {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(tunnel.local_port());
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = milliseconds(5000);
    store = connect_store("127.0.0.1", options, "lighthouse");
  }
  void register_replica(const std::string& text) {
    const int64_t n = store->add("ft/registered", 1) - 1;
    store->set("ft/registered/" + std::to_string(n), bytes(text));
  }
  AuthTunnel tunnel;
  c10::intrusive_ptr<c10d::TCPStore> store;
};

LOOM_TEST(LighthouseSecurity, StrangersWithoutTheSecretCannotReadJoinOrReceiveState) {
  const LighthouseOptions options = secured(2);  // the quorum waits for both members
  Lighthouse lighthouse(options);
  // A plain c10d client straight at the port: it never gets a store to read.
  EXPECT_ANY_THROW(plain_client_get(lighthouse.port(), "ft/status"));
  // The handshake by hand with a made-up proof: refused, then closed.
  const int fd = dial(lighthouse.port());
  const std::string hello = read_some(fd, 42);
  ASSERT_EQ(hello.substr(0, 10), std::string("LOOMGATE1S"));
  const std::string forged(64, 'x');
  ASSERT_EQ(::send(fd, forged.data(), forged.size(), MSG_NOSIGNAL), 64);
  EXPECT_EQ(read_some(fd, 33), "N");
  ::close(fd);
  // loom's own client, without the secret or with another job's: one line each.
  const std::string no_secret =
      error_of([&] { LighthouseClient c(lighthouse.address(), 0, milliseconds(5000)); });
  EXPECT_NE(no_secret.find("admits only workers holding the job secret"), std::string::npos)
      << no_secret;
  const std::string wrong = error_of([&] {
    LighthouseClient c(lighthouse.address() + "?secret=" + to_hex(make_job_secret()), 0,
                       milliseconds(5000));
  });
  EXPECT_NE(wrong.find("refused this worker's job secret"), std::string::npos) << wrong;
  EXPECT_THROW(LighthouseClient(lighthouse.address(), 0, milliseconds(5000)), loom::InputError);
  for (int i = 0; i < 500 && lighthouse.connections_refused() < 3; ++i) {
    std::this_thread::sleep_for(milliseconds(10));  // the gate notices a closed socket later
  }
  EXPECT_GE(lighthouse.connections_refused(), 3);
  EXPECT_EQ(lighthouse.quorums_formed(), 0) << "nobody joined";
  // With the secret: a quorum, and a replica process group that carries a tensor (model state
  // travels over such a group's connections, whose rendezvous is in this store).
  LighthouseClient c0(lighthouse.worker_address(), 0, milliseconds(5000));
  LighthouseClient c1(lighthouse.worker_address(), 1, milliseconds(5000));
  c0.start_heartbeat(milliseconds(20));
  c1.start_heartbeat(milliseconds(20));
  auto member = [&](LighthouseClient* client, int64_t replica, float value) {
    const Quorum q = client->request_quorum({replica, 1, 0, "i", false, 1}, milliseconds(20000));
    auto comm =
        client->replica_group(q.id, 0, q.index_of(replica), static_cast<int>(q.members.size()),
                              milliseconds(20000), "gloo");
    at::Tensor t = at::full({4}, value);
    comm->broadcast(t, 0);
    return t[0].item<float>();
  };
  auto a = std::async(std::launch::async, member, &c0, 0, 7.0f);
  auto b = std::async(std::launch::async, member, &c1, 1, 0.0f);
  EXPECT_EQ(a.get(), 7.0f);
  EXPECT_EQ(b.get(), 7.0f) << "the member with the secret received the state";
}

// Each malformed write of the adversarial run, by a client that holds the secret: the entry is
// dropped, the groups it aimed at keep beating, and quorums keep forming.
// A replica group's own rendezvous store (rank 0's, at MASTER_PORT) with the job secret: its
// ranks join and reduce through it; a stranger reads no key of it (the group's collective
// connections are set up through those keys), a process without the secret or with another
// job's is refused in one line, and one holding it reads the job's keys.
LOOM_TEST(LighthouseSecurity, AGroupsRendezvousStoreAdmitsOnlyHoldersOfTheSecret) {
  const JobSecret secret = make_job_secret();
  const int port = loom::testing::free_port();
  std::promise<void> probed;
  std::shared_future<void> probes_done = probed.get_future().share();
  std::promise<void> rank0_joined;
  std::vector<std::string> errors(2);
  std::vector<float> sums(2, 0.0f);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        CommInit init;
        init.rank = rank;
        init.world_size = 2;
        init.master_addr = "127.0.0.1";
        init.master_port = port;
        init.options.init_timeout = std::chrono::seconds(30);
        init.secret = secret;
        ProcessGroups groups(init);
        at::Tensor t = at::ones({2}) * (rank + 1);
        groups.world().all_reduce(t, ReduceOp::kSum);
        sums[rank] = t[0].item<float>();
        if (rank == 0) rank0_joined.set_value();
        probes_done.wait();  // the store lives while the probes run
      } catch (const std::exception& e) {
        errors[rank] = e.what();
        if (rank == 0) rank0_joined.set_value();
      }
    });
  }
  rank0_joined.get_future().wait();
  // However the probes end (a failed assertion throws out of this scope), the ranks are let go
  // and joined: a failure is reported, not a std::terminate of the whole binary.
  struct Release {
    Release(std::promise<void>& p, std::vector<std::thread>& r) : probed(p), ranks(r) {}
    std::promise<void>& probed;
    std::vector<std::thread>& ranks;
    ~Release() {
      probed.set_value();
      for (auto& r : ranks) r.join();
    }
  };
  std::optional<Release> release(std::in_place, probed, ranks);
  SecuredStoreOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.store.timeout = milliseconds(3000);
  options.names.server = "rendezvous store";
  options.names.secret_hint = "give every rank the launcher's LOOM_JOB_SECRET";
  // A plain c10d client: no key, not even the run id.
  EXPECT_ANY_THROW(plain_client_get(port, "loom/job/run_id"));
  const int fd = dial(port);
  EXPECT_EQ(read_some(fd, 10), "LOOMGATE1S");
  ::close(fd);
  const std::string none = error_of([&] { SecuredStore::connect(options); });
  EXPECT_NE(none.find("the rendezvous store at 127.0.0.1:" + std::to_string(port) +
                      " admits only workers holding the job secret: give every rank"),
            std::string::npos)
      << none;
  options.secret = make_job_secret();
  const std::string other = error_of([&] { SecuredStore::connect(options); });
  EXPECT_NE(other.find("refused this worker's job secret"), std::string::npos) << other;
  options.secret = secret;
  auto member = SecuredStore::connect(options);
  EXPECT_EQ(member->store()->get("loom/job/world_size"), bytes("2"));
  release.reset();
  EXPECT_EQ(errors, std::vector<std::string>(2));
  EXPECT_EQ(sums, std::vector<float>(2, 3.0f));
}

LOOM_TEST(LighthouseSecurity, MalformedEntriesAreDroppedAndQuorumsKeepForming) {
  const LighthouseOptions options = secured(2);
  Lighthouse lighthouse(options);
  Insider insider(lighthouse, options.secret);
  insider.register_replica("not-a-number");
  insider.register_replica("5");
  insider.store->set("ft/request/5", bytes(std::string(200000, '[') + std::string(200000, ']')));
  insider.register_replica("6");
  insider.store->set("ft/request/6", bytes(R"({"replica": 7, "seq": 1, "step": 0,
      "incarnation": "x", "group_broken": false, "group_ranks": 1})"));
  insider.register_replica("8");
  insider.store->set("ft/heartbeat/8", bytes("not-a-counter"));

  LighthouseClient c0(lighthouse.worker_address(), 0, milliseconds(5000));
  LighthouseClient c1(lighthouse.worker_address(), 1, milliseconds(5000));
  c0.start_heartbeat(milliseconds(20));
  c1.start_heartbeat(milliseconds(20));
  // Group 0's heartbeat overwritten with text: its beats count again after the reset.
  insider.store->set("ft/heartbeat/0", bytes("3; rm -rf"));
  // A forged answer for group 0's next request that leaves group 0 out: discarded.
  insider.store->set("ft/answer/0/1", bytes(R"({"id": 9, "max_step": 99,
      "members": [{"replica": 5, "step": 99, "incarnation": "z", "group_ranks": 1}]})"));
  auto first = std::async(std::launch::async, [&] {
    return c1.request_quorum({1, 1, 0, "b", false, 1}, milliseconds(20000));
  });
  const Quorum q = c0.request_quorum({0, 1, 0, "a", false, 1}, milliseconds(20000));
  EXPECT_EQ(q.participants(), "0,1");
  EXPECT_EQ(q.max_step, 0);
  EXPECT_EQ(first.get().participants(), "0,1");
  // A claim no quorum can reach (step 10^15): dropped, nobody heals from it.
  insider.store->add("ft/heartbeat/5", 1);
  insider.store->set("ft/request/5", bytes(R"({"replica": 5, "seq": 1, "step": 1000000000000000,
      "incarnation": "z", "group_broken": false, "group_ranks": 1})"));
  auto second = std::async(std::launch::async, [&] {
    return c1.request_quorum({1, 2, 1, "b", false, 1}, milliseconds(20000));
  });
  const Quorum next = c0.request_quorum({0, 2, 1, "a", false, 1}, milliseconds(20000));
  EXPECT_EQ(next.participants(), "0,1");
  EXPECT_EQ(next.max_step, 1);
  EXPECT_EQ(second.get().max_step, 1);
  // not-a-number, the deep request, the mismatched one, group 8's heartbeat, the step claim; and
  // group 0's overwritten heartbeat when the lighthouse read it before group 0's next beat (every
  // 20 ms) replaced it: on a loaded machine it may not have (5 counted, seen twice in suites).
  EXPECT_GE(lighthouse.entries_dropped(), 5);
}

// Two groups started with one replica id both keep beating: the younger is refused by name, the
// older keeps forming quorums. A restart (the old incarnation falls silent) is not refused.
LOOM_TEST(LighthouseSecurity, TwoGroupsWithOneReplicaIdAreRefusedByNameRestartsAreNot) {
  LighthouseOptions options = secured(2);
  options.rules.heartbeat_timeout = milliseconds(300);
  Lighthouse lighthouse(options);
  const std::string address = lighthouse.worker_address();
  LighthouseClient first(address, 3, milliseconds(5000)), second(address, 3, milliseconds(5000));
  LighthouseClient other(address, 4, milliseconds(5000));
  first.start_heartbeat(milliseconds(20), "first");
  other.start_heartbeat(milliseconds(20), "other");
  std::this_thread::sleep_for(milliseconds(50));
  second.start_heartbeat(milliseconds(20), "second");
  try {
    second.request_quorum({3, 1, 0, "second", false, 1}, milliseconds(20000));
    FAIL() << "a second group with replica id 3 was answered";
  } catch (const loom::InputError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("fault_tolerance.replica_id 3 is taken"), std::string::npos) << text;
    EXPECT_NE(text.find("incarnation first"), std::string::npos) << text;
  }
  auto a = std::async(std::launch::async, [&] {
    return first.request_quorum({3, 1, 0, "first", false, 1}, milliseconds(20000));
  });
  const Quorum q = other.request_quorum({4, 1, 0, "other", false, 1}, milliseconds(20000));
  EXPECT_EQ(q.participants(), "3,4");
  EXPECT_EQ(q.members[0].incarnation, "first");
  EXPECT_EQ(a.get().id, q.id);
  // Replica 5 restarts: its old incarnation stops beating, a new one starts at once.
  auto old = std::make_unique<LighthouseClient>(address, 5, milliseconds(5000));
  old->start_heartbeat(milliseconds(20), "old");
  std::this_thread::sleep_for(milliseconds(100));
  old.reset();
  LighthouseClient restarted(address, 5, milliseconds(5000));
  restarted.start_heartbeat(milliseconds(20), "new");
  std::this_thread::sleep_for(milliseconds(700));  // past heartbeat_timeout: no refusal
  // The newcomer asks first (a fast quorum of the last members would not wait for it).
  auto r = std::async(std::launch::async, [&] {
    return restarted.request_quorum({5, 1, 0, "new", false, 1}, milliseconds(20000));
  });
  std::this_thread::sleep_for(milliseconds(100));
  auto b = std::async(std::launch::async, [&] {
    return other.request_quorum({4, 2, 0, "other", false, 1}, milliseconds(20000));
  });
  EXPECT_EQ(first.request_quorum({3, 2, 0, "first", false, 1}, milliseconds(20000)).participants(),
            "3,4,5");
  EXPECT_EQ(r.get().participants(), "3,4,5");
  b.get();
}

LOOM_TEST(LighthouseSecurity, ASignalEndsTheWaitForAQuorum) {
  Lighthouse lighthouse(secured(2));  // never forms a quorum with one group
  LighthouseClient c0(lighthouse.worker_address(), 0, milliseconds(5000));
  c0.start_heartbeat(milliseconds(20));
  loom::signals::install_shutdown_handlers();
  std::thread signaller([] {
    std::this_thread::sleep_for(milliseconds(200));
    std::raise(SIGTERM);
  });
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_of([&] {
    c0.request_quorum({0, 1, 0, "a", false, 1}, milliseconds(60000));
  });
  signaller.join();
  loom::signals::clear_shutdown_request();
  EXPECT_NE(error.find("stopped by signal 15"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(30000));
}

// `loom lighthouse` (the real process, with its secret in a file) SIGSTOPped under a connected
// group: the group's request ends with an error within the request's deadline plus one store
// operation's (both the connect timeout here), never hangs.
LOOM_TEST(LighthouseSecurity, AStoppedLighthouseEndsTheRequestWithinItsDeadline) {
  const std::string folder = loom::testing::fresh_temp_dir("lighthouse_sigstop");
  const std::string secret_file = folder + "/secret";
  std::ofstream(secret_file) << to_hex(make_job_secret()) << "\n";
  const int port = loom::testing::free_port();
  const auto started = loom::testing::run_command(
      std::string(LOOM_BINARY) + " lighthouse --min-replicas 2 --secret-file " + secret_file +
      " --bind 127.0.0.1:" + std::to_string(port) + " > " + folder + "/log 2>&1 & echo $!");
  const int pid = std::stoi(started.output);
  const std::string address = "127.0.0.1:" + std::to_string(port) + "?secret_file=" + secret_file;
  std::unique_ptr<LighthouseClient> client;
  for (int i = 0; i < 300 && !client; ++i) {  // until it listens (a loaded machine: seconds)
    try {
      client = std::make_unique<LighthouseClient>(address, 0, milliseconds(2000));
    } catch (const CommError&) {
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  ASSERT_TRUE(client) << loom::testing::read_text(folder + "/log");
  ::kill(pid, SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_ANY_THROW(client->request_quorum({0, 1, 0, "a", false, 1}, milliseconds(2000)));
  const auto waited = std::chrono::steady_clock::now() - start;
  ::kill(pid, SIGKILL);
  ::kill(pid, SIGCONT);
  EXPECT_LT(waited, milliseconds(20000)) << "2 s deadline + one 2 s store operation, with slack";
}

// A collective across replica groups that times out names the key that set its timeout.
LOOM_TEST(LighthouseSecurity, AReplicaGroupTimeoutNamesItsOwnKey) {
  Lighthouse lighthouse(secured(2));
  LighthouseClient c0(lighthouse.worker_address(), 0, milliseconds(5000));
  LighthouseClient c1(lighthouse.worker_address(), 1, milliseconds(5000));
  c0.start_heartbeat(milliseconds(20));
  c1.start_heartbeat(milliseconds(20));
  auto join = [&](LighthouseClient* client, int64_t replica) {
    const Quorum q = client->request_quorum({replica, 1, 0, "i", false, 1}, milliseconds(20000));
    return client->replica_group(q.id, 0, q.index_of(replica), 2, milliseconds(500), "gloo");
  };
  auto other = std::async(std::launch::async, join, &c1, 1);
  auto mine = join(&c0, 0);
  auto theirs = other.get();  // joined, but never takes part in the all-reduce below
  at::Tensor t = at::ones({2});
  const std::string error = error_of([&] { mine->all_reduce(t); });
  EXPECT_NE(error.find("fault_tolerance.process_group_timeout_ms"), std::string::npos) << error;
  EXPECT_EQ(error.find("comm.init_timeout_seconds"), std::string::npos) << error;
}

// `loom lighthouse --insecure`: no secret, everyone admitted (with a warning); a worker that holds
// a secret refuses it (it cannot tell it from an impostor).
LOOM_TEST(LighthouseSecurity, AnOpenLighthouseAdmitsAnyoneButNotWorkersHoldingASecret) {
  LighthouseOptions options = secured();
  options.secret = {};
  Lighthouse lighthouse(options);
  EXPECT_EQ(lighthouse.worker_address(), lighthouse.address());
  LighthouseClient plain(lighthouse.address(), 0, milliseconds(5000));
  plain.start_heartbeat(milliseconds(20));
  EXPECT_EQ(plain.request_quorum({0, 1, 0, "a", false, 1}, milliseconds(20000)).participants(),
            "0");
  const std::string error = error_of([&] {
    LighthouseClient c(lighthouse.address() + "?secret=" + to_hex(make_job_secret()), 1,
                       milliseconds(5000));
  });
  EXPECT_NE(error.find("admits anyone"), std::string::npos) << error;
}

LOOM_TEST(LighthouseSecurity, ListensOnlyOnAnAddressOfThisHost) {
  LighthouseOptions options = secured();
  options.host = "8.8.8.8";
  const std::string error = error_of([&] { Lighthouse lighthouse(options); });
  EXPECT_NE(error.find("not an address of this machine"), std::string::npos) << error;
}

LOOM_TEST(LighthouseSecurity, SecretsInAddressesParseAndNeverPrint) {
  const JobSecret s = make_job_secret();
  const std::string hex = to_hex(s);
  EXPECT_EQ(hex.size(), 64u);
  EXPECT_EQ(parse_job_secret(hex, "x").bytes, s.bytes);
  const LighthouseTarget t = split_lighthouse_target("http://h:5?secret=" + hex, "x");
  EXPECT_EQ(t.address, "http://h:5");
  EXPECT_EQ(t.secret.bytes, s.bytes);
  EXPECT_EQ(parse_lighthouse_address("h:5?secret=" + hex, "x"),
            std::make_pair(std::string("h"), 5));
  EXPECT_EQ(redact_secret("a:1?secret=" + hex + ",b:2?secret=" + hex),
            "a:1?secret=***,b:2?secret=***");
  const std::vector<std::string> bad_ones = {"h:5?secret=abc", "h:5?token=" + hex,
                                             "h:5?secret=" + hex + "zz"};
  for (const std::string& bad : bad_ones) {
    const std::string error = error_of([&] { split_lighthouse_target(bad, "TORCHFT_LIGHTHOUSE"); });
    EXPECT_NE(error.find("TORCHFT_LIGHTHOUSE"), std::string::npos) << error;
    EXPECT_EQ(error.find(hex), std::string::npos) << "the secret leaked: " << error;
  }
  // HMAC-SHA256 of RFC 4231's test case 2 (OpenSSL's, checked here against the standard).
  const Digest d = hmac_sha256({"Jefe"}, "what do ya want for nothing?");
  EXPECT_EQ(to_hex({std::string(d.begin(), d.end())}),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

// What `loom debug hang --lighthouse` prints of the lighthouse's status.
LOOM_TEST(LighthouseSecurity, StatusTextIsEscapedBeforePrinting) {
  EXPECT_EQ(loom::terminal::escaped("quorum 3 formed"), "quorum 3 formed");
  EXPECT_EQ(loom::terminal::escaped("\x1b]0;owned\x07\x1b[2J\n\\"),
            "\\x1b]0;owned\\x07\\x1b[2J\\x0a\\x5c");
  EXPECT_EQ(loom::terminal::escaped("\xc2\x9b"), "\\xc2\\x9b");  // C1 CSI in UTF-8
  EXPECT_EQ(loom::terminal::escaped(std::string(5000, 'a')).size(), 2003u);
}

}  // namespace
