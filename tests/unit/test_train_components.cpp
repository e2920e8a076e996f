#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "loom/core/check.h"
#include "loom/data/synthetic.h"
#include "loom/models/loss.h"
#include "loom/models/model_spec.h"
#include "loom/models/mtp.h"
#include "loom/optim/registry.h"
#include "loom/parallel/activation_checkpoint.h"
#include "loom/parallel/grad_hooks.h"
#include "loom/train/grad_clip.h"
#include "loom/train/lr_scheduler.h"
#include "loom/train/mixed_precision.h"
#include "loom/train/step_graph.h"
#include "loom/train/step_runner.h"

using loom::train::LRSchedule;

namespace {

loom::config::LRSchedulerSection schedule(int64_t warmup, std::optional<double> decay_ratio,
                                          const std::string& type = "linear", double min_lr = 0.0) {
  loom::config::LRSchedulerSection s;
  s.warmup_steps = warmup;
  s.decay_ratio = decay_ratio;
  s.decay_type = type;
  s.min_lr_factor = min_lr;
  return s;
}

}  // namespace

TEST(LRSchedule, WarmupStableDecayLinear) {
  // 100 steps: 10 warmup, 80 decay, 11 stable (one virtual step past the end).
  LRSchedule s(schedule(10, 0.8), 100);
  EXPECT_EQ(s.warmup_steps(), 10);
  EXPECT_EQ(s.decay_steps(), 80);
  EXPECT_EQ(s.stable_steps(), 11);
  EXPECT_DOUBLE_EQ(s.factor(0), 0.1);
  EXPECT_DOUBLE_EQ(s.factor(4), 0.5);
  EXPECT_DOUBLE_EQ(s.factor(9), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(10), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(20), 1.0);
  EXPECT_NEAR(s.factor(21), 1.0 - 1.0 / 80, 1e-12);
  EXPECT_NEAR(s.factor(60), 1.0 - 40.0 / 80, 1e-12);
  EXPECT_NEAR(s.factor(99), 1.0 / 80, 1e-12);  // the last real step stays above zero
}

TEST(LRSchedule, DecayShapesAndFloor) {
  LRSchedule sqrt_s(schedule(0, std::nullopt, "sqrt"), 100);
  EXPECT_EQ(sqrt_s.decay_steps(), 100);
  EXPECT_NEAR(sqrt_s.factor(24), 1.0 - std::sqrt(24.0 / 100), 1e-12);
  LRSchedule cos_s(schedule(0, std::nullopt, "cosine", 0.1), 100);
  EXPECT_NEAR(cos_s.factor(49), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 49.0 / 100)), 1e-12);
  EXPECT_NEAR(cos_s.factor(99), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 99.0 / 100)), 1e-12);
}

TEST(LRSchedule, WarmupLongerThanTrainingIsClamped) {
  LRSchedule s(schedule(50, std::nullopt), 20);
  EXPECT_EQ(s.warmup_steps(), 20);
  EXPECT_DOUBLE_EQ(s.factor(19), 1.0);
}

// Resuming with more steps rebuilds the schedule: the warning names the keys and the learning
// rate before and after (the debug config's schedule: warmup 20, decay over 80%, lr 1e-3).
TEST(LRSchedule, ResumeNamesAScheduleChangeWithTheRatesBeforeAndAfter) {
  loom::config::JobConfig saved;
  saved.optimizer.lr = 1e-3;
  saved.lr_scheduler = schedule(20, 0.8);
  saved.training.steps = 40;
  auto current = saved;
  current.training.steps = 80;
  const auto change = loom::train::describe_schedule_change(saved, current, 40, 40);
  ASSERT_TRUE(change.has_value());
  // Old: warmup 20, decay 20 (capped): step 40 at 1e-3 * (1 - 19/20); new: decay 60.
  EXPECT_NE(change->find("training.steps 40 -> 80 changes the learning-rate schedule: lr at step "
                         "40 was 5e-05, at step 41 it is now 0.000667"),
            std::string::npos)
      << *change;
  EXPECT_NE(change->find("would give 0"), std::string::npos) << *change;
  EXPECT_NE(change->find("lr_scheduler.total_steps = 40 keeps"), std::string::npos) << *change;
  // The old length as total_steps keeps the schedule: nothing to say.
  current.lr_scheduler.total_steps = 40;
  EXPECT_FALSE(loom::train::describe_schedule_change(saved, current, 40, 40).has_value());
  // A new peak rate is a change too; a fresh run (no step under the old schedule) is not.
  current = saved;
  current.optimizer.lr = 2e-3;
  const auto lr = loom::train::describe_schedule_change(saved, current, 10, 10);
  ASSERT_TRUE(lr.has_value());
  EXPECT_NE(lr->find("optimizer.lr 0.001 -> 0.002"), std::string::npos) << *lr;
  EXPECT_FALSE(loom::train::describe_schedule_change(saved, current, 0, 0).has_value());
  EXPECT_FALSE(loom::train::describe_schedule_change(saved, saved, 40, 40).has_value());
}

