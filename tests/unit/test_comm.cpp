// Every collective of loom's Comm on 2 and 4 CPU ranks over Gloo, with exact expected values,
// natively and through the fallbacks; sub-groups; byte counters; timeouts and dead peers.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "comm_test_util.h"
#include "loom/distributed/comm.h"

namespace loom {
namespace {

using distributed::Collective;
using distributed::Comm;
using distributed::ProcessGroups;
using distributed::ReduceOp;
using testing::run_ranks;

const auto f32 = at::TensorOptions().dtype(at::kFloat);

at::Tensor arange(int64_t n, double start = 0) {
  return at::arange(start, start + n, f32);
}

// Checks inside rank threads throw, so the failure names the rank and the collective.
void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (!at::equal(got, want)) {
    LOOM_THROW(InternalError, what, ": got ", got, " want ", want);
  }
}

void check_all_reduce(Comm& c) {
  const int n = c.size(), r = c.rank();
  const double tri = n * (n + 1) / 2.0;
  at::Tensor t = at::tensor({1.0f, 2.0f}, f32) * (r + 1);
  c.all_reduce(t, ReduceOp::kSum);
  expect_equal(t, at::tensor({1.0f, 2.0f}, f32) * tri, "all_reduce sum");
  t = at::tensor({1.0f, 2.0f}, f32) * (r + 1);
  c.all_reduce(t, ReduceOp::kAvg);
  expect_equal(t, at::tensor({1.0f, 2.0f}, f32) * (tri / n), "all_reduce avg");
  t = at::tensor({1.0f, -1.0f}, f32) * (r + 1);
  c.all_reduce(t, ReduceOp::kMax);
  expect_equal(t, at::tensor({1.0f * n, -1.0f}, f32), "all_reduce max");
  t = at::tensor({1.0f, -1.0f}, f32) * (r + 1);
  c.all_reduce(t, ReduceOp::kMin);
  expect_equal(t, at::tensor({1.0f, -1.0f * n}, f32), "all_reduce min");
  at::Tensor count = at::full({1}, static_cast<int64_t>(r + 1), at::kLong);
  c.all_reduce(count, ReduceOp::kSum);
  expect_equal(count, at::full({1}, static_cast<int64_t>(tri), at::kLong), "all_reduce int64 sum");
}

void check_all_gather(Comm& c) {
  const int n = c.size(), r = c.rank();
  at::Tensor in = arange(3, 10.0 * r).view({3, 1});
  at::Tensor out = at::zeros({3 * n, 1}, f32);
  c.all_gather_into_tensor(out, in);
  std::vector<at::Tensor> parts;
  for (int k = 0; k < n; ++k) parts.push_back(arange(3, 10.0 * k).view({3, 1}));
  expect_equal(out, at::cat(parts), "all_gather_into_tensor");
}

void check_reduce_scatter(Comm& c) {
  const int n = c.size(), r = c.rank();
  // in[i] = 100 * rank + i; rank r receives the reduction of elements [2r, 2r + 2).
  at::Tensor in = arange(2 * n, 100.0 * r);
  at::Tensor out = at::zeros({2}, f32);
  c.reduce_scatter_tensor(out, in, ReduceOp::kSum);
  const double base = 100.0 * n * (n - 1) / 2;
  expect_equal(out, at::tensor({base + n * 2.0 * r, base + n * (2.0 * r + 1)}, f32),
               "reduce_scatter_tensor sum");
  c.reduce_scatter_tensor(out, in, ReduceOp::kAvg);
  expect_equal(out, at::tensor({(base + n * 2.0 * r) / n, (base + n * (2.0 * r + 1)) / n}, f32),
               "reduce_scatter_tensor avg");
  c.reduce_scatter_tensor(out, in, ReduceOp::kMax);
  expect_equal(out, at::tensor({100.0 * (n - 1) + 2 * r, 100.0 * (n - 1) + 2 * r + 1}, f32),
               "reduce_scatter_tensor max");
}

void check_broadcast_and_all_to_all(Comm& c) {
  const int n = c.size(), r = c.rank();
  at::Tensor t = r == n - 1 ? arange(4, 7) : at::zeros({4}, f32);
  c.broadcast(t, n - 1);
  expect_equal(t, arange(4, 7), "broadcast from the last rank");

  // Even: in[j] = 10 * rank + j (two per peer); rank r gets chunk r of everyone.
  at::Tensor in = arange(2 * n, 10.0 * r);
  at::Tensor out = at::zeros({2 * n}, f32);
  c.all_to_all_single(out, in);
  std::vector<at::Tensor> want;
  for (int k = 0; k < n; ++k) want.push_back(arange(2, 10.0 * k + 2 * r));
  expect_equal(out, at::cat(want), "all_to_all_single even");

  // Uneven: rank r sends (j + 1) rows to rank j, each row's value 100 * r + j.
  std::vector<int64_t> in_splits, out_splits;
  std::vector<at::Tensor> rows;
  for (int j = 0; j < n; ++j) {
    in_splits.push_back(j + 1);
    out_splits.push_back(r + 1);
    rows.push_back(at::full({j + 1}, 100.0 * r + j, f32));
  }
  at::Tensor uneven_out = at::zeros({n * (r + 1)}, f32);
  c.all_to_all_single(uneven_out, at::cat(rows), out_splits, in_splits);
  std::vector<at::Tensor> expected;
  for (int k = 0; k < n; ++k) expected.push_back(at::full({r + 1}, 100.0 * k + r, f32));
  expect_equal(uneven_out, at::cat(expected), "all_to_all_single uneven");
}

void check_send_recv_and_async(Comm& c) {
  const int n = c.size(), r = c.rank();
  at::Tensor message = at::full({3}, static_cast<float>(r), f32);
  at::Tensor received = at::zeros({3}, f32);
  auto works = c.batch_send_recv({{distributed::P2POp::Kind::kSend, message, (r + 1) % n},
                                  {distributed::P2POp::Kind::kRecv, received, (r + n - 1) % n}});
  for (auto& w : works) w.wait();
  expect_equal(received, at::full({3}, static_cast<float>((r + n - 1) % n), f32), "send/recv ring");

  at::Tensor a = at::ones({1024}, f32);
  auto work = c.all_reduce(a, ReduceOp::kSum, /*async_op=*/true);
  work.wait();
  work.wait();  // harmless
  LOOM_CHECK(work.completed(), "async all_reduce not completed after wait");
  expect_equal(a, at::full({1024}, static_cast<float>(n), f32), "async all_reduce");
  c.barrier();
}

void check_everything(Comm& c) {
  check_all_reduce(c);
  check_all_gather(c);
  check_reduce_scatter(c);
  check_broadcast_and_all_to_all(c);
  check_send_recv_and_async(c);
}

// Native collectives; tensor-form ones replaced by all-to-all and gathers into views; and
// every fallback at once (reduce-scatter by all-reduce, all-to-all by send/recv pairs).
enum class Path { kNative, kAllToAll, kNoCollectives };

class CommCollectives : public ::testing::TestWithParam<std::tuple<int, Path>> {};

TEST_P(CommCollectives, ExactValues) {
  const auto [world, path] = GetParam();
  distributed::CommOptions options;
  if (path == Path::kNative) {
    options.gloo_reduce_scatter_by_all_to_all = false;  // Gloo's own reduce_scatter
  } else {
    options.capabilities = {false, false, false, path == Path::kAllToAll};
  }
  auto errors = run_ranks(
      world, [&](ProcessGroups& groups) { check_everything(groups.world()); }, options);
  LOOM_EXPECT_RANKS_OK(errors);
}

std::string path_test_name(const ::testing::TestParamInfo<std::tuple<int, Path>>& param_info) {
  const char* names[] = {"Native", "AllToAllFallbacks", "AllFallbacks"};
  return std::to_string(std::get<0>(param_info.param)) + "ranks" +
         names[static_cast<int>(std::get<1>(param_info.param))];
}

INSTANTIATE_TEST_SUITE_P(GlooRanks, CommCollectives,
                         ::testing::Combine(::testing::Values(2, 4),
                                            ::testing::Values(Path::kNative, Path::kAllToAll,
                                                              Path::kNoCollectives)),
                         path_test_name);

TEST(Comm, SingleRankPathIsLocal) {
  auto c = Comm::single("solo");
  at::Tensor t = arange(4);
  c->all_reduce(t, ReduceOp::kAvg);
  EXPECT_TRUE(at::equal(t, arange(4)));
  at::Tensor out = at::zeros({4}, f32);
  c->all_gather_into_tensor(out, arange(4));
  EXPECT_TRUE(at::equal(out, arange(4)));
  c->reduce_scatter_tensor(out, arange(4, 1));
  EXPECT_TRUE(at::equal(out, arange(4, 1)));
  c->barrier();
  EXPECT_EQ(c->counters().total_wire_bytes(), 0u);
  EXPECT_EQ(c->counters()[Collective::kAllReduce].calls, 1u);
}

TEST(Comm, CountersFollowTheRingFormulas) {
  auto errors = run_ranks(4, [](ProcessGroups& groups) {
    Comm& c = groups.world();
    c.counters().reset();
    at::Tensor t = at::zeros({1024}, f32);  // 4 KiB
    c.all_reduce(t);
    at::Tensor gathered = at::zeros({4096}, f32);
    c.all_gather_into_tensor(gathered, t);  // 16 KiB gathered
    c.reduce_scatter_tensor(t, gathered);   // 16 KiB scattered
    const auto& k = c.counters();
    LOOM_CHECK(k[Collective::kAllReduce].wire_bytes == 2 * 4096 * 3 / 4, "all_reduce bytes");
    LOOM_CHECK(k[Collective::kAllGather].wire_bytes == 16384 * 3 / 4, "all_gather bytes");
    LOOM_CHECK(k[Collective::kReduceScatter].wire_bytes == 16384 * 3 / 4, "reduce_scatter bytes");
    LOOM_CHECK(k[Collective::kReduceScatter].payload_bytes == 16384, "payload bytes");
    LOOM_CHECK(groups.total_wire_bytes() == 6144 + 12288 + 12288, "total over groups");
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

// A finished collective's buffers are freed where the step waits for it, not later by Gloo's
// worker thread (Work::Impl::settle_on_wait): once wait() returns, the tensors a collective took
// are held by the caller alone, and its internal buffers are gone. Held by the work instead, a
// step's late frees moved HSDP's peak RSS up at random steps (docs/performance.md). 200 rounds
// of each: the worker is still holding on in a few percent of waits under load.
TEST(Comm, WaitLeavesTheCollectivesTensorsToTheCaller) {
  auto errors = run_ranks(2, [](ProcessGroups& groups) {
    Comm& c = groups.world();
    for (int round = 0; round < 200; ++round) {
      at::Tensor sum = at::ones({4096}, f32);
      at::Tensor shard = at::ones({4096}, f32);
      at::Tensor gathered = at::zeros({8192}, f32);
      at::Tensor full = at::ones({8192}, f32);
      at::Tensor scattered = at::zeros({4096}, f32);
      auto reduce = c.all_reduce(sum, ReduceOp::kSum, /*async_op=*/true);
      auto gather = c.all_gather_into_tensor(gathered, shard, /*async_op=*/true);
      auto scatter = c.reduce_scatter_tensor(scattered, full, ReduceOp::kSum, true);
      reduce.wait();
      gather.wait();
      scatter.wait();
      for (const auto* t : {&sum, &shard, &gathered, &full, &scattered}) {
        LOOM_CHECK(t->use_count() == 1 && t->storage().use_count() == 1, "round ", round,
                   ": a tensor of a finished collective is still held by ", t->use_count() - 1,
                   " other reference(s), its storage by ", t->storage().use_count() - 1);
      }
    }
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

TEST(Comm, SubGroupsReduceWithinTheirMembers) {
  auto errors = run_ranks(4, [](ProcessGroups& groups) {
    const int r = groups.rank();
    // Pairs {0,1},{2,3} and strided {0,2},{1,3}, as a 2x2 mesh makes them.
    auto pair = groups.new_group("pair", r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3});
    auto stride =
        groups.new_group("stride", r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3});
    at::Tensor t = at::full({1}, static_cast<float>(r), f32);
    pair->all_reduce(t);
    expect_equal(t, at::full({1}, r < 2 ? 1.0f : 5.0f, f32), "pair sum");
    t.fill_(r);
    stride->all_reduce(t);
    expect_equal(t, at::full({1}, r % 2 == 0 ? 2.0f : 4.0f, f32), "stride sum");
    LOOM_CHECK(pair->rank() == r % 2 && stride->rank() == r / 2, "group ranks");
    LOOM_CHECK(groups.new_group("world-again", {0, 1, 2, 3}).get() == &groups.world(),
               "the world's rank list is the world group");
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

TEST(Comm, PeerThatNeverJoinsTimesOutWithTheCollectiveNamed) {
  distributed::CommOptions options;
  options.init_timeout = std::chrono::seconds(2);
  options.train_timeout = std::chrono::seconds(1);
  const auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks(
      2,
      [](ProcessGroups& groups) {
        groups.use_train_timeout();
        if (groups.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(3));  // never calls the collective
          return;
        }
        at::Tensor t = at::ones({4}, f32);
        groups.world().all_reduce(t);
      },
      options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(errors.size(), 1u) << testing::joined(errors);
  EXPECT_NE(errors[0].find("rank 0: all_reduce on group 'world'"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("timeout 1 s from comm.train_timeout_seconds"), std::string::npos)
      << errors[0];
  EXPECT_LT(seconds, 30);
}

TEST(Comm, RendezvousWithoutPeersFailsAfterTheInitTimeout) {
  distributed::CommOptions options;
  options.init_timeout = std::chrono::seconds(1);
  const int port = testing::free_port();
  try {
    ProcessGroups groups(testing::thread_rank_init(0, 2, port, options));
    FAIL() << "rendezvous with a missing rank succeeded";
  } catch (const distributed::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rendezvous at 127.0.0.1:" + std::to_string(port)),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom
