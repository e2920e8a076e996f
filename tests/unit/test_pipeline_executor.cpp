// The pipeline executor on thread ranks over Gloo: tiny stages (Linear + tanh layers) split over
// 2 and 4 ranks, every schedule, against one process running the whole model on every
// microbatch: the same losses and the same gradients. The Gloo timeout turns a hang into a
// failure. float64 keeps the comparison about the schedule, not about summation order.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm_test_util.h"
#include "loom/core/check.h"
#include "loom/parallel/pipeline/executor.h"
#include "loom/parallel/pipeline/simulate.h"
#include "loom/protocols/repeated_backward.h"
#include "support/test_sets.h"

namespace {

using namespace loom::parallel::pipeline;
using loom::distributed::Collective;
using loom::distributed::ProcessGroups;
using loom::testing::run_ranks;

constexpr int64_t kDim = 6, kLayers = 8, kMicrobatchSize = 3;
const auto f64 = at::TensorOptions().dtype(at::kDouble);

struct Layer {
  at::Tensor weight, bias;
};

// Layer l's parameters from its own seed: the same on every rank, whatever the split.
Layer make_layer(int l) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + l);
  Layer layer{at::randn({kDim, kDim}, gen, f64) * 0.5, at::randn({kDim}, gen, f64) * 0.1};
  layer.weight.requires_grad_(true);
  layer.bias.requires_grad_(true);
  return layer;
}

at::Tensor run_layers(std::vector<Layer>& layers, at::Tensor x) {
  for (auto& l : layers) x = at::tanh(at::linear(x, l.weight, l.bias));
  return x;
}

at::Tensor loss_of(const at::Tensor& out, const at::Tensor& target) {
  return (out - target).pow(2).sum();
}

// The stages' boundary (microbatch x kDim doubles) and loss, as every test here runs them.
ExecutorOptions executor_options() {
  ExecutorOptions eo;
  eo.boundary_shape = {kMicrobatchSize, kDim};
  eo.boundary_dtype = at::kDouble;
  eo.loss = loss_of;
  return eo;
}

struct Batch {
  std::vector<at::Tensor> inputs, targets;
};
Batch make_batch(int microbatches) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  Batch b;
  for (int m = 0; m < microbatches; ++m) {
    b.inputs.push_back(at::randn({kMicrobatchSize, kDim}, gen, f64));
    b.targets.push_back(at::randn({kMicrobatchSize, kDim}, gen, f64));
  }
  return b;
}

class LinearStage : public PipelineStage {
 public:
  LinearStage(int64_t first, int64_t end) : first_(first) {
    for (int64_t l = first; l < end; ++l) layers_.push_back(make_layer(static_cast<int>(l)));
  }
  at::Tensor forward(const at::Tensor& input, int /*microbatch*/) override {
    return run_layers(layers_, input);
  }
  std::vector<at::Tensor> parameters() override {
    std::vector<at::Tensor> out;
    for (auto& l : layers_) {
      out.push_back(l.weight);
      out.push_back(l.bias);
    }
    return out;
  }
  const Layer& layer(int64_t global) const {
    return layers_.at(static_cast<size_t>(global - first_));
  }

 private:
  int64_t first_;
  std::vector<Layer> layers_;
};

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  LOOM_CHECK(got.defined(), what, ": no value");
  const double err = (got - want).abs().max().item<double>();
  const double scale = std::max(1.0, want.abs().max().item<double>());
  LOOM_CHECK(err <= 1e-6 * scale, what, ": differs by ", err);
}

