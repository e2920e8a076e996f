#include "loom/train/step_runner.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/models/mtp.h"
#include "loom/parallel/context_parallel.h"
#include "loom/parallel/pipeline/runner.h"
#include "loom/parallel/pipeline/simulate.h"
#include "loom/train/mixed_precision.h"

namespace loom::train {
namespace {

// Rows [start, start + count) of a batch.
data::Batch batch_rows(const data::Batch& batch, int64_t start, int64_t count) {
  const auto rows = [&](const at::Tensor& t) {
    return t.defined() ? t.narrow(0, start, count) : t;
  };
  return {rows(batch.inputs), rows(batch.labels), rows(batch.documents), rows(batch.positions)};
}

// The whole model on this rank (data and tensor parallel wrappers inside it).
class LocalStepRunner final : public StepRunner {
 public:
  LocalStepRunner(parallel::ParallelModel& model, const at::Device& device, bool block_causal,
                  int64_t microbatch_rows)
      : model_(model),
        device_(device),
        block_causal_(block_causal),
        microbatch_rows_(std::max<int64_t>(microbatch_rows, 1)) {}

  at::Tensor train_microbatch(const data::Batch& batch, double valid_tokens, bool last) override {
    return train(batch, last, [valid_tokens](const at::Tensor& sum) { return sum / valid_tokens; });
  }

  // A float32 count divides a float32 loss sum exactly as the double does (the kernels divide in
  // float32 either way).
  at::Tensor train_microbatch_counted_on_device(const data::Batch& batch,
                                                const at::Tensor& valid_tokens,
                                                bool last) override {
    return train(batch, last,
                 [&valid_tokens](const at::Tensor& sum) { return sum / valid_tokens; });
  }

  // A validation batch larger than the training microbatch runs as forwards of microbatch size
  // (as the pipeline runner does): validation never needs more activation memory than a training
  // step, and its buffers are the sizes the allocator already keeps for training, so a run's peak
  // memory does not step up at a validation. The sum of token losses does not depend on the split.
  at::Tensor eval_sum(const data::Batch& batch) override {
    const int64_t rows = batch.inputs.size(0);
    at::Tensor total;
    for (int64_t start = 0; start < rows; start += microbatch_rows_) {
      const auto tokens =
          place_tokens(batch_rows(batch, start, std::min(microbatch_rows_, rows - start)),
                       block_causal_, model_.context.get());
      AutocastGuard autocast(device_.type(), model_.autocast);
      at::Tensor sum =
          model_.loss(model_.parts.front()->forward(tokens.inputs.to(device_), tokens.layout),
                      tokens.labels.to(device_));
      total = total.defined() ? total + sum : sum;
    }
    return total;
  }

  at::Tensor complete_losses(at::Tensor losses, metrics::StepMetrics* /*window*/) override {
    return losses;
  }

 private:
  template <typename Normalize>
  at::Tensor train(const data::Batch& batch, bool last, const Normalize& normalize) {
    model_.gradient_sync->prepare_microbatch(last);
    const auto tokens = place_tokens(batch, block_causal_, model_.context.get(), model_.mtp_depths);
    at::Tensor loss;
    {
      AutocastGuard autocast(device_.type(), model_.autocast);
      at::Tensor output = model_.parts.front()->forward(tokens.inputs.to(device_), tokens.layout);
      loss = normalize(model_.loss(output, tokens.labels.to(device_)));
    }
    loss.backward();
    return loss.detach();
  }

  parallel::ParallelModel& model_;
  at::Device device_;
  bool block_causal_;
  int64_t microbatch_rows_;
};

// The rank's stages under the pipeline schedule: the schedule runs backward and arms each stage's
// gradient sync on its own last backward.
class PipelineStepRunner final : public StepRunner {
 public:
  PipelineStepRunner(std::unique_ptr<parallel::pipeline::PipelineRunner> runner,
                     parallel::ParallelModel& model, const at::Device& device, bool block_causal)
      : runner_(std::move(runner)), model_(model), device_(device), block_causal_(block_causal) {}

  at::Tensor train_microbatch(const data::Batch& batch, double valid_tokens, bool last) override {
    const auto tokens = place_tokens(batch, block_causal_, model_.context.get(), model_.mtp_depths);
    return runner_->train_pass(tokens.inputs.to(device_), tokens.labels.to(device_), valid_tokens,
                               last, tokens.layout);
  }

  at::Tensor eval_sum(const data::Batch& batch) override {
    const auto tokens = place_tokens(batch, block_causal_, model_.context.get());
    return runner_->eval_sum(tokens.inputs.to(device_), tokens.labels.to(device_), tokens.layout);
  }

