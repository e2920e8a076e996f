#include "loom/train/step_graph.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <functional>
#include <limits>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/optim/optimizer.h"
#include "loom/train/grad_clip.h"
#include "loom/train/run.h"
#include "loom/train/step_runner.h"

namespace loom::train {
namespace {

class EagerStepGraph final : public device::StepGraph {
 public:
  void run(const std::function<void()>& body) override { body(); }
  void capture(const std::function<void()>& body) override { body_ = body; }
  void replay() override {
    LOOM_CHECK(body_ != nullptr, "step graph: replay before capture");
    body_();
  }

 private:
  std::function<void()> body_;
};

}  // namespace

std::unique_ptr<device::StepGraph> eager_step_graph() {
  return std::make_unique<EagerStepGraph>();
}

StepGraphFacts step_graph_facts(const Run& run) {
  const auto& c = run.config;
  StepGraphFacts f;
  f.cuda = run.device.is_cuda();
  f.cpu_replay = c.debug.cuda_graph_on_cpu;
  f.world_size = run.runtime->world().world_size;
  f.causal_mask = c.model.attn_mask_type == "causal";
  // (ModelSpec::after_optimizer_step only forwards to the model's.)
  f.model_step_hooks =
      static_cast<bool>(run.model.after_optimizer_step) || static_cast<bool>(run.model.begin_step);
  f.mtp_depths = run.model.mtp_depths;
  f.converters = run.converters.float8_linears + run.converters.float8_grouped > 0 ||
                 !run.converters.hooks.empty();
  f.fault_tolerance = c.fault_tolerance.enable;
  f.layer_grad_norms = c.metrics.log_layer_grad_norms;
  f.step_breakdown = c.metrics.step_breakdown;
  f.optimizer_device_scalars = run.optimizer->can_keep_scalars_on_device();
  f.optimizer = run.optimizer->name();
  return f;
}

std::optional<std::string> step_graph_refusal(const StepGraphFacts& f) {
  if (!f.cuda && !f.cpu_replay) return "the job does not run on a GPU";
  if (f.world_size > 1) {
    return fmt::format("{} ranks: only one-rank jobs are recorded (collectives are not)",
                       f.world_size);
  }
  if (!f.causal_mask) {
    return "model.attn_mask_type = block_causal: document offsets are computed on the host per "
           "batch";
  }
  if (f.mtp_depths > 0) return "multi-token prediction's weight follows the step on the host";
  if (f.model_step_hooks) {
    return "the model works on the host around each step (a mixture of experts' balancing and "
           "load metrics, QK-clip)";
  }
  if (f.converters) return "model.converters: float8 keeps its weight casts by host-side checks";
  if (f.fault_tolerance) return "fault_tolerance: replica groups decide each step on the host";
  if (f.layer_grad_norms) return "metrics.log_layer_grad_norms reads norms inside the step";
  if (f.step_breakdown) return "metrics.step_breakdown times the step's parts on the host";
  if (!f.optimizer_device_scalars) {
    return fmt::format(
        "optimizer {} reads its lr and step counts on the host (AdamW and Adam "
        "read them on the device)",
        f.optimizer);
  }
  return std::nullopt;
}

GraphedStep::GraphedStep(Run& run, std::unique_ptr<device::StepGraph> graph)
    : run_(run), graph_(std::move(graph)) {
  run_.optimizer->keep_scalars_on_device(run_.device);
  valid_tokens_ = at::zeros({}, at::TensorOptions().device(run_.device).dtype(at::kFloat));
}

void GraphedStep::load(const std::vector<data::Batch>& micro, double valid_tokens) {
  if (buffers_.empty()) {
    for (const auto& batch : micro) {
      buffers_.push_back({at::empty_like(batch.inputs, at::TensorOptions().device(run_.device)),
                          at::empty_like(batch.labels, at::TensorOptions().device(run_.device)),
                          {},
                          {}});
    }
  }
  LOOM_CHECK(micro.size() == buffers_.size(), "training.cuda_graph: ", micro.size(),
             " microbatches in a step where the recorded step has ", buffers_.size());
  for (size_t i = 0; i < micro.size(); ++i) {
    LOOM_CHECK(micro[i].inputs.sizes() == buffers_[i].inputs.sizes() &&
                   micro[i].labels.sizes() == buffers_[i].labels.sizes(),
               "training.cuda_graph: a batch of shape ", micro[i].inputs.sizes(),
               " where the recorded step reads ", buffers_[i].inputs.sizes());
    buffers_[i].inputs.copy_(micro[i].inputs);
    buffers_[i].labels.copy_(micro[i].labels);
  }
  valid_tokens_.fill_(valid_tokens);
}

void GraphedStep::body() {
  Run& run = run_;
  run.optimizer->zero_grad();
  at::Tensor loss_sum;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    at::Tensor loss = run.steps->train_microbatch_counted_on_device(buffers_[i], valid_tokens_,
                                                                    i + 1 == buffers_.size());
    loss_sum = loss_sum.defined() ? loss_sum + loss : loss;
  }
  run.model.gradient_sync->finish();
  loss_ = loss_sum.to(at::kDouble);
  grad_norm_ = clip_grad_norm(run.local_tensors, run.placements, run.config.training.max_norm,
                              &run.runtime->world_group());
  run.optimizer->step();
}

GraphedStep::Outputs GraphedStep::step(const std::vector<data::Batch>& micro, double valid_tokens,
                                       double lr) {
  load(micro, valid_tokens);
  run_.optimizer->set_lr(lr);
  run_.optimizer->load_device_scalars();
  if (steps_run_ < kEagerSteps) {
    graph_->run([this] { body(); });
  } else {
    if (!recorded_) {
      graph_->capture([this] { body(); });
      recorded_ = true;
      log::get("trainer")->info(
          "training.cuda_graph: the step is recorded (after {} eager "
          "steps); every later step replays it",
          steps_run_);
    }
    // A replay reads no host value: the host lr is poisoned while one runs, so a step that read
    // it would train on NaN where a replay runs its body again (debug.cuda_graph_on_cpu), as it
    // would train on the captured step's lr on a GPU.
    run_.optimizer->set_lr(std::numeric_limits<double>::quiet_NaN());
    graph_->replay();
    run_.optimizer->set_lr(lr);
  }
  run_.optimizer->count_device_step();
  ++steps_run_;
  // Copies: the graph's outputs are overwritten by the next replay.
  return {loss_.clone(), grad_norm_.clone()};
}

std::unique_ptr<GraphedStep> make_graphed_step(Run& run) {
  if (!run.config.training.cuda_graph) return nullptr;
  auto log = log::get("trainer");
  if (auto refusal = step_graph_refusal(step_graph_facts(run))) {
    log->warn("training.cuda_graph: training eagerly: {}", *refusal);
    return nullptr;
  }
  std::unique_ptr<device::StepGraph> graph;
  if (run.device.is_cuda()) {
    const device::CudaSupport* cuda = device::cuda_support();
    LOOM_CHECK(cuda != nullptr, "training.cuda_graph: the CUDA support library is not loaded (",
               device::cuda_support_status(), ")");
    graph = cuda->make_step_graph(run.device.index() < 0 ? 0 : run.device.index());
  } else {
    graph = eager_step_graph();
    log->info(
        "training.cuda_graph on CPU (debug.cuda_graph_on_cpu): the graphed step's path "
        "with the recorded step replayed eagerly");
  }
  return std::make_unique<GraphedStep>(run, std::move(graph));
}

}  // namespace loom::train
