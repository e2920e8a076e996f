// Pipeline schedules as data: the generators' bubble against the closed forms, the validator on
// broken schedules (each check fails on its own mistake), CSV round trips and bad files.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loom/core/check.h"
#include "loom/parallel/pipeline/schedule.h"
#include "loom/parallel/pipeline/simulate.h"
#include "support/errors.h"

namespace {

using namespace loom::parallel::pipeline;
using loom::InputError;

using loom::testing::input_error_of;

double bubble(ScheduleKind kind, int pp, int v, int m) {
  return simulate(make_schedule(kind, pp, v, m)).bubble_fraction();
}

// Megatron's bubble time fraction with F = 1 and B = 2 slots: (P-1)/M without virtual stages,
// (P-1)/(V·M) with V of them.
TEST(PipelineSchedule, GPipeAnd1F1BBubbleIsPMinus1OverM) {
  for (int pp : {2, 3, 4, 8}) {
    for (int m : {pp, pp + 1, 2 * pp, 3 * pp, 4 * pp + 3}) {
      const double expected = static_cast<double>(pp - 1) / m;
      EXPECT_NEAR(bubble(ScheduleKind::kGPipe, pp, 1, m), expected, 1e-12) << pp << " " << m;
      EXPECT_NEAR(bubble(ScheduleKind::k1F1B, pp, 1, m), expected, 1e-12) << pp << " " << m;
    }
  }
  EXPECT_NEAR(bubble(ScheduleKind::kGPipe, 4, 1, 1), 3.0, 1e-12);  // GPipe runs 1 microbatch
}

TEST(PipelineSchedule, InterleavedBubbleIsPMinus1OverVM) {
  for (int pp : {2, 3, 4, 8}) {
    for (int v : {2, 3, 4}) {
      for (int m : {pp, 2 * pp, 3 * pp, 4 * pp}) {
        EXPECT_NEAR(bubble(ScheduleKind::kInterleaved1F1B, pp, v, m),
                    static_cast<double>(pp - 1) / (v * m), 1e-12)
            << pp << " " << v << " " << m;
      }
    }
  }
}

TEST(PipelineSchedule, ZeroBubbleBeats1F1BAndInterleaved) {
  for (int pp : {2, 3, 4, 8}) {
    for (int m : {pp, 2 * pp, 4 * pp}) {
      const double one_f_one_b = bubble(ScheduleKind::k1F1B, pp, 1, m);
      const double zb_h1 = bubble(ScheduleKind::kInterleavedZeroBubble, pp, 1, m);
      EXPECT_LT(zb_h1, one_f_one_b) << pp << " " << m;
      // ZB-H1's bubble is (P-1)(F + I - W): 1/3 of 1F1B's (P-1)(F + I + W) when all are 1 slot.
      EXPECT_NEAR(zb_h1, one_f_one_b / 3, 1e-12) << pp << " " << m;
      for (int v : {2, 3}) {
        const double zb = bubble(ScheduleKind::kInterleavedZeroBubble, pp, v, m);
        const double interleaved = bubble(ScheduleKind::kInterleaved1F1B, pp, v, m);
        EXPECT_LT(zb, interleaved) << pp << " " << v << " " << m;
        EXPECT_NEAR(zb, interleaved / 3, 1e-12) << pp << " " << v << " " << m;
      }
    }
  }
}

TEST(PipelineSchedule, ZeroBubbleSplitsEveryBackward) {
  const Schedule s = make_schedule(ScheduleKind::kInterleavedZeroBubble, 4, 2, 8);
  int inputs = 0, weights = 0;
  for (const auto& list : s.actions) {
    for (const auto& a : list) {
      EXPECT_NE(a.type, ActionType::kFullBackward);
      inputs += a.type == ActionType::kBackwardInput;
      weights += a.type == ActionType::kBackwardWeight;
    }
  }
  EXPECT_EQ(inputs, 8 * 8);
  EXPECT_EQ(weights, 8 * 8);
}

// 1F1B keeps at most pp - rank microbatches between forward and backward (its memory bound,
// which the memory estimate reads through peak_live_activations); GPipe keeps all of them, and
// zero bubble's deferred W's keep theirs until W.
TEST(PipelineSchedule, OneFOneBInFlightBound) {
  const Schedule s = make_schedule(ScheduleKind::k1F1B, 4, 1, 12);
  for (int r = 0; r < 4; ++r) {
    int in_flight = 0, peak = 0;
    for (const auto& a : s.actions[r]) {
      if (a.type == ActionType::kForward) peak = std::max(peak, ++in_flight);
      if (a.type == ActionType::kFullBackward) --in_flight;
    }
    EXPECT_EQ(peak, 4 - r);
    EXPECT_EQ(peak_live_activations(s, r), 4 - r);
  }
  EXPECT_EQ(peak_live_activations(make_schedule(ScheduleKind::kGPipe, 4, 1, 12), 3), 12);
  const Schedule zb = make_schedule(ScheduleKind::kInterleavedZeroBubble, 4, 1, 8);
  EXPECT_GT(peak_live_activations(zb, 3), 1);  // its W's come after later forwards
}

TEST(PipelineSchedule, MicrobatchCountsTooSmallNameTheKeys) {
  auto e = input_error_of([] { make_schedule(ScheduleKind::k1F1B, 4, 1, 3); });
  EXPECT_NE(e.find("at least 4 microbatches"), std::string::npos) << e;
  EXPECT_NE(e.find("parallelism.pipeline_parallel_microbatch_size"), std::string::npos) << e;
  e = input_error_of([] { make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 6); });
  EXPECT_NE(e.find("multiple of it, got 6"), std::string::npos) << e;
  e = input_error_of([] { make_schedule(ScheduleKind::k1F1B, 2, 2, 4); });
  EXPECT_NE(e.find("one stage per rank"), std::string::npos) << e;
  e = input_error_of([] { parse_schedule_kind("ZBVZeroBubble"); });
  EXPECT_NE(e.find("parallelism.pipeline_parallel_schedule"), std::string::npos) << e;
  EXPECT_EQ(parse_schedule_kind("interleaved1f1b"), ScheduleKind::kInterleaved1F1B);
}

