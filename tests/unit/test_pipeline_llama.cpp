// The pipeline pieces on the real model: the debug Llama split by split_stages into parts built
// with models::ModelPart, run by the executor on 2 thread ranks over Gloo, against the whole
// model in one process (same seed, same microbatches): the same losses and gradients.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "comm_test_util.h"
#include "loom/core/check.h"
#include "loom/models/model_spec.h"
#include "loom/parallel/pipeline/executor.h"
#include "loom/parallel/pipeline/model_parts.h"
#include "loom/parallel/pipeline/stage_split.h"

namespace {
namespace test_pipeline_llama {  // its own names in a unity batch

using namespace loom::parallel::pipeline;
using loom::distributed::ProcessGroups;
using loom::testing::run_ranks;

constexpr int64_t kSeq = 16, kMicrobatchSize = 2;
constexpr uint64_t kSeed = 42;

loom::config::JobConfig debug_config(int pp, const std::string& schedule) {
  loom::config::JobConfig c;
  c.model.flavor = "debugmodel";
  c.training.seq_len = kSeq;
  c.parallelism.pipeline_parallel_degree = pp;
  c.parallelism.pipeline_parallel_schedule = schedule;
  return c;
}

std::unique_ptr<loom::models::CausalLM> build(const loom::config::JobConfig& c,
                                              const StagePart& part) {
  auto model =
      loom::models::build_model(c, 0, at::TensorOptions().dtype(at::kFloat), to_model_part(part));
  model->init_weights(kSeed);
  model->init_buffers(at::kCPU);
  return model;
}

class CausalLMStage : public PipelineStage {
 public:
  explicit CausalLMStage(std::unique_ptr<loom::models::CausalLM> model)
      : model_(std::move(model)) {}
  at::Tensor forward(const at::Tensor& input, int /*microbatch*/) override {
    return model_->forward(input);
  }
  std::vector<at::Tensor> parameters() override { return model_->module().parameters(); }
  loom::models::CausalLM& model() { return *model_; }

 private:
  std::unique_ptr<loom::models::CausalLM> model_;
};

std::map<std::string, at::Tensor> grads_of(loom::models::CausalLM& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.module().named_parameters()) out[p.key()] = p.value().grad();
  return out;
}

void run_llama(int pp, const std::string& schedule_name, int microbatches) {
  const auto config = debug_config(pp, schedule_name);
  const StageSplit split = split_stages(config.parallelism, 6);
  const Schedule schedule =
      make_schedule(parse_schedule_kind(schedule_name), pp, split.stages_per_rank, microbatches);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t vocab = build(config, StagePart{0, 0, 6, true, true})->vocab_size();
  std::vector<at::Tensor> tokens, targets;
  for (int m = 0; m < microbatches; ++m) {
    tokens.push_back(at::randint(vocab, {kMicrobatchSize, kSeq}, gen, at::kLong));
    targets.push_back(at::randint(vocab, {kMicrobatchSize, kSeq}, gen, at::kLong));
  }
  const double tokens_per_step = static_cast<double>(microbatches * kMicrobatchSize * kSeq);
  auto loss = [tokens_per_step](const at::Tensor& logits, const at::Tensor& target) {
    return at::cross_entropy_loss(logits.flatten(0, 1), target.flatten(), {}, at::Reduction::Sum) /
           tokens_per_step;
  };
  loom::distributed::CommOptions options;
  options.train_timeout = std::chrono::seconds(60);
  auto errors = run_ranks(
      pp,
      [&](ProcessGroups& groups) {
        const int rank = groups.rank();
        std::vector<std::unique_ptr<CausalLMStage>> owned;
        std::map<int, PipelineStage*> mine;
        for (const auto& part : split.parts_of_rank(rank)) {
          owned.push_back(std::make_unique<CausalLMStage>(build(config, part)));
          mine[part.stage] = owned.back().get();
        }
        ExecutorOptions eo;
        eo.boundary_shape = {kMicrobatchSize, kSeq, 256};
        eo.loss = loss;
        PipelineExecutor executor(schedule, rank, mine, groups.world(), eo);
        const StepResult result = executor.run_step(tokens, targets);

        auto whole = build(config, StagePart{0, 0, 6, true, true});
        at::Tensor total = at::zeros({});
        std::vector<double> reference_losses;
        for (int m = 0; m < microbatches; ++m) {
          at::Tensor l = loss(whole->forward(tokens[m]), targets[m]);
          reference_losses.push_back(l.item<double>());
          total = total + l;
        }
        total.backward();
        const auto reference = grads_of(*whole);
        if (schedule.rank_of_stage(schedule.stages() - 1) == rank) {
          for (int m = 0; m < microbatches; ++m) {
            const double got = result.losses.at(m).item<double>();
            LOOM_CHECK(std::abs(got - reference_losses[m]) <= 1e-5 * std::abs(reference_losses[m]),
                       "loss ", m, ": ", got, " vs ", reference_losses[m]);
          }
        }
        std::set<std::string> seen;
        for (auto& stage : owned) {
          for (const auto& [name, grad] : grads_of(stage->model())) {
            LOOM_CHECK(grad.defined(), name, " has no gradient");
            const at::Tensor& want = reference.at(name);
            const double err = (grad - want).abs().max().item<double>();
            const double scale = want.abs().max().item<double>();
            LOOM_CHECK(err <= 1e-5 * scale + 1e-9, name, ": gradient differs by ", err, " (scale ",
                       scale, ")");
            seen.insert(name);
          }
        }
        LOOM_CHECK(!seen.empty(), "rank ", rank, " checked no parameter");
      },
      options);
  LOOM_EXPECT_RANKS_OK(errors);
}

// The parts of every split hold each parameter of the whole model exactly once, with its global
// name (meta device: nothing allocated).
TEST(PipelineLlama, PartsCoverTheModelOnce) {
  int checked = 0;
  for (int pp : {1, 2, 3}) {
    for (const char* schedule : {"1F1B", "Interleaved1F1B"}) {
      const auto config = debug_config(pp, schedule);
      StageSplit split;
      try {
        split = split_stages(config.parallelism, 6);
      } catch (const loom::InputError&) {
        continue;
      }
      const auto meta = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
      std::multiset<std::string> names;
      for (const auto& part : split.stages) {
        auto model = loom::models::build_model(config, 0, meta, to_model_part(part));
        EXPECT_EQ(model->hookable_modules(), part.modules()) << pp << " " << schedule;
        for (const auto& p : model->module().named_parameters()) names.insert(p.key());
      }
      auto whole = loom::models::build_model(config, 0, meta);
      std::multiset<std::string> expected;
      for (const auto& p : whole->module().named_parameters()) expected.insert(p.key());
      EXPECT_EQ(names, expected) << pp << " " << schedule;
      EXPECT_EQ(names.size(), 3u + 9u * 6u);  // embedding, norm, output + 9 per block
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6);
}

TEST(PipelineLlama, OneFOneBOnTwoRanksMatchesOneProcess) {
  run_llama(2, "1F1B", 4);
}
TEST(PipelineLlama, InterleavedOnTwoRanksMatchesOneProcess) {
  run_llama(2, "Interleaved1F1B", 4);
}
TEST(PipelineLlama, ZeroBubbleOnTwoRanksMatchesOneProcess) {
  run_llama(2, "InterleavedZeroBubble", 4);
}

}  // namespace test_pipeline_llama
}  // namespace
