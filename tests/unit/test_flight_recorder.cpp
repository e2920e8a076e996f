// Hang forensics: the per-rank ring buffer of collectives, its dumps on a collective timeout,
// and `loom debug hang`'s analysis naming the culprit. Ranks are threads over Gloo (loopback);
// each scenario injects one fault: a rank that skips a collective, one that sleeps, one that
// calls a different collective.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>

#include "loom/distributed/flight_recorder.h"
#include "loom/distributed/hang_report.h"
#include "loom/distributed/process_groups.h"
#include "support/process.h"

namespace {

using loom::distributed::CollectiveRecord;
using loom::distributed::CollectiveState;
using loom::distributed::FlightRecorder;
using loom::distributed::HangFinding;
using loom::distributed::ProcessGroups;

CollectiveRecord op(const std::string& name, int64_t seq) {
  CollectiveRecord r;
  r.group = "world";
  r.group_ranks = {0, 1};
  r.seq = seq;
  r.op = name;
  r.shape = {4};
  r.dtype = "Float";
  return r;
}

// Collective timeout once training started: long enough that a healthy all-reduce of 8 floats
// never hits it on a loaded 2-core machine, short enough for a fast test.
constexpr double kTimeoutS = 3.0;

bool wait_for_file(const std::string& path, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// Runs `body(rank, groups)` on `world` thread ranks whose flight recorders dump into
// <folder>/comm_traces/rank_<r>.json; collectives time out after `timeout_s` once the body
// calls use_train_timeout(). Exceptions (the expected timeouts) are swallowed: the dumps are
// what the tests read.
void run_ranks_with_recorder(int world, const std::string& folder, double timeout_s,
                             const std::function<void(int, ProcessGroups&)>& body) {
  const int port = loom::testing::free_port();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      loom::distributed::CommInit init;
      init.rank = rank;
      init.world_size = world;
      init.master_port = port;
      init.options.init_timeout = std::chrono::seconds(30);
      init.options.train_timeout =
          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
      init.trace_buffer_size = 64;
      init.trace_dump_path = folder + "/comm_traces/rank_" + std::to_string(rank) + ".json";
      try {
        ProcessGroups groups(init);
        body(rank, groups);
      } catch (const std::exception&) {
        // A rank of a hung job fails with a timeout: expected here.
      }
    });
  }
  for (auto& t : threads) t.join();
}

loom::distributed::HangReport analyze(const std::string& folder) {
  return loom::distributed::analyze_hang(loom::distributed::read_flight_dumps(folder));
}

}  // namespace

TEST(FlightRecorder, RingBufferKeepsTheLastEntriesInOrder) {
  FlightRecorder recorder(0, 2, 3);
  for (int i = 1; i <= 5; ++i) {
    const auto id = recorder.record(op("all_reduce", i));
    recorder.started(id);
    if (i < 5) recorder.completed(id);
  }
  const auto records = recorder.records();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].seq, 3);
  EXPECT_EQ(records[2].seq, 5);
  EXPECT_EQ(records[1].state, CollectiveState::kCompleted);
  EXPECT_EQ(records[2].state, CollectiveState::kStarted);
  EXPECT_GT(records[2].started_at, 0);
  EXPECT_EQ(records[2].ended_at, 0);
  recorder.completed(0);  // overwritten long ago: ignored
}

TEST(FlightRecorder, OnlyTheFirstAutomaticDumpIsWritten) {
  const std::string dir = loom::testing::fresh_temp_dir("fr_dump_once");
  FlightRecorder recorder(1, 2, 8);
  recorder.set_dump_path(dir + "/comm_traces/rank_1.json");
  recorder.record(op("all_reduce", 1));
  EXPECT_TRUE(recorder.dump("timeout", true));
  recorder.record(op("all_reduce", 2));
  EXPECT_FALSE(recorder.dump("later error", true));
  auto dumps = loom::distributed::read_flight_dumps(dir);
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_EQ(dumps[0]["reason"], "timeout");
  EXPECT_EQ(dumps[0]["entries"].size(), 1u);
  EXPECT_TRUE(recorder.dump("SIGUSR1", false));  // asked for explicitly: always written
  EXPECT_EQ(loom::distributed::read_flight_dumps(dir)[0]["entries"].size(), 2u);
}