TEST(PipelineSchedule, ActionStrings) {
  for (ActionType t : {ActionType::kForward, ActionType::kBackwardInput,
                       ActionType::kBackwardWeight, ActionType::kFullBackward, ActionType::kSendF,
                       ActionType::kRecvF, ActionType::kSendB, ActionType::kRecvB}) {
    const Action a{12, t, 345};
    EXPECT_EQ(parse_action(to_string(a), "test"), a) << to_string(a);
  }
  EXPECT_EQ(to_string(Action{1, ActionType::kRecvB, 2}), "1RECV_B2");
  for (const char* bad : {"", "F1", "1F", "1X2", "1F2x", "1SEND2", "-1F2", "1 F2"}) {
    EXPECT_NE(input_error_of([&] { parse_action(bad, "file.csv:3 column 2"); }).find("file.csv:3"),
              std::string::npos)
        << bad;
  }
}

// Each check of the validator, on a schedule broken in exactly that way.
Schedule two_rank_gpipe() {
  return make_schedule(ScheduleKind::kGPipe, 2, 1, 2);
}

std::vector<Action>::iterator find(Schedule& s, int rank, const std::string& action) {
  auto& list = s.actions[static_cast<size_t>(rank)];
  auto it = std::find(list.begin(), list.end(), parse_action(action, "test"));
  EXPECT_NE(it, list.end()) << action;
  return it;
}

TEST(PipelineValidator, AcceptsEveryGeneratedSchedule) {
  for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B,
                    ScheduleKind::kInterleavedZeroBubble}) {
    for (int pp : {1, 2, 3, 5}) {
      for (int v : {1, 2, 3}) {
        if (is_single_stage(kind) && v > 1) continue;
        for (int m : {pp, 2 * pp, 5 * pp}) {
          EXPECT_NO_THROW(validate_schedule(make_schedule(kind, pp, v, m)))
              << to_string(kind) << " " << pp << " " << v << " " << m;
        }
      }
    }
  }
}

TEST(PipelineValidator, MissingAndDuplicatedComputes) {
  Schedule s = two_rank_gpipe();
  s.actions[0].erase(find(s, 0, "0B1"));
  EXPECT_NE(input_error_of([&] { validate_schedule(s); }).find("stage 0 microbatch 1 has 0 full"),
            std::string::npos);
  s = two_rank_gpipe();
  s.actions[0].push_back(parse_action("0F1", "test"));
  EXPECT_NE(input_error_of([&] { validate_schedule(s); }).find("forwarded 2 times"),
            std::string::npos);
}