TEST(GradClip, ScalesToMaxNormAndReportsTheNormBefore) {
  at::Tensor a = at::zeros({2}).set_requires_grad(true);
  at::Tensor b = at::zeros({1}).set_requires_grad(true);
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  const double norm = loom::train::clip_grad_norm({a, b}, 1.0);
  EXPECT_NEAR(norm, 5.0, 1e-6);
  const double after =
      std::sqrt(a.grad().pow(2).sum().item<double>() + b.grad().pow(2).sum().item<double>());
  EXPECT_NEAR(after, 1.0, 1e-5);
  // Below the limit: untouched.
  EXPECT_NEAR(loom::train::clip_grad_norm({a, b}, 10.0), after, 1e-6);
  EXPECT_NEAR(a.grad()[0].item<double>(), 0.6, 1e-5);
}

TEST(Loss, SumsValidTokensOnly) {
  at::Tensor logits = at::randn({2, 3, 5});
  at::Tensor labels = at::tensor({1, -100, 4, 0, 2, -100}, at::kLong).view({2, 3});
  EXPECT_EQ(loom::models::count_valid_tokens(labels), 4);
  at::Tensor logp = at::log_softmax(logits, -1);
  double expected = -(logp[0][0][1] + logp[0][2][4] + logp[1][0][0] + logp[1][1][2]).item<double>();
  EXPECT_NEAR(loom::models::cross_entropy_sum(logits, labels).item<double>(), expected, 1e-5);
}

TEST(SyntheticSource, DeterministicShiftedAndMostlyFollowingTheTable) {
  loom::data::SyntheticSource a(50, 3), b(50, 3);
  auto x = a.next(4, 16);
  auto y = b.next(4, 16);
  EXPECT_TRUE(at::equal(x.inputs, y.inputs));
  EXPECT_TRUE(at::equal(x.inputs.slice(1, 1), x.labels.slice(1, 0, 15)));
  EXPECT_GE(x.inputs.min().item<int64_t>(), 0);
  EXPECT_LT(x.inputs.max().item<int64_t>(), 50);
  EXPECT_FALSE(at::equal(a.next(4, 16).inputs, x.inputs));  // the stream moves on
}

// One stream of samples whatever the layout: 2 microbatches of 2 on one rank are the rows of 2
// ranks' 2, and a state saved on one layout resumes on the other with the same samples (they
// differed: a draw of 4 rows consumed the generator in another order than two draws of 2).
TEST(SyntheticSource, EveryLayoutSeesTheSameSamplesAndResumesOnAnother) {
  loom::data::SyntheticSource one(50, 3), rank0(50, 3, 0, 2), rank1(50, 3, 0 + 1, 2);
  for (int step = 0; step < 2; ++step) {
    const at::Tensor first = one.next(2, 8).inputs, second = one.next(2, 8).inputs;
    EXPECT_TRUE(at::equal(first, rank0.next(2, 8).inputs)) << step;
    EXPECT_TRUE(at::equal(second, rank1.next(2, 8).inputs)) << step;
  }
  loom::data::SyntheticSource resumed(50, 3, 1, 2);
  resumed.load_state(one.state());
  (void)one.next(2, 8);
  EXPECT_TRUE(at::equal(one.next(2, 8).inputs, resumed.next(2, 8).inputs));
}