void run_case(ScheduleKind kind, int pp, int v, int microbatches) {
  const Schedule schedule = make_schedule(kind, pp, v, microbatches);
  const int stages = schedule.stages();
  ASSERT_EQ(kLayers % stages, 0);
  const Batch batch = make_batch(microbatches);
  // The number of activation and gradient messages this schedule sends, from its action lists.
  std::vector<uint64_t> expected_sends(static_cast<size_t>(pp), 0);
  for (int r = 0; r < pp; ++r) {
    for (const auto& a : schedule.actions[r]) {
      expected_sends[r] += a.type == ActionType::kSendF || a.type == ActionType::kSendB;
    }
  }
  loom::distributed::CommOptions options;
  options.train_timeout = std::chrono::seconds(30);
  auto errors = run_ranks(
      pp,
      [&](ProcessGroups& groups) {
        const int rank = groups.rank();
        std::vector<std::unique_ptr<LinearStage>> owned;
        std::map<int, PipelineStage*> mine;
        const int64_t per_stage = kLayers / stages;
        for (int s : schedule.stages_of_rank(rank)) {
          owned.push_back(std::make_unique<LinearStage>(s * per_stage, (s + 1) * per_stage));
          mine[s] = owned.back().get();
        }
        const ExecutorOptions eo = executor_options();
        PipelineExecutor executor(schedule, rank, mine, groups.world(), eo);
        groups.world().counters().reset();
        StepResult result = executor.run_step(batch.inputs, batch.targets);

        // One process, the whole model, every microbatch, one backward.
        std::vector<Layer> reference;
        for (int l = 0; l < kLayers; ++l) reference.push_back(make_layer(l));
        at::Tensor total = at::zeros({}, f64);
        std::vector<at::Tensor> reference_losses;
        for (int m = 0; m < microbatches; ++m) {
          at::Tensor loss = loss_of(run_layers(reference, batch.inputs[m]), batch.targets[m]);
          reference_losses.push_back(loss.detach());
          total = total + loss;
        }
        total.backward();

        if (schedule.rank_of_stage(stages - 1) == rank) {
          LOOM_CHECK(result.losses.size() == static_cast<size_t>(microbatches), "losses");
          for (int m = 0; m < microbatches; ++m) {
            expect_close(result.losses[m], reference_losses[m], "loss " + std::to_string(m));
          }
        } else {
          LOOM_CHECK(result.losses.empty(), "losses off the last stage");
        }
        for (size_t i = 0; i < owned.size(); ++i) {
          const int s = schedule.stages_of_rank(rank)[i];
          for (int64_t l = s * per_stage; l < (s + 1) * per_stage; ++l) {
            const auto& got = owned[i]->layer(l);
            const auto name = "layer " + std::to_string(l);
            expect_close(got.weight.grad(), reference[l].weight.grad(), name + " weight grad");
            expect_close(got.bias.grad(), reference[l].bias.grad(), name + " bias grad");
          }
        }
        const auto& counters = groups.world().counters();
        const uint64_t message = kMicrobatchSize * kDim * sizeof(double);
        LOOM_CHECK(counters[Collective::kSend].calls == expected_sends[rank], "send calls ",
                   counters[Collective::kSend].calls.load());
        LOOM_CHECK(counters[Collective::kSend].wire_bytes == expected_sends[rank] * message,
                   "send bytes");
        LOOM_CHECK(result.stats.computes ==
                       static_cast<int64_t>(std::count_if(
                           schedule.actions[rank].begin(), schedule.actions[rank].end(),
                           [](const Action& a) { return a.is_compute(); })),
                   "compute count");
        LOOM_CHECK(result.stats.wait_seconds >= 0 && result.stats.compute_seconds > 0, "stats");
      },
      options);
  LOOM_EXPECT_RANKS_OK(errors);
}

