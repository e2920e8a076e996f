// The pipeline runner over parts parallelized by the real Llama parallelize function, on thread
// ranks: pp 2 x dp_shard 2 (FSDP per stage), pp 2 x dp_replicate 2 (DDP) and pp 2 x tp 2, two
// passes of gradient accumulation, against the whole model in one process. Checks the loss,
// every parameter's gradient box, and FSDP's traffic under PP: each unit gathered once per step
// and reduced once (the units stay gathered across microbatches and passes, the reduce-scatter
// waits for the stage's last backward), nothing unsharded left afterwards. And the forward-only
// evaluation.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>

#include "comm_test_util.h"
#include "loom/core/check.h"
#include "loom/distributed/runtime.h"
#include "loom/models/loss.h"
#include "loom/models/model_spec.h"
#include "loom/parallel/fsdp.h"
#include "loom/parallel/pipeline/model_parts.h"
#include "loom/parallel/pipeline/runner.h"
#include "loom/parallel/placement.h"
#include "support/jobs.h"

namespace loom {
namespace {
namespace test_pipeline_runner {  // its own names in a unity batch

constexpr int64_t kSeq = 16, kVocab = 512;
constexpr uint64_t kSeed = 5;

// pp 2 under `schedule`, with the other degrees of a testing::Layout.
struct Layout : testing::Layout {
  std::string schedule;
  Layout(std::string schedule_name, int shard = 1, int tensor = 1, int replicate = 1)
      : schedule(std::move(schedule_name)) {
    pp = 2;
    dp_shard = shard;
    tp = tensor;
    dp_replicate = replicate;
  }
  int dp() const { return dp_shard * dp_replicate; }
};

config::JobConfig job(const Layout& l) {
  config::JobConfig c;  // llama3 debugmodel: dim 256, 6 blocks
  c.training.seq_len = kSeq;
  c.training.local_batch_size = 4;
  c.parallelism.pipeline_parallel_schedule = l.schedule;
  c.parallelism.pipeline_parallel_microbatch_size = 2;
  return testing::with_layout(c, l);
}

// Two passes of 4 rows per data-parallel rank: [passes x dp x 4, seq + 1] tokens.
at::Tensor token_batch(int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  return at::randint(0, kVocab, {rows, kSeq + 1}, gen, at::kLong);
}

struct Reference {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
  double eval_sum = 0;  // summed token loss of the first 4 rows, no gradient
};

Reference reference(const Layout& l, const at::Tensor& batch) {
  auto model = models::build_model(job(l), kVocab, at::TensorOptions().dtype(at::kFloat));
  model->init_weights(kSeed);
  const double tokens = static_cast<double>(batch.size(0) * kSeq);
  at::Tensor loss = models::cross_entropy_sum(model->forward(batch.narrow(1, 0, kSeq)),
                                              batch.narrow(1, 1, kSeq)) /
                    tokens;
  loss.backward();
  Reference ref;
  ref.loss = loss.item<double>();
  for (const auto& p : model->module().named_parameters()) ref.grads[p.key()] = p.value().grad();
  at::NoGradGuard no_grad;
  const at::Tensor rows = batch.narrow(0, 0, 4);
  ref.eval_sum =
      models::cross_entropy_sum(model->forward(rows.narrow(1, 0, kSeq)), rows.narrow(1, 1, kSeq))
          .item<double>();
  return ref;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const double err = (got - want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  LOOM_CHECK(err <= 1e-5 * scale + 1e-8, what, ": differs by ", err, " (scale ", scale, ")");
}

void run_layout(const Layout& l) {
  const int passes = 2;
  const at::Tensor batch = token_batch(passes * l.dp() * 4);
  const Reference ref = reference(l, batch);
  const int world = l.world();
  const int port = testing::free_port();
  const auto errors = testing::on_thread_ranks(world, [&](int rank) {
    const auto config = job(l);
    auto runtime = distributed::ParallelRuntime::for_world(
        config, testing::thread_rank_world(rank, world, port));
    const auto plan = parallel::pipeline::plan_pipeline(config, 6);
    const auto pp_rank = runtime->mesh().group_rank(distributed::MeshGroup::pp, rank);
    std::vector<std::unique_ptr<models::CausalLM>> parts;
    for (const auto& part : plan.split.parts_of_rank(static_cast<int>(pp_rank))) {
      parts.push_back(models::build_model(config, kVocab, at::TensorOptions().device(at::kMeta),
                                          parallel::pipeline::to_model_part(part)));
    }
    const auto& spec = models::find_model_spec(config.model.name);
    parallel::ParallelContext context{config, *runtime, at::kCPU, kSeed, at::kFloat, {}};
    parallel::ParallelModel pm = spec.parallelize(std::move(parts), context);
    parallel::pipeline::PipelineRunnerOptions options;
    options.boundary_shape = pm.boundary_shape;
    options.boundary_dtype = pm.boundary_dtype;
    options.forward = [](models::CausalLM& part, const at::Tensor& x,
                         const models::TokenLayout& layout) { return part.forward(x, layout); };
    options.loss_sum = pm.loss;
    std::vector<models::CausalLM*> raw;
    for (auto& part : pm.parts) raw.push_back(part.get());
    parallel::pipeline::PipelineRunner runner(plan, static_cast<int>(pp_rank), raw, pm.part_syncs,
                                              runtime->group_ptr(distributed::MeshGroup::pp),
                                              options);
    const int64_t dp_rank = runtime->dp_rank();
    const double tokens = static_cast<double>(batch.size(0) * kSeq);
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (int pass = 0; pass < passes; ++pass) {
      const at::Tensor rows = batch.narrow(0, (dp_rank * passes + pass) * 4, 4);
      loss += runner
                  .train_pass(rows.narrow(1, 0, kSeq), rows.narrow(1, 1, kSeq), tokens,
                              pass + 1 == passes)
                  .to(at::kDouble);
    }
    pm.gradient_sync->finish();
    auto& loss_group = runtime->group(distributed::MeshGroup::loss);
    if (loss_group.size() > 1) loss_group.all_reduce(loss);
    runner.group().all_reduce(loss);
    LOOM_CHECK(std::abs(loss.item<double>() - ref.loss) <= 1e-5 * ref.loss, "loss ",
               loss.item<double>(), " vs ", ref.loss);
    for (const auto& p : pm.parameters) {
      LOOM_CHECK(p.tensor.grad().defined(), p.name, " has no gradient");
      expect_close(p.tensor.grad(), parallel::local_view(ref.grads.at(p.name), p.placement),
                   "gradient of " + p.name + " (" + p.placement.describe() + ")");
    }
    for (const auto& wrapper : pm.wrappers) {
      auto* fsdp = dynamic_cast<parallel::FullyShardedDataParallel*>(wrapper.get());
      if (fsdp == nullptr) continue;
      const auto units = static_cast<int64_t>(fsdp->num_units());
      LOOM_CHECK(fsdp->stats().all_gathers == units, fsdp->stats().all_gathers, " all-gathers for ",
                 units, " units: gathered again between microbatches");
      LOOM_CHECK(fsdp->stats().reduce_scatters == units, fsdp->stats().reduce_scatters,
                 " reduce-scatters for ", units, " units");
      LOOM_CHECK(fsdp->unsharded_gradient_bytes() == 0, "unsharded gradients left over");
    }
    LOOM_CHECK(runner.take_stats().computes > 0, "the runner counted no compute");
    // Evaluation: every pp rank gets the summed loss of the batch.
    const at::Tensor rows = batch.narrow(0, 0, 4);
    const double eval =
        runner.eval_sum(rows.narrow(1, 0, kSeq), rows.narrow(1, 1, kSeq)).item<double>();
    LOOM_CHECK(std::abs(eval - ref.eval_sum) <= 1e-5 * ref.eval_sum, "eval ", eval, " vs ",
               ref.eval_sum);
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

TEST(PipelineRunner, OneFOneBWithFsdpPerStageMatchesOneProcess) {
  run_layout({"1F1B", 2, 1});
}

// W-split backward under FSDP: the weight gradients arrive in W, which arms the reduction.
TEST(PipelineRunner, ZeroBubbleWithFsdpPerStageMatchesOneProcess) {
  run_layout({"InterleavedZeroBubble", 2, 1});
}

// DDP per stage: its buckets reduce on the stage's last backward of the step.
TEST(PipelineRunner, OneFOneBWithDdpPerStageMatchesOneProcess) {
  run_layout({"1F1B", 1, 1, 2});
}

// Sequence-parallel activations cross the stages ([rows, seq / tp, dim]).
TEST(PipelineRunner, InterleavedWithTensorParallelMatchesOneProcess) {
  run_layout({"Interleaved1F1B", 1, 2});
}

}  // namespace test_pipeline_runner
}  // namespace
}  // namespace loom