  // The losses live on the last stage (zeros elsewhere); with them, each pp rank's busy and
  // pipeline time over the window in its own slot, for the bubble as `loom plan schedule` defines
  // it (parallel::pipeline::bubble_fraction). One all-reduce over pp for both.
  at::Tensor complete_losses(at::Tensor losses, metrics::StepMetrics* window) override {
    auto& pp = runner_->group();
    if (window == nullptr) {  // mid-window: the losses alone, the timings keep counting
      if (pp.size() > 1) pp.all_reduce(losses);
      return losses;
    }
    const auto stats = runner_->take_stats();
    const int64_t ranks = pp.size(), count = losses.size(0);
    at::Tensor times = at::zeros({2 * ranks}, at::kDouble);
    times[pp.rank()] = stats.compute_seconds;
    times[ranks + pp.rank()] = stats.pass_seconds;
    at::Tensor values = at::cat({losses.to(at::kDouble), times});
    if (pp.size() > 1) pp.all_reduce(values);
    const auto all = values.accessor<double, 1>();
    std::vector<double> busy;
    double step = 0;
    for (int64_t r = 0; r < ranks; ++r) {
      busy.push_back(all[count + r]);
      step = std::max(step, all[count + ranks + r]);
    }
    window->pp_bubble_pct = 100.0 * parallel::pipeline::bubble_fraction(busy, step);
    return values.narrow(0, 0, count);
  }

 private:
  std::unique_ptr<parallel::pipeline::PipelineRunner> runner_;
  parallel::ParallelModel& model_;
  at::Device device_;
  bool block_causal_;
};

std::unique_ptr<StepRunner> pipeline_runner(parallel::ParallelModel& model,
                                            const parallel::pipeline::PipelinePlan& plan,
                                            distributed::ParallelRuntime& runtime,
                                            const at::Device& device,
                                            const config::JobConfig& config) {
  parallel::pipeline::PipelineRunnerOptions options;
  options.boundary_shape = model.boundary_shape;
  options.boundary_dtype = model.boundary_dtype;
  options.device = device;
  options.forward = [&model, device](models::CausalLM& part, const at::Tensor& input,
                                     const models::TokenLayout& layout) {
    AutocastGuard autocast(device.type(), model.autocast);
    return part.forward(input.device() == device ? input : input.to(device), layout);
  };
  options.loss_sum = [&model, device](const at::Tensor& output, const at::Tensor& labels) {
    AutocastGuard autocast(device.type(), model.autocast);
    return model.loss(output, labels.to(device));
  };
  std::vector<models::CausalLM*> parts;
  for (auto& part : model.parts) parts.push_back(part.get());
  const auto pp_rank =
      static_cast<int>(runtime.mesh().group_rank(distributed::MeshGroup::pp, runtime.rank()));
  auto runner = std::make_unique<parallel::pipeline::PipelineRunner>(
      plan, pp_rank, std::move(parts), model.part_syncs,
      runtime.group_ptr(distributed::MeshGroup::pp), std::move(options));
  log::get("trainer")->info(
      "pipeline: {} over {} ranks, {} stages ({} per rank), {} microbatches of {} per pass; this "
      "rank runs stages {}",
      plan.schedule.name, plan.split.pp, plan.schedule.stages(), plan.split.stages_per_rank,
      plan.microbatches, config.parallelism.pipeline_parallel_microbatch_size,
      fmt::join(plan.schedule.stages_of_rank(pp_rank), ", "));
  return std::make_unique<PipelineStepRunner>(std::move(runner), model, device,
                                              config.model.attn_mask_type == "block_causal");
}

}  // namespace

parallel::ContextShard place_tokens(const data::Batch& batch, bool block_causal,
                                    const parallel::ContextParallel* context, int64_t mtp_depths) {
  const at::Tensor documents = block_causal ? batch.documents : at::Tensor();
  const at::Tensor positions = block_causal ? batch.positions : at::Tensor();
  auto place = [&](const at::Tensor& inputs, const at::Tensor& labels) {
    if (context) return context->shard(inputs, labels, documents, positions);
    parallel::ContextShard whole{inputs, labels, {}};
    whole.layout.documents = documents;
    whole.layout.positions = positions;
    return whole;
  };
  parallel::ContextShard out = place(batch.inputs, batch.labels);
  if (mtp_depths <= 0) return out;
  const auto targets = models::mtp_targets(batch.inputs, batch.labels, documents, mtp_depths);
  std::vector<at::Tensor> tokens, labels{out.labels};
  for (int64_t k = 0; k < mtp_depths; ++k) {
    const auto depth = place(targets.tokens[k], targets.labels[k]);
    tokens.push_back(depth.inputs);
    labels.push_back(depth.labels);
  }
  out.layout.mtp_tokens = models::depths_side_by_side(tokens);
  out.labels = models::depths_side_by_side(labels);
  return out;
}

at::Tensor StepRunner::train_microbatch_counted_on_device(const data::Batch& /*batch*/,
                                                          const at::Tensor& /*valid_tokens*/,
                                                          bool /*last*/) {
  LOOM_THROW(InternalError,
             "this step runner (the pipeline's) cannot read the token count on the device");
}

std::unique_ptr<StepRunner> make_step_runner(
    parallel::ParallelModel& model, const std::optional<parallel::pipeline::PipelinePlan>& plan,
    distributed::ParallelRuntime& runtime, const at::Device& device,
    const config::JobConfig& config) {
  if (plan) return pipeline_runner(model, *plan, runtime, device, config);
  return std::make_unique<LocalStepRunner>(model, device,
                                           config.model.attn_mask_type == "block_causal",
                                           config.training.local_batch_size);
}

}  // namespace loom::train