// I computes no weight gradient and W does, later: the weights' gradient hooks fire only in W
// (2 ranks, zero bubble, each W of a microbatch well after its I).
TEST(PipelineExecutor, WeightGradientsAreDeferredToW) {
  const Schedule schedule = make_schedule(ScheduleKind::kInterleavedZeroBubble, 2, 1, 4);
  const Batch batch = make_batch(4);
  auto errors = run_ranks(2, [&](ProcessGroups& groups) {
    const int rank = groups.rank();
    LinearStage stage(rank * kLayers / 2, (rank + 1) * kLayers / 2);
    int weight_grads = 0;  // gradient hooks fired on this stage's weights
    for (auto& p : stage.parameters()) {
      p.register_hook([&weight_grads](const at::Tensor& g) {
        ++weight_grads;
        return g;
      });
    }
    const int per_w = static_cast<int>(stage.parameters().size());
    int expected = 0, inputs = 0, weights = 0;
    ExecutorOptions eo = executor_options();
    std::vector<std::string> seen;
    eo.before_action = [&](const Action& a) { seen.push_back(to_string(a)); };
    eo.after_action = [&](const Action& a) {
      // A compute's before comes right before its after; a batch's befores all come first.
      LOOM_CHECK(a.is_communication() || (!seen.empty() && seen.back() == to_string(a)),
                 "after_action without its before_action: ", to_string(a));
      if (a.type == ActionType::kBackwardWeight) {
        expected += per_w;
        ++weights;
      }
      inputs += a.type == ActionType::kBackwardInput;
      LOOM_CHECK(weight_grads == expected, "after ", to_string(a), ": ", weight_grads,
                 " weight gradients computed, expected ", expected);
    };
    PipelineExecutor executor(schedule, rank, {{rank, &stage}}, groups.world(), eo);
    executor.run_step(batch.inputs, batch.targets);
    LOOM_CHECK(inputs == 4 && weights == 4, "I and W per microbatch");
    LOOM_CHECK(seen.size() == schedule.actions[rank].size(), "before_action on every action");
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

// A stage whose backward the schedule splits (I, then W through one graph) runs its forwards in
// a RepeatedBackwardScope, so that they save nothing a first pass destroys (the fused
// cross-entropy keeps its logits); a stage with whole backwards (1F1B) does not.
TEST(PipelineExecutor, SplitBackwardStagesForwardInARepeatedBackwardScope) {
  for (const auto& [kind, split] : {std::pair{ScheduleKind::kInterleavedZeroBubble, true},
                                    std::pair{ScheduleKind::k1F1B, false}}) {
    const Schedule schedule = make_schedule(kind, 2, 1, 4);
    const Batch batch = make_batch(4);
    auto errors = run_ranks(2, [&, split = split](ProcessGroups& groups) {
      const int rank = groups.rank();
      LinearStage stage(rank * kLayers / 2, (rank + 1) * kLayers / 2);
      ExecutorOptions eo = executor_options();
      int losses = 0;
      eo.loss = [&](const at::Tensor& out, const at::Tensor& target) {
        LOOM_CHECK(loom::protocols::backward_may_repeat() == split, schedule.name);
        ++losses;
        return loss_of(out, target);
      };
      PipelineExecutor executor(schedule, rank, {{rank, &stage}}, groups.world(), eo);
      executor.run_step(batch.inputs, batch.targets);
      LOOM_CHECK(losses == (rank == 1 ? 4 : 0), losses, " losses on rank ", rank);
      LOOM_CHECK(!loom::protocols::backward_may_repeat(), "the scope outlived the forward");
    });
    LOOM_EXPECT_RANKS_OK(errors);
  }
}

// A stage that takes a fixed time: `forward_ms` in its forward, twice that in its backward
// (F = 1, B = I + W = 2 slots, `loom plan schedule`'s default costs). Sleeping, not computing,
// so that the timing does not depend on how busy the machine's cores are.
struct Delay : torch::autograd::Function<Delay> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t forward_ms) {
    ctx->saved_data["ms"] = forward_ms;
    std::this_thread::sleep_for(std::chrono::milliseconds(forward_ms));
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 const torch::autograd::variable_list& grads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * ctx->saved_data["ms"].toInt()));
    return {grads[0], at::Tensor()};
  }
};

class DelayStage : public PipelineStage {
 public:
  explicit DelayStage(int64_t forward_ms)
      : forward_ms_(forward_ms), scale_(at::ones({1}, f64).requires_grad_(true)) {}
  at::Tensor forward(const at::Tensor& input, int /*microbatch*/) override {
    return Delay::apply(input * scale_, forward_ms_);
  }
  std::vector<at::Tensor> parameters() override { return {scale_}; }

 private:
  int64_t forward_ms_;
  at::Tensor scale_;
};

// The bubble measured from the executor's times (busy: compute; the step: the slowest rank's
// pass) over 2 steps of stages of equal cost, beside the simulator's for the same schedule.
double measured_bubble(const Schedule& schedule, int64_t forward_ms_per_stage) {
  const int pp = schedule.pp;
  std::vector<double> busy(static_cast<size_t>(pp)), pass(static_cast<size_t>(pp));
  const Batch batch = make_batch(schedule.microbatches);
  auto errors = run_ranks(pp, [&](ProcessGroups& groups) {
    const int rank = groups.rank();
    std::vector<std::unique_ptr<DelayStage>> owned;
    std::map<int, PipelineStage*> mine;
    for (int s : schedule.stages_of_rank(rank)) {
      owned.push_back(std::make_unique<DelayStage>(forward_ms_per_stage));
      mine[s] = owned.back().get();
    }
    const ExecutorOptions eo = executor_options();
    PipelineExecutor executor(schedule, rank, mine, groups.world(), eo);
    for (int step = 0; step < 2; ++step) {
      const auto stats = executor.run_step(batch.inputs, batch.targets).stats;
      busy[static_cast<size_t>(rank)] += stats.compute_seconds;
      pass[static_cast<size_t>(rank)] += stats.pass_seconds;
      groups.world().barrier();  // each step starts together, as the trainer's collectives do
    }
  });
  LOOM_EXPECT_RANKS_OK(errors);
  return bubble_fraction(busy, *std::max_element(pass.begin(), pass.end()));
}

