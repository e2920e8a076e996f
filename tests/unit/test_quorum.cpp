// Quorums of fault-tolerant replica groups: the lighthouse's rules (decide_quorum) as a table of
// situations, and a lighthouse in this process answering clients on threads, whose replica
// process group then all-reduces.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include <future>
#include <thread>

#include "comm_test_util.h"
#include "loom/core/check.h"
#include "loom/distributed/lighthouse.h"
#include "loom/distributed/quorum.h"
#include "loom/train/replica_manager.h"
#include "support/test_sets.h"

namespace {

using namespace loom::distributed;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

QuorumRules rules(int64_t min_replicas = 1) {
  QuorumRules r;
  r.min_replicas = min_replicas;
  r.join_timeout = milliseconds(1000);
  r.heartbeat_timeout = milliseconds(500);
  return r;
}

QuorumRequest ask(int64_t replica, int64_t step, const std::string& incarnation = "a",
                  bool broken = false) {
  return {replica, 1, step, incarnation + std::to_string(replica), broken, 2};
}

// A view at `now` where `beating` groups beat just now and `asking` asked.
LighthouseView view(Clock::time_point now, const std::vector<int64_t>& beating,
                    const std::vector<QuorumRequest>& asking) {
  LighthouseView v;
  for (int64_t r : beating) v.last_heartbeat[r] = now;
  for (const auto& q : asking) v.requests[q.replica] = q;
  if (!asking.empty()) v.first_request = now;
  return v;
}

Quorum previous(int64_t id, const std::vector<int64_t>& replicas) {
  Quorum q;
  q.id = id;
  for (int64_t r : replicas) q.members.push_back({r, 3, "a" + std::to_string(r), 2});
  q.max_step = 3;
  return q;
}

LOOM_TEST(QuorumRules, WaitsForMinReplicasAndForHealthyGroupsUntilJoinTimeout) {
  const auto now = Clock::now();
  // Two beat, one asked, no previous quorum: wait for the other (until join_timeout).
  auto v = view(now, {0, 1}, {ask(0, 0)});
  auto d = decide_quorum(v, now, rules());
  EXPECT_FALSE(d.quorum);
  EXPECT_NE(d.waiting_for.find("replica groups 1"), std::string::npos) << d.waiting_for;
  const auto later = now + milliseconds(1001);
  v.last_heartbeat[0] = v.last_heartbeat[1] = later;  // both still beat
  d = decide_quorum(v, later, rules());
  ASSERT_TRUE(d.quorum);
  EXPECT_EQ(d.quorum->participants(), "0");
  // min_replicas 2: never with one asker, even after join_timeout.
  d = decide_quorum(v, later, rules(2));
  EXPECT_FALSE(d.quorum);
  EXPECT_NE(d.waiting_for.find("at least 2"), std::string::npos) << d.waiting_for;
  // Everyone healthy asked: at once.
  v = view(now, {0, 1}, {ask(0, 0), ask(1, 0)});
  d = decide_quorum(v, now, rules(2));
  ASSERT_TRUE(d.quorum);
  EXPECT_EQ(d.quorum->participants(), "0,1");
  EXPECT_EQ(d.quorum->id, 1);
}

LOOM_TEST(QuorumRules, FastQuorumSkipsNewcomersAndDeadMembersDoNotBlock) {
  const auto now = Clock::now();
  // The previous quorum {0} asked again while 1 beats without asking: fast quorum {0}.
  auto v = view(now, {0, 1}, {ask(0, 3)});
  v.previous = previous(4, {0});
  auto d = decide_quorum(v, now, rules());
  ASSERT_TRUE(d.quorum);
  EXPECT_EQ(d.quorum->participants(), "0");
  EXPECT_EQ(d.quorum->id, 4) << "same members, same incarnations: same id";
  // Previous {0,1}; 1 stopped beating (dead): 0 alone at once once 1 is past heartbeat_timeout.
  v = view(now, {0}, {ask(0, 3)});
  v.last_heartbeat[1] = now - milliseconds(600);
  v.previous = previous(4, {0, 1});
  d = decide_quorum(v, now, rules());
  ASSERT_TRUE(d.quorum);
  EXPECT_EQ(d.quorum->participants(), "0");
  EXPECT_EQ(d.quorum->id, 5) << "membership changed";
  // Previous {0,1}, 1 beats (restarted) but has not asked: wait for it.
  v.last_heartbeat[1] = now;
  EXPECT_FALSE(decide_quorum(v, now, rules()).quorum);
  // An asker without a heartbeat is not healthy: not a member.
  v = view(now, {0}, {ask(0, 3), ask(1, 3)});
  v.previous = previous(4, {0});
  d = decide_quorum(v, now, rules());
  ASSERT_TRUE(d.quorum);
  EXPECT_EQ(d.quorum->participants(), "0");
}

LOOM_TEST(QuorumRules, IdChangesWithRestartsAndBrokenGroupsAndHealersPickUpToDateSources) {
  const auto now = Clock::now();
  auto v = view(now, {0, 1}, {ask(0, 7), ask(1, 0, "b")});  // 1 restarted: new incarnation
  v.previous = previous(4, {0, 1});
  auto d = decide_quorum(v, now, rules());
  ASSERT_TRUE(d.quorum);
  EXPECT_EQ(d.quorum->id, 5);
  EXPECT_EQ(d.quorum->max_step, 7);
  EXPECT_EQ(d.quorum->heal_source(0), -1);
  EXPECT_EQ(d.quorum->heal_source(1), 0);
  // Same members and incarnations, but one reports its process group broken: a new id.
  v = view(now, {0, 1}, {ask(0, 3), ask(1, 3, "a", true)});
  v.previous = previous(4, {0, 1});
  d = decide_quorum(v, now, rules());
  ASSERT_TRUE(d.quorum);
  EXPECT_EQ(d.quorum->id, 5);
  // Three behind, two up to date: round robin over the sources.
  Quorum q;
  q.max_step = 9;
  for (int64_t r = 0; r < 5; ++r) q.members.push_back({r, r < 2 ? 9 : 2, "x", 1});
  EXPECT_EQ(q.up_to_date(), (std::vector<int>{0, 1}));
  EXPECT_EQ(q.heal_source(2), 0);
  EXPECT_EQ(q.heal_source(3), 1);
  EXPECT_EQ(q.heal_source(4), 0);
  // The JSON round trip the lighthouse answers with.
  const Quorum back = quorum_from_json(to_json(q), "test");
  EXPECT_EQ(back.participants(), q.participants());
  EXPECT_EQ(back.max_step, 9);
  EXPECT_THROW(quorum_from_json(nlohmann::json::parse(R"({"id":1})"), "answer"), loom::InputError);
}

LOOM_TEST(QuorumRules, LighthouseAddresses) {
  EXPECT_EQ(parse_lighthouse_address("http://127.0.0.1:29510", "x"),
            std::make_pair(std::string("127.0.0.1"), 29510));
  EXPECT_EQ(parse_lighthouse_address("host:80/", "x"), std::make_pair(std::string("host"), 80));
  EXPECT_EQ(parse_lighthouse_address("[::1]:5", "x"), std::make_pair(std::string("::1"), 5));
  for (const char* bad : {"host", "host:", ":80", "host:0", "host:99999", "host:8x"}) {
    EXPECT_THROW(parse_lighthouse_address(bad, "TORCHFT_LIGHTHOUSE"), loom::InputError) << bad;
  }
}

// Two replica groups of one rank each on threads: one quorum, then an all-reduce over the replica
// process group it names; then group 1 stops beating and group 0 gets a quorum of its own.
// A lighthouse on loopback with a fresh secret. Timeouts with room for a machine under 4x load
// (20 ms beats can stall for a second): the heartbeat's expiry must still come well before the
// join timeout it is told apart from.
LighthouseOptions loopback_lighthouse(int64_t min_replicas) {
  LighthouseOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.rules.min_replicas = min_replicas;
  options.rules.join_timeout = milliseconds(30000);
  options.rules.heartbeat_timeout = milliseconds(1500);
  options.tick = milliseconds(5);
  options.secret = make_job_secret();
  return options;
}

LOOM_TEST(Lighthouse, FormsQuorumsAndReplicaGroupsOverItsStore) {
  Lighthouse lighthouse(loopback_lighthouse(1));
  const std::string address = "http://" + lighthouse.worker_address();
  // Both groups beat before either asks (a lone asker with min_replicas 1 would get a quorum of
  // its own before the other group is heard of).
  auto c0 = std::make_unique<LighthouseClient>(address, 0, milliseconds(5000));
  auto c1 = std::make_unique<LighthouseClient>(address, 1, milliseconds(5000));
  c0->start_heartbeat(milliseconds(20));
  c1->start_heartbeat(milliseconds(20));
  std::this_thread::sleep_for(milliseconds(100));
  auto group = [&](LighthouseClient* client, int64_t replica, float value) {
    const Quorum q = client->request_quorum({replica, 1, 0, "i", false, 1}, milliseconds(10000));
    auto comm =
        client->replica_group(q.id, 0, q.index_of(replica), static_cast<int>(q.members.size()),
                              milliseconds(10000), "gloo");
    at::Tensor t = at::full({3}, value);
    comm->all_reduce(t);
    return std::make_pair(q, t[0].item<float>());
  };
  auto a = std::async(std::launch::async, group, c0.get(), 0, 1.0f);
  auto b = std::async(std::launch::async, group, c1.get(), 1, 2.0f);
  const auto [qa, sum_a] = a.get();
  const auto [qb, sum_b] = b.get();
  EXPECT_EQ(qa.participants(), "0,1");
  EXPECT_EQ(qa.id, qb.id);
  EXPECT_EQ(sum_a, 3.0f);
  EXPECT_EQ(sum_b, 3.0f);
  c1.reset();  // group 1 stops beating
  // Group 1's client is gone (no heartbeat): group 0 asks again and forms a quorum alone.
  const auto start = Clock::now();
  const Quorum alone = c0->request_quorum({0, 2, 1, "i", false, 1}, milliseconds(10000));
  EXPECT_EQ(alone.participants(), "0");
  EXPECT_GT(alone.id, qa.id);
  EXPECT_LT(Clock::now() - start, milliseconds(15000)) << "heartbeat_timeout, not join_timeout";
  // Nobody answers for a group the lighthouse never hears from within the timeout.
  LighthouseClient silent(address, 7, milliseconds(5000));
  EXPECT_THROW(silent.request_quorum({7, 1, 0, "s", false, 1}, milliseconds(300)), CommError);
}

// A member of the last quorum that beats but does not ask holds the round up (until
// join_timeout); the lighthouse's status names it for `loom debug hang --lighthouse`.
LOOM_TEST(Lighthouse, StatusNamesTheGroupThatHoldsUpTheQuorum) {
  LighthouseOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.rules.join_timeout = milliseconds(20000);
  options.rules.heartbeat_timeout = milliseconds(2000);
  options.tick = milliseconds(5);
  options.secret = make_job_secret();
  Lighthouse lighthouse(options);
  LighthouseClient c0(lighthouse.worker_address(), 0, milliseconds(5000));
  LighthouseClient c1(lighthouse.worker_address(), 1, milliseconds(5000));
  c0.start_heartbeat(milliseconds(20));
  c1.start_heartbeat(milliseconds(20));
  // Both groups must be alive to the lighthouse before the first ask: on a loaded machine group
  // 1's first beat can come after group 0's ask, and a quorum of group 0 alone forms (min 1).
  for (int i = 0; i < 500; ++i) {
    const auto beats = read_lighthouse_status(lighthouse.worker_address(), milliseconds(5000))
                           .value("heartbeat_age_ms", nlohmann::json::object());
    if (beats.contains("0") && beats.contains("1")) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  auto first = std::async(std::launch::async, [&] {
    return c1.request_quorum({1, 1, 0, "b", false, 1}, milliseconds(10000));
  });
  EXPECT_EQ(c0.request_quorum({0, 1, 0, "a", false, 1}, milliseconds(10000)).participants(), "0,1");
  EXPECT_EQ(first.get().participants(), "0,1");
  auto second = std::async(std::launch::async, [&] {
    return c0.request_quorum({0, 2, 1, "a", false, 1}, milliseconds(10000));
  });
  nlohmann::json status;
  for (int i = 0; i < 200; ++i) {
    status = read_lighthouse_status(lighthouse.worker_address(), milliseconds(5000));
    if (!status.value("holding_up", nlohmann::json::array()).empty()) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(status["holding_up"], nlohmann::json::array({1})) << status.dump();
  EXPECT_EQ(status["asked"]["0"], 1) << status.dump();
  EXPECT_LT(status["heartbeat_age_ms"]["1"].get<int64_t>(), 2000) << status.dump();
  // Group 1 asks: the round closes with both.
  EXPECT_EQ(c1.request_quorum({1, 2, 1, "b", false, 1}, milliseconds(10000)).participants(), "0,1");
  EXPECT_EQ(second.get().participants(), "0,1");
}

LOOM_TEST(Lighthouse, RefusesAnAddressThatIsNotALighthouse) {
  // Nothing listens on a fresh port: a clear CommError naming the address.
  try {
    LighthouseClient client("127.0.0.1:1", 0, milliseconds(500));
    FAIL() << "connected to nothing";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:1"), std::string::npos) << e.what();
  } catch (const loom::InputError& e) {
    FAIL() << e.what();
  }
}

// The semi-synchronous modes through ReplicaManager: two replica groups of one rank on threads,
// a lighthouse in this process, three periods of two local steps. After each synchronization
// both groups hold exactly what the method's definition gives: local SGD the mean of the groups'
// parameters; DiLoCo torch.optim.SGD(nesterov) stepping from the period's start parameters on
// the mean pseudo-gradient. Plain averaging in DiLoCo's place, or no synchronization, fails.
void check_semi_sync(const std::string& method) {
  Lighthouse lighthouse(loopback_lighthouse(2));
  constexpr int kPeriods = 3, kSyncSteps = 2;
  constexpr double kOuterLr = 0.7, kOuterMomentum = 0.9;
  // The local progress of group g in period p: a fixed random step per tensor, from a generator
  // of its own (the groups' threads draw at the same time; the global one would race).
  auto local_step = [](int group, int period, int tensor, const at::Tensor& like) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(
        static_cast<uint64_t>(1000 * period + 10 * group + tensor));
    return at::randn(like.sizes(), generator) * 0.1;
  };
  at::manual_seed(5);
  const std::vector<at::Tensor> initial = {at::randn({4, 3}), at::randn({6})};
  // The reference: each period's result by the method's definition.
  std::vector<std::vector<at::Tensor>> want(kPeriods);
  std::vector<at::Tensor> global;
  for (const auto& t : initial) global.push_back(t.clone().requires_grad_(true));
  torch::optim::SGD outer(
      global,
      torch::optim::SGDOptions(kOuterLr).momentum(kOuterMomentum).nesterov(true).dampening(0));
  for (int p = 0; p < kPeriods; ++p) {
    for (size_t i = 0; i < global.size(); ++i) {
      const at::Tensor start = global[i].detach().clone();
      const at::Tensor local0 = start + local_step(0, p, static_cast<int>(i), start);
      const at::Tensor local1 = start + local_step(1, p, static_cast<int>(i), start);
      if (method == "local_sgd") {
        global[i].detach().copy_((local0 + local1) / 2);
      } else {
        global[i].mutable_grad() = ((start - local0) + (start - local1)) / 2;
      }
    }
    if (method == "diloco") outer.step();
    for (const auto& t : global) want[p].push_back(t.detach().clone());
  }
  // Both groups through ReplicaManager.
  std::vector<std::vector<std::vector<at::Tensor>>> got(2);
  const auto errors = loom::testing::on_thread_ranks(2, [&](int group) {
    loom::distributed::ProcessGroups world(
        loom::testing::thread_rank_init(0, 1, loom::testing::free_port()));
    loom::config::FaultToleranceSection section;
    section.enable = true;
    section.replica_id = group;
    section.group_size = 2;
    section.min_replica_size = 2;
    section.semi_sync_method = method;
    section.sync_steps = kSyncSteps;
    section.outer_lr = kOuterLr;
    section.outer_momentum = kOuterMomentum;
    loom::train::ReplicaManager manager(section, world.world_ptr(), lighthouse.worker_address(), 0,
                                        milliseconds(20000));
    loom::train::ReplicaState state;
    for (const auto& t : initial) state.parameters.push_back(t.clone());
    for (int p = 0; p < kPeriods; ++p) {
      const int64_t first = int64_t{p} * kSyncSteps + 1, last = first + kSyncSteps - 1;
      ASSERT_TRUE(manager.starts_period(first) && manager.ends_period(last));
      ASSERT_FALSE(manager.ends_period(first));
      ASSERT_EQ(manager.start_step(first - 1, state), first - 1);
      for (size_t i = 0; i < state.parameters.size(); ++i) {
        state.parameters[i].add_(local_step(group, p, static_cast<int>(i), state.parameters[i]));
      }
      ASSERT_TRUE(manager.synchronize(state.parameters, last));
      std::vector<at::Tensor> snapshot;
      for (const auto& t : state.parameters) snapshot.push_back(t.clone());
      got[static_cast<size_t>(group)].push_back(snapshot);
    }
  });
  ASSERT_TRUE(errors.empty()) << loom::testing::joined(errors);
  for (int p = 0; p < kPeriods; ++p) {
    for (size_t i = 0; i < initial.size(); ++i) {
      const at::Tensor& a = got[0][static_cast<size_t>(p)][i];
      EXPECT_TRUE(at::equal(a, got[1][static_cast<size_t>(p)][i]))
          << method << ": the groups differ after period " << p;
      EXPECT_LE((a - want[static_cast<size_t>(p)][i]).abs().max().item<double>(), 1e-6)
          << method << ", period " << p << ", tensor " << i;
    }
  }
}

LOOM_TEST(SemiSync, LocalSgdAveragesTheGroupsParametersAtEverySync) {
  check_semi_sync("local_sgd");
}

LOOM_TEST(SemiSync, DiLoCoTakesTheNesterovOuterStepOnTheMeanPseudoGradient) {
  check_semi_sync("diloco");
}

}  // namespace

namespace {

// DiLoCo's outer step equals torch.optim.SGD(nesterov=True, momentum=mu) stepping on the
// averaged pseudo-gradients, over several periods.
LOOM_TEST(DiLoCo, OuterStepIsNesterovSgdOnTheAveragedPseudoGradients) {
  at::manual_seed(3);
  std::vector<at::Tensor> params = {at::randn({4, 3}), at::randn({5})};
  std::vector<at::Tensor> reference;
  for (const auto& p : params) reference.push_back(p.clone().requires_grad_(true));
  torch::optim::SGD sgd(reference,
                        torch::optim::SGDOptions(0.7).momentum(0.9).nesterov(true).dampening(0));
  std::vector<at::Tensor> momentum = {at::zeros({4, 3}), at::zeros({5})};
  for (int period = 0; period < 4; ++period) {
    std::vector<at::Tensor> deltas = {at::randn({4, 3}) * 0.1, at::randn({5}) * 0.1};
    loom::train::diloco_outer_step(params, deltas, momentum, 0.7, 0.9);
    for (size_t i = 0; i < reference.size(); ++i) reference[i].mutable_grad() = deltas[i].clone();
    sgd.step();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_LE((params[i] - reference[i].detach()).abs().max().item<double>(), 1e-6)
          << "period " << period << ", tensor " << i;
    }
  }
}

}  // namespace