TEST(FlightRecorder, AnalysisOfSyntheticDumps) {
  // Ranks 0-2 wait in all_gather #7 on dp_shard; rank 3's last one is #6.
  std::vector<nlohmann::json> dumps;
  for (int rank = 0; rank < 4; ++rank) {
    FlightRecorder recorder(rank, 4, 16);
    for (int seq = 1; seq <= (rank == 3 ? 6 : 7); ++seq) {
      auto r = op("all_gather_into_tensor", seq);
      r.group = "dp_shard";
      r.group_ranks = {0, 1, 2, 3};
      const auto id = recorder.record(r);
      recorder.started(id);
      if (seq < 7) recorder.completed(id);
    }
    dumps.push_back(nlohmann::json::parse(recorder.to_json("test")));
  }
  const auto report = loom::distributed::analyze_hang(dumps);
  ASSERT_EQ(report.findings.size(), 1u) << report.summary;
  const auto& f = report.findings[0];
  EXPECT_EQ(f.kind, HangFinding::Kind::kNeverEntered);
  EXPECT_EQ(f.culprits, std::vector<int>{3});
  EXPECT_EQ(f.waiting, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(f.seq, 7);
  EXPECT_NE(f.message.find("rank 3 never entered all_gather_into_tensor #7 on group 'dp_shard'; "
                           "ranks 0-2 waited in it"),
            std::string::npos)
      << f.message;
  EXPECT_EQ(loom::distributed::format_rank_ranges({7, 0, 1, 2, 4, 5, 6, 9}), "0-2,4-7,9");
}

TEST(FlightRecorder, RankThatSkipsACollectiveIsNamed) {
  const std::string dir = loom::testing::fresh_temp_dir("fr_skip");
  const int culprit = 2;
  run_ranks_with_recorder(4, dir, kTimeoutS, [&](int rank, ProcessGroups& groups) {
    at::Tensor t = at::ones({8});
    groups.world().all_reduce(t);  // #1
    groups.use_train_timeout();
    for (int i = 2; i <= 4; ++i) {
      if (rank == culprit && i == 3) continue;
      groups.world().all_reduce(t);
    }
    // The culprit went on with other work; the others wait in all_reduce #4 until it times out.
    if (rank == culprit) wait_for_file(dir + "/comm_traces/rank_2.json", 20);
  });
  const auto report = analyze(dir);
  ASSERT_FALSE(report.findings.empty()) << report.summary;
  const auto& f = report.findings[0];
  EXPECT_EQ(f.kind, HangFinding::Kind::kNeverEntered) << report.summary;
  EXPECT_EQ(f.culprits, std::vector<int>{culprit}) << report.summary;
  EXPECT_EQ(f.op, "all_reduce");
  EXPECT_EQ(f.seq, 4) << report.summary;
  EXPECT_EQ(f.waiting, (std::vector<int>{0, 1, 3}));
  EXPECT_GT(f.waited_s, kTimeoutS * 0.9);
}

TEST(FlightRecorder, RankThatSleepsIsNamed) {
  const std::string dir = loom::testing::fresh_temp_dir("fr_sleep");
  const int culprit = 1;
  run_ranks_with_recorder(4, dir, kTimeoutS, [&](int rank, ProcessGroups& groups) {
    at::Tensor t = at::ones({8});
    groups.world().all_reduce(t);  // #1
    groups.use_train_timeout();
    groups.world().all_reduce(t);  // #2
    // The sleeper dumps (asked through the store) while it sleeps, then wakes to a dead job.
    if (rank == culprit) wait_for_file(dir + "/comm_traces/rank_1.json", 20);
    groups.world().all_reduce(t);  // #3: the others wait here
  });
  const auto report = analyze(dir);
  ASSERT_FALSE(report.findings.empty()) << report.summary;
  const auto& f = report.findings[0];
  EXPECT_EQ(f.kind, HangFinding::Kind::kNeverEntered) << report.summary;
  EXPECT_EQ(f.culprits, std::vector<int>{culprit});
  EXPECT_EQ(f.seq, 3);
  EXPECT_EQ(f.waiting, (std::vector<int>{0, 2, 3}));
  ASSERT_EQ(f.details.size(), 1u);
  EXPECT_NE(f.details[0].find("last collective all_reduce #2 on group 'world' completed"),
            std::string::npos)
      << f.details[0];
}

TEST(FlightRecorder, RankThatCallsADifferentCollectiveIsNamed) {
  const std::string dir = loom::testing::fresh_temp_dir("fr_mismatch");
  const int culprit = 3;
  run_ranks_with_recorder(4, dir, kTimeoutS, [&](int rank, ProcessGroups& groups) {
    at::Tensor t = at::ones({8});
    groups.world().all_reduce(t);  // #1
    groups.use_train_timeout();
    groups.world().all_reduce(t);  // #2
    if (rank == culprit) {
      groups.world().broadcast(t, 0);  // #3, where the others all-reduce
    } else {
      groups.world().all_reduce(t);
    }
  });
  const auto report = analyze(dir);
  ASSERT_FALSE(report.findings.empty()) << report.summary;
  const auto& f = report.findings[0];
  EXPECT_EQ(f.kind, HangFinding::Kind::kMismatch) << report.summary;
  EXPECT_EQ(f.culprits, std::vector<int>{culprit});
  EXPECT_EQ(f.seq, 3);
  EXPECT_EQ(f.op, "all_reduce");
  EXPECT_EQ(f.culprit_op, "broadcast");
  EXPECT_NE(f.message.find("rank 3 called broadcast #3 [8] Float on group 'world' where ranks "
                           "0-2 called all_reduce #3 [8] Float"),
            std::string::npos)
      << f.message;
}