TEST(ActivationCheckpoint, RecomputesInBackwardAndGivesTheSameGradients) {
  at::Tensor w = at::randn({8, 8}).set_requires_grad(true);
  int calls = 0;
  loom::parallel::CheckpointedFn fn = [&](const at::Tensor& x) {
    ++calls;
    return at::tanh(at::matmul(x, w)).pow(2);
  };
  at::Tensor x = at::randn({4, 8}).set_requires_grad(true);

  fn(x).sum().backward();
  at::Tensor plain_w = w.grad().clone(), plain_x = x.grad().clone();
  w.mutable_grad().zero_();
  x.mutable_grad().zero_();

  calls = 0;
  at::Tensor out = loom::parallel::checkpoint(fn, x, {w});
  EXPECT_EQ(calls, 1);
  out.sum().backward();
  EXPECT_EQ(calls, 2);  // really recomputed
  EXPECT_TRUE(at::allclose(w.grad(), plain_w, 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(x.grad(), plain_x, 1e-6, 1e-7));
}

// Zero-bubble pipelines split a backward: autograd::grad for the input's gradient (I), later
// backward(inputs = parameters) for the weights' (W). Through a checkpointed region I must not
// touch the weights (a nested backward would accumulate them), and W must reach them.
TEST(ActivationCheckpoint, SplitBackwardReachesOnlyTheAskedTensors) {
  at::Tensor w = at::randn({8, 8}).set_requires_grad(true);
  at::Tensor v = at::randn({8, 8}).set_requires_grad(true);
  loom::parallel::CheckpointedFn fn = [&](const at::Tensor& x) {
    return at::tanh(at::matmul(x, w)).pow(2);
  };
  at::Tensor x = at::randn({4, 8}).set_requires_grad(true);
  at::Tensor h = at::matmul(x, v);  // a parameter before the region, as an earlier block's
  fn(h).sum().backward();
  const at::Tensor plain_w = w.grad().clone(), plain_v = v.grad().clone();
  const at::Tensor plain_x = x.grad().clone();
  w.mutable_grad() = at::Tensor();
  v.mutable_grad() = at::Tensor();
  x.mutable_grad() = at::Tensor();
  int weight_hooks = 0;  // what DDP and FSDP listen to: the gradient was accumulated
  loom::parallel::add_gradient_ready_hook(w, &weight_hooks, [&] { ++weight_hooks; });

  at::Tensor out = loom::parallel::checkpoint(fn, at::matmul(x, v), {w}).sum();
  auto input_grad = torch::autograd::grad({out}, {x}, {}, /*retain_graph=*/true);  // I
  EXPECT_TRUE(at::allclose(input_grad.at(0), plain_x, 1e-6, 1e-7));
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(v.grad().defined());
  EXPECT_EQ(weight_hooks, 0);
  torch::autograd::backward({out}, {}, false, false, {w, v});  // W
  EXPECT_EQ(weight_hooks, 1);
  ASSERT_TRUE(w.grad().defined());
  ASSERT_TRUE(v.grad().defined());
  EXPECT_TRUE(at::allclose(w.grad(), plain_w, 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(v.grad(), plain_v, 1e-6, 1e-7));
  EXPECT_FALSE(x.grad().defined());
}

// A parameter the region reads but was not given would get no gradient: backward says so.
TEST(ActivationCheckpoint, AnUnlistedParameterIsAnErrorNotAMissingGradient) {
  at::Tensor w = at::randn({8, 8}).set_requires_grad(true);
  at::Tensor forgotten = at::randn({8}).set_requires_grad(true);
  loom::parallel::CheckpointedFn fn = [&](const at::Tensor& x) {
    return at::matmul(x, w) + forgotten;
  };
  at::Tensor x = at::randn({4, 8}).set_requires_grad(true);
  at::Tensor out = loom::parallel::checkpoint(fn, x, {w}).sum();
  try {
    out.backward();
    FAIL() << "backward ran without the forgotten parameter's gradient";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("not among the 1 parameters passed to checkpoint()"),
              std::string::npos)
        << e.what();
  }
}

// The recompute runs under the forward's autocast state: with CPU bf16 autocast, AC gradients
// equal no-AC gradients as closely as two no-AC runs do (here: exactly). Recomputing in float32
// would differentiate another function (differences of ~1e-2 relative).
TEST(ActivationCheckpoint, RecomputeUsesTheForwardsAutocastState) {
  auto gradients = [](const std::string& ac_mode) {
    loom::config::JobConfig config;
    config.training.seq_len = 16;
    auto model = loom::models::build_model(config, 97, at::TensorOptions().dtype(at::kFloat));
    model->init_weights(3);
    loom::config::ActivationCheckpointSection ac;
    ac.mode = ac_mode;
    model->apply_activation_checkpointing(ac);
    const at::Tensor tokens = at::arange(2 * 17).remainder(97).view({2, 17});
    {
      loom::train::AutocastGuard autocast(at::kCPU, at::kBFloat16);
      at::Tensor logits = model->forward(tokens.narrow(1, 0, 16));
      loom::models::cross_entropy_sum(logits, tokens.narrow(1, 1, 16)).backward();
    }
    std::vector<at::Tensor> grads;
    for (const auto& p : model->module().parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto plain = gradients("none");
  const auto plain_again = gradients("none");
  const auto checkpointed = gradients("full");
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    const double run_to_run = (plain[i] - plain_again[i]).abs().max().item<double>();
    const double ac_diff = (plain[i] - checkpointed[i]).abs().max().item<double>();
    EXPECT_LE(ac_diff, run_to_run + 1e-7 * plain[i].abs().max().item<double>())
        << "parameter " << i << ": AC differs by " << ac_diff << ", two runs by " << run_to_run;
  }
}

TEST(ActivationCheckpoint, BlockSelection) {
  using loom::parallel::blocks_to_checkpoint;
  EXPECT_EQ(blocks_to_checkpoint("none", "2", 4), (std::vector<bool>{false, false, false, false}));
  EXPECT_EQ(blocks_to_checkpoint("full", "2", 3), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(blocks_to_checkpoint("selective", "2", 5),
            (std::vector<bool>{false, true, false, true, false}));
  EXPECT_EQ(blocks_to_checkpoint("selective", "op", 2), (std::vector<bool>{true, true}));  // warned
  EXPECT_THROW(blocks_to_checkpoint("selective", "x", 2), loom::InputError);
  EXPECT_THROW(blocks_to_checkpoint("memory_budget", "2", 2), loom::InputError);
}

namespace {

// A step graph whose replays end only when the test says so.
class HeldReplays final : public loom::device::StepGraph {
 public:
  void run(const std::function<void()>& /*body*/) override {}
  void capture(const std::function<void()>& /*body*/) override {}
  void replay() override { ++replayed; }
  void wait_for_replays(size_t in_flight) override {
    std::unique_lock<std::mutex> lock(mutex_);
    asked.push_back(in_flight);
    released_.wait(lock, [this] { return release_; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      release_ = true;
    }
    released_.notify_all();
  }
  std::atomic<int> replayed{0};
  std::vector<size_t> asked;

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  bool release_ = false;
};

}  // namespace

// A several-rank job's replays: each is a flight-recorder entry, and the host blocks on the
// oldest one past the queue's bound as on a collective, so the collective watchdog (which reads
// longest_wait) names a replay that never ends.
TEST(ReplayQueue, TheHostWaitsOnTheOldestReplayAsOnACollective) {
  using loom::distributed::CollectiveState;
  HeldReplays graph;
  loom::distributed::FlightRecorder recorder(0, 2, 16);
  loom::train::ReplayQueue queue(graph, &recorder, {0, 1}, /*in_flight=*/1);
  queue.replay();
  EXPECT_FALSE(recorder.longest_wait().has_value()) << "one replay in flight: nobody waits";
  std::thread host([&] { queue.replay(); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!recorder.longest_wait() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto waited = recorder.longest_wait();
  graph.release();
  host.join();
  ASSERT_TRUE(waited.has_value()) << "the host blocked on a replay the recorder does not show";
  EXPECT_EQ(waited->op, "step_graph_replay");
  EXPECT_EQ(waited->group, "world/step_graph");
  EXPECT_EQ(waited->seq, 1);
  EXPECT_EQ(graph.replayed.load(), 2);
  EXPECT_EQ(graph.asked, std::vector<size_t>{1});
  const auto records = recorder.records();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].state, CollectiveState::kCompleted);
  EXPECT_EQ(records[1].state, CollectiveState::kStarted);
  EXPECT_EQ(records[1].seq, 2);
}

// Multi-token prediction's targets as the runners place them: under block_causal each depth's
// shifted tokens and labels stop at the document's end (models::mtp_targets with the batch's
// documents); causal, they run on to the row's end. Without the documents passed on, the
// block_causal case would equal the causal one.
TEST(PlaceTokens, MultiTokenTargetsStayInsideTheDocumentUnderBlockCausal) {
  const at::Tensor inputs = at::tensor({10, 11, 12, 20, 21, 22, 23}, at::kLong).view({1, 7});
  const at::Tensor labels = at::tensor({11, 12, 20, 21, 22, 23, -100}, at::kLong).view({1, 7});
  const at::Tensor documents = at::tensor({0, 0, 0, 1, 1, 1, 1}, at::kLong).view({1, 7});
  const at::Tensor positions = at::tensor({0, 1, 2, 0, 1, 2, 3}, at::kLong).view({1, 7});
  const loom::data::Batch batch{inputs, labels, documents, positions};
  const auto placed = loom::train::place_tokens(batch, /*block_causal=*/true, nullptr, 2);
  const auto want = loom::models::mtp_targets(inputs, labels, documents, 2);
  ASSERT_TRUE(placed.layout.documents.defined());
  EXPECT_TRUE(at::equal(placed.layout.mtp_tokens,
                        loom::models::depths_side_by_side({want.tokens[0], want.tokens[1]})));
  EXPECT_TRUE(at::equal(
      placed.labels, loom::models::depths_side_by_side({labels, want.labels[0], want.labels[1]})));
  const auto causal = loom::train::place_tokens(batch, /*block_causal=*/false, nullptr, 2);
  EXPECT_FALSE(causal.layout.documents.defined());
  EXPECT_FALSE(at::equal(causal.labels, placed.labels));
}
