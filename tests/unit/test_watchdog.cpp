// The collective watchdog: a collective this rank has blocked on past the train timeout (+
// grace) is reported once, naming the collective; armed only after training starts; async
// collectives nobody waits for, and completed ones, are no hang. The last test runs it on real
// Gloo ranks (threads), with the watchdog set to fire before Gloo's own timeout.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "loom/distributed/process_groups.h"
#include "loom/distributed/watchdog.h"
#include "support/process.h"

namespace {
namespace test_watchdog {  // its own names in a unity batch

using loom::distributed::CollectiveRecord;
using loom::distributed::CollectiveWatchdog;
using loom::distributed::FlightRecorder;
using loom::distributed::HangInfo;
using namespace std::chrono_literals;

CollectiveRecord op(const std::string& name, int64_t seq) {
  CollectiveRecord r;
  r.group = "world";
  r.group_ranks = {0, 1};
  r.seq = seq;
  r.op = name;
  return r;
}

struct Fired {
  std::mutex mutex;
  std::vector<HangInfo> hangs;
  size_t count() {
    std::lock_guard<std::mutex> lock(mutex);
    return hangs.size();
  }
};

bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

TEST(CollectiveWatchdog, NamesTheCollectiveBlockedPastTheTimeoutOnce) {
  auto recorder = std::make_shared<FlightRecorder>(0, 2, 16);
  Fired fired;
  CollectiveWatchdog watchdog(
      recorder,
      [&](const HangInfo& hang) {
        std::lock_guard<std::mutex> lock(fired.mutex);
        fired.hangs.push_back(hang);
      },
      10ms);
  const auto done = recorder->record(op("broadcast", 2));
  recorder->waiting(done);
  recorder->completed(done);
  recorder->record(op("all_gather_into_tensor", 3));  // async, never waited for: no hang
  const auto stuck = recorder->record(op("all_reduce", 4));
  recorder->started(stuck);
  recorder->waiting(stuck);
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(fired.count(), 0u) << "not armed yet (the rendezvous has its own timeout)";
  watchdog.arm(50ms, 50ms);
  ASSERT_TRUE(wait_until([&] { return fired.count() > 0; }, 5s));
  std::this_thread::sleep_for(100ms);
  ASSERT_EQ(fired.count(), 1u) << "one report per hang";
  EXPECT_TRUE(watchdog.fired());
  const HangInfo& hang = fired.hangs[0];
  EXPECT_EQ(hang.collective.op, "all_reduce");
  EXPECT_EQ(hang.collective.seq, 4);
  EXPECT_GE(hang.waited_s, 0.1);
  EXPECT_NE(hang.message.find("all_reduce #4 on group 'world' (ranks 0-1) has blocked rank 0"),
            std::string::npos)
      << hang.message;
  EXPECT_NE(hang.message.find("comm.train_timeout_seconds"), std::string::npos) << hang.message;
}

TEST(CollectiveWatchdog, CompletedCollectivesAreNoHang) {
  auto recorder = std::make_shared<FlightRecorder>(0, 2, 4);
  Fired fired;
  CollectiveWatchdog watchdog(
      recorder, [&](const HangInfo&) { fired.hangs.emplace_back(); }, 10ms);
  watchdog.arm(20ms, 0ms);
  for (int i = 1; i <= 10; ++i) {  // more than the ring holds
    const auto id = recorder->record(op("all_reduce", i));
    recorder->waiting(id);
    recorder->completed(id);
  }
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(watchdog.fired());
  EXPECT_FALSE(recorder->longest_wait().has_value());
}

// Two Gloo ranks: rank 1 stays out of an all-reduce until rank 0's watchdog reported it (set to
// fire 1 s in, before Gloo's 6 s timeout); then it joins and both finish.
TEST(CollectiveWatchdog, FiresOnARealGlooCollectiveBeforeTheBackendTimesOut) {
  const int port = loom::testing::free_port();
  std::atomic<bool> fired{false};
  std::string message;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      loom::distributed::CommInit init;
      init.rank = rank;
      init.world_size = 2;
      init.master_port = port;
      init.options.init_timeout = 30s;
      init.options.train_timeout = 6s;
      init.trace_buffer_size = 16;
      init.collective_watchdog = true;
      init.watchdog_grace = -5s;  // fire at 1 s, while Gloo would still wait
      init.on_hang = [&](const HangInfo& hang) {
        message = hang.message;
        fired = true;
      };
      loom::distributed::ProcessGroups groups(init);
      at::Tensor t = at::ones({8});
      groups.world().all_reduce(t);
      groups.use_train_timeout();
      if (rank == 1) wait_until([&] { return fired.load(); }, 20s);
      groups.world().all_reduce(t);
      EXPECT_EQ(t[0].item<float>(), 4.0f);
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(fired.load());
  EXPECT_NE(message.find("all_reduce #2 on group 'world' (ranks 0-1) has blocked rank 0"),
            std::string::npos)
      << message;
}

// The default action, as `loom train` uses it: the hang is logged with the collective named and
// the process ends with kCollectiveHangExitCode (the launcher then restarts the group).
TEST(CollectiveWatchdogDeathTest, DefaultActionNamesTheCollectiveAndEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto recorder = std::make_shared<FlightRecorder>(3, 4, 8);
        const auto id = recorder->record(op("reduce_scatter_tensor", 9));
        recorder->waiting(id);
        CollectiveWatchdog watchdog(recorder, nullptr, 10ms);
        watchdog.arm(10ms, 0ms);
        std::this_thread::sleep_for(20s);
        std::exit(0);
      },
      ::testing::ExitedWithCode(loom::distributed::kCollectiveHangExitCode),
      "watchdog: reduce_scatter_tensor #9 on group 'world' \\(ranks 0-1\\) has blocked rank 3");
}

}  // namespace test_watchdog
}  // namespace