TEST(PipelineValidator, DependenciesAndOwnership) {
  Schedule s = two_rank_gpipe();
  std::iter_swap(find(s, 1, "1RECV_F0"), find(s, 1, "1F0"));  // forward before its input
  EXPECT_NE(input_error_of([&] { validate_schedule(s); }).find("(1F0): its input has not arrived"),
            std::string::npos);
  s = two_rank_gpipe();
  *find(s, 0, "0F0") = parse_action("1F0", "test");
  EXPECT_NE(input_error_of([&] { validate_schedule(s); }).find("runs on rank 1"),
            std::string::npos);
  s = make_schedule(ScheduleKind::kInterleavedZeroBubble, 1, 1, 2);
  auto w = find(s, 0, "0W0");
  Action moved = *w;
  s.actions[0].erase(w);
  s.actions[0].insert(s.actions[0].begin() + 1, moved);  // W right after F0, before I0
  EXPECT_NE(input_error_of([&] { validate_schedule(s); }).find("needs the input gradient"),
            std::string::npos);
}

TEST(PipelineValidator, MessagesOutOfOrder) {
  Schedule s = make_schedule(ScheduleKind::kGPipe, 2, 1, 3);
  std::iter_swap(find(s, 1, "1RECV_F1"), find(s, 1, "1RECV_F2"));
  std::iter_swap(find(s, 1, "1F1"), find(s, 1, "1F2"));
  const auto e = input_error_of([&] { validate_schedule(s); });
  EXPECT_NE(e.find("matched in order"), std::string::npos) << e;
}