// pp_bubble_pct and `loom plan schedule` share one definition (bubble_fraction), and the
// executor achieves what the schedule promises: 1F1B's (P-1)/M = 0.25 and interleaving's
// (P-1)/(VM) = 0.125 for P = 2, M = 4, measured on stages of equal, sleeping cost. A wall-clock
// measurement: on a machine running four tests on two cores interleaving measured 0.215, so it
// runs in the slow label (on a quiet machine).
LOOM_SLOW_TEST(PipelineExecutor, MeasuredBubbleMatchesTheSimulatedOne) {
  const Schedule one_f_one_b = make_schedule(ScheduleKind::k1F1B, 2, 1, 4);
  const Schedule interleaved = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4);
  const double want_1f1b = simulate(one_f_one_b).bubble_fraction();
  const double want_interleaved = simulate(interleaved).bubble_fraction();
  EXPECT_DOUBLE_EQ(want_1f1b, 0.25);
  EXPECT_DOUBLE_EQ(want_interleaved, 0.125);
  // The same work per rank: one stage of 30 ms, or two of 15 ms (long enough that the
  // milliseconds a loaded machine adds to sleeps and messages stay small beside them).
  const double got_1f1b = measured_bubble(one_f_one_b, 30);
  const double got_interleaved = measured_bubble(interleaved, 15);
  std::printf(
      "[pp bubble] 1F1B measured %.3f (simulated %.3f); Interleaved1F1B measured %.3f "
      "(simulated %.3f)\n",
      got_1f1b, want_1f1b, got_interleaved, want_interleaved);
  // Sleeps overshoot and messages take time: a few percent on top (0.005-0.015 measured on a
  // loaded 2-core machine), never the other schedule's. Waiting for receives when posted
  // measured 0.257 for both schedules.
  EXPECT_NEAR(got_1f1b, want_1f1b, 0.08);
  EXPECT_NEAR(got_interleaved, want_interleaved, 0.08);
  EXPECT_LT(got_interleaved, got_1f1b - 0.05);
}

struct Case {
  ScheduleKind kind;
  int pp, v, microbatches;
};

class PipelineExecutorSchedules : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineExecutorSchedules, MatchesOneProcess) {
  const Case c = GetParam();
  run_case(c.kind, c.pp, c.v, c.microbatches);
}

INSTANTIATE_TEST_SUITE_P(
    GlooRanks, PipelineExecutorSchedules,
    ::testing::Values(Case{ScheduleKind::kGPipe, 2, 1, 4}, Case{ScheduleKind::k1F1B, 2, 1, 4},
                      Case{ScheduleKind::kInterleaved1F1B, 2, 2, 4},
                      Case{ScheduleKind::kInterleavedZeroBubble, 2, 1, 4},
                      Case{ScheduleKind::kInterleavedZeroBubble, 2, 2, 4},
                      Case{ScheduleKind::kGPipe, 4, 1, 4}, Case{ScheduleKind::k1F1B, 4, 1, 8},
                      Case{ScheduleKind::kInterleaved1F1B, 4, 2, 8},
                      Case{ScheduleKind::kInterleavedZeroBubble, 4, 1, 4},
                      Case{ScheduleKind::kInterleavedZeroBubble, 4, 2, 8},
                      // One rank, two local stages: hand-offs without communication.
                      Case{ScheduleKind::kInterleaved1F1B, 1, 2, 2}),
    [](const ::testing::TestParamInfo<Case>& param_info) {
      const Case& c = param_info.param;
      return to_string(c.kind) + "_pp" + std::to_string(c.pp) + "_v" + std::to_string(c.v) + "_m" +
             std::to_string(c.microbatches);
    });

}  // namespace