TEST(PipelineValidator, Deadlock) {
  // Rank 0 sends microbatch 1 only after the gradient of 0; rank 1 sends that gradient only after
  // it has received microbatch 1.
  Schedule s;
  s.pp = 2;
  s.microbatches = 2;
  for (const char* a :
       {"0F0", "0SEND_F0", "0F1", "0RECV_B0", "0B0", "0SEND_F1", "0RECV_B1", "0B1"}) {
    s.actions.resize(2);
    s.actions[0].push_back(parse_action(a, "test"));
  }
  for (const char* a :
       {"1RECV_F0", "1F0", "1RECV_F1", "1F1", "1B0", "1SEND_B0", "1B1", "1SEND_B1"}) {
    s.actions[1].push_back(parse_action(a, "test"));
  }
  const auto e = input_error_of([&] { validate_schedule(s); });
  EXPECT_NE(e.find("deadlocks"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 0 waits at 0RECV_B0"), std::string::npos) << e;
}

// Why the communication is placed in lockstep: with "receive right before the compute, send right
// after", interleaved 1F1B's batches wait for each other around the ring of ranks under the
// coalesced (rendezvous) semantics of NCCL groups. The validator must see that deadlock.
TEST(PipelineValidator, NaivePlacementOfInterleavedDeadlocks) {
  Schedule s = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4);
  const int last = s.stages() - 1;
  for (int r = 0; r < s.pp; ++r) {
    std::vector<Action> naive;
    auto remote = [&](int stage) { return s.rank_of_stage(stage) != r; };
    for (const Action& a : s.actions[r]) {
      if (a.is_communication()) continue;
      const bool grad = a.type == ActionType::kFullBackward;
      if (a.type == ActionType::kForward && a.stage > 0 && remote(a.stage - 1)) {
        naive.push_back({a.stage, ActionType::kRecvF, a.microbatch});
      }
      if (grad && a.stage < last && remote(a.stage + 1)) {
        naive.push_back({a.stage, ActionType::kRecvB, a.microbatch});
      }
      naive.push_back(a);
      if (a.type == ActionType::kForward && a.stage < last && remote(a.stage + 1)) {
        naive.push_back({a.stage, ActionType::kSendF, a.microbatch});
      }
      if (grad && a.stage > 0 && remote(a.stage - 1)) {
        naive.push_back({a.stage, ActionType::kSendB, a.microbatch});
      }
    }
    s.actions[r] = naive;
  }
  const auto e = input_error_of([&] { validate_schedule(s); });
  EXPECT_NE(e.find("deadlocks"), std::string::npos) << e;
}

TEST(PipelineValidator, CommunicationPlacementPairsBatches) {
  // Every batch of a generated schedule pairs with batches its peers post at the same step, so
  // a rank's k-th batch with a peer meets that peer's matching batch; checked by the simulator's
  // rendezvous semantics for every schedule, and here for its shape on a small case.
  const Schedule s = make_schedule(ScheduleKind::k1F1B, 2, 1, 2);
  std::vector<std::string> r0, r1;
  for (const auto& a : s.actions[0]) r0.push_back(to_string(a));
  for (const auto& a : s.actions[1]) r1.push_back(to_string(a));
  EXPECT_EQ(r0, (std::vector<std::string>{"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0",
                                          "0RECV_B1", "0B1"}));
  // Rank 0's F1 (step 1) travels at the end of step 1, while rank 1 runs F0.
  EXPECT_EQ(r1, (std::vector<std::string>{"1RECV_F0", "1F0", "1RECV_F1", "1B0", "1SEND_B0", "1F1",
                                          "1B1", "1SEND_B1"}));
}

class PipelineCsv : public ::testing::Test {
 protected:
  std::filesystem::path dir_ =
      std::filesystem::temp_directory_path() / ("loom_pp_csv_" + std::to_string(::getpid()));
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const auto path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
};

TEST_F(PipelineCsv, RoundTripKeepsEveryAction) {
  for (auto kind : {ScheduleKind::k1F1B, ScheduleKind::kInterleavedZeroBubble}) {
    const Schedule s = make_schedule(kind, 3, kind == ScheduleKind::k1F1B ? 1 : 2, 6);
    const auto path = (dir_ / "s.csv").string();
    save_schedule_csv(s, path);
    const Schedule back = load_schedule_csv(path);
    EXPECT_EQ(back.actions, s.actions);
    EXPECT_EQ(back.pp, 3);
    EXPECT_EQ(back.stages_per_rank, s.stages_per_rank);
    EXPECT_EQ(back.microbatches, 6);
  }
}

TEST_F(PipelineCsv, ComputeOnlyFileGetsCommunication) {
  // torch's compute-only form, with blank cells for idle slots.
  const auto path = write("gpipe.csv", "0F0,0F1,,0B0,0B1\n,1F0,1F1,1B0,1B1\n");
  const Schedule s = load_schedule_csv(path);
  const double b = simulate(s).bubble_fraction();
  EXPECT_NEAR(b, 0.5, 1e-12);  // GPipe's (P-1)/M
  EXPECT_NE(std::find(s.actions[0].begin(), s.actions[0].end(), Action{0, ActionType::kSendF, 1}),
            s.actions[0].end());
}

TEST_F(PipelineCsv, BadFilesNameTheFileAndCell) {
  auto e = input_error_of([&] { load_schedule_csv(write("bad.csv", "0F0,0B0\n1F0,1Q0\n")); });
  EXPECT_NE(e.find("bad.csv:2 column 2"), std::string::npos) << e;
  EXPECT_NE(e.find("pipeline_parallel_schedule_csv"), std::string::npos) << e;
  e = input_error_of(
      [&] { load_schedule_csv(write("missing.csv", "0F0,0F1,0B0\n1F0,1F1,1B0,1B1\n")); });
  EXPECT_NE(e.find("stage 0 microbatch 1 has 0 full"), std::string::npos) << e;
  EXPECT_NE(e.find("missing.csv"), std::string::npos) << e;
  e = input_error_of([&] { load_schedule_csv((dir_ / "none.csv").string()); });
  EXPECT_NE(e.find("none.csv': No such file"), std::string::npos) << e;
  // A FIFO where the file is expected is refused before it is opened (opening would block).
  const std::string fifo = (dir_ / "fifo.csv").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  e = input_error_of([&] { load_schedule_csv(fifo); });
  EXPECT_NE(e.find("fifo.csv' is a FIFO (named pipe), not a regular file"), std::string::npos) << e;
  e = input_error_of([&] { load_schedule_csv(write("empty.csv", "\n")); });
  EXPECT_NE(e.find("holds no actions"), std::string::npos) << e;
  // Found by fuzz_schedule_csv: one action naming stage 66666660 and microbatch 81 sized the
  // dependency tables by their product (an int overflow, then 5.5e9 entries).
  e = input_error_of([&] { load_schedule_csv(write("huge.csv", "66666660F81\n")); });
  EXPECT_NE(e.find("(5466666202 pairs) but lists 1 actions"), std::string::npos) << e;
  EXPECT_NE(e.find("huge.csv"), std::string::npos) << e;
}

TEST(PipelineTimeline, PrintsARowPerRankAndTheBubble) {
  const Schedule s = make_schedule(ScheduleKind::k1F1B, 2, 1, 2);
  const std::string text = format_timeline(s, simulate(s));
  EXPECT_NE(text.find("rank 0  | F0 F1 .  .  B0 B0 .  B1 B1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1  | .  F0 B0 B0 F1 B1 B1 .  .\n"), std::string::npos) << text;
  EXPECT_NE(text.find("bubble fraction (idle / busy): 0.5000"), std::string::npos) << text;
}

}  // namespace
