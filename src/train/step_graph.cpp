#include "loom/train/step_graph.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
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
  void wait_for_replays(size_t /*in_flight*/) override {}  // each replay ran to its end

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
  const auto& dims = run.runtime->dims();
  for (const auto& [name, degree] : {std::pair<const char*, int64_t>{"tp", dims.tp},
                                     {"pp", dims.pp},
                                     {"cp", dims.cp},
                                     {"ep", dims.ep}}) {
    if (degree > 1) {
      f.model_parallel +=
          fmt::format("{}{} {}", f.model_parallel.empty() ? "" : ", ", name, degree);
    }
  }
  f.collectives_through_host = run.runtime->process_groups().cuda_through_host();
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
  if (f.world_size > 1 && !f.model_parallel.empty()) {
    return fmt::format(
        "parallelism {}: of several ranks' jobs, only the data-parallel wrappers (DDP, FSDP, "
        "HSDP) are recorded",
        f.model_parallel);
  }
  if (f.world_size > 1 && f.collectives_through_host) {
    return fmt::format(
        "{} ranks share a GPU: their collectives are staged through host memory, which a graph "
        "cannot hold",
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

ReplayQueue::ReplayQueue(device::StepGraph& graph, distributed::FlightRecorder* recorder,
                         std::vector<int> world_ranks, size_t in_flight)
    : graph_(graph),
      recorder_(recorder),
      world_ranks_(std::move(world_ranks)),
      in_flight_(in_flight) {}

void ReplayQueue::replay() {
  graph_.replay();
  ++replays_;
  uint64_t id = 0;
  if (recorder_ != nullptr) {
    distributed::CollectiveRecord record;
    // A group of its own: the world's collectives number theirs apart (the hang report pairs
    // entries by group and number).
    record.group = "world/step_graph";
    record.group_ranks = world_ranks_;
    record.seq = replays_;
    record.op = "step_graph_replay";
    id = recorder_->record(std::move(record));
    recorder_->started(id);
  }
  queued_.push_back(id);
  wait_until(in_flight_);
}

void ReplayQueue::wait_until(size_t in_flight) {
  while (queued_.size() > in_flight) {
    const uint64_t oldest = queued_.front();
    if (recorder_ != nullptr) recorder_->waiting(oldest);
    try {
      graph_.wait_for_replays(queued_.size() - 1);
    } catch (const std::exception& e) {
      if (recorder_ != nullptr) {
        const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
        recorder_->failed(oldest, c10_error ? c10_error->what_without_backtrace() : e.what());
      }
      throw;
    }
    if (recorder_ != nullptr) recorder_->completed(oldest);
    queued_.pop_front();
  }
}

namespace {

using GroupTraffic = std::vector<distributed::TrafficCounts>;

// Per process group: what `later` counted since `earlier`, and `a` with `b` added.
GroupTraffic traffic_since(const GroupTraffic& later, const GroupTraffic& earlier) {
  LOOM_CHECK(later.size() == earlier.size(), "step graph: the process groups changed in training");
  GroupTraffic out;
  for (size_t g = 0; g < later.size(); ++g) out.push_back(later[g] - earlier[g]);
  return out;
}

GroupTraffic traffic_plus(const GroupTraffic& a, const GroupTraffic& b) {
  LOOM_CHECK(a.size() == b.size(), "step graph: the process groups changed in training");
  GroupTraffic out;
  for (size_t g = 0; g < a.size(); ++g) out.push_back(a[g] + b[g]);
  return out;
}

}  // namespace

GraphedStep::GraphedStep(Run& run, std::unique_ptr<device::StepGraph> graph)
    : run_(run), graph_(std::move(graph)) {
  run_.optimizer->keep_scalars_on_device(run_.device);
  valid_tokens_ = at::zeros({}, at::TensorOptions().device(run_.device).dtype(at::kFloat));
  std::vector<int> world_ranks(static_cast<size_t>(run_.runtime->world().world_size));
  for (size_t r = 0; r < world_ranks.size(); ++r) world_ranks[r] = static_cast<int>(r);
  // Several ranks wait for each replay: a replay's collectives are watched by no backend, and
  // a host that later blocked on its results in a copy would hang unseen. The device idles for
  // the host's work between steps: the next batch (prefetched), its token count's and the stop
  // flag's small all-reduces over Gloo, the batch's copy and one launch.
  const size_t in_flight = world_ranks.size() > 1 ? 0 : kReplaysInFlight;
  replays_ = std::make_unique<ReplayQueue>(*graph_, run_.runtime->process_groups().recorder(),
                                           std::move(world_ranks), in_flight);
}

std::vector<distributed::TrafficCounts> GraphedStep::traffic() const {
  return run_.runtime->process_groups().traffic();
}

void GraphedStep::set_traffic(const std::vector<distributed::TrafficCounts>& traffic) {
  run_.runtime->process_groups().set_traffic(traffic);
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
  run.optimizer->step(nonfinite_skip_flag(grad_norm_, run.config.training.skip_nonfinite_steps));
}

GraphedStep::Outputs GraphedStep::step(const std::vector<data::Batch>& micro, double valid_tokens,
                                       double lr) {
  load(micro, valid_tokens);
  run_.optimizer->set_lr(lr);
  run_.optimizer->load_device_scalars();
  if (steps_run_ < kEagerSteps) {
    const auto before = traffic();
    graph_->run([this] { body(); });
    step_traffic_ = traffic_since(traffic(), before);
  } else {
    if (!recorded_) {
      const auto before = traffic();
      graph_->capture([this] { body(); });
      set_traffic(before);  // recording sends nothing
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
    // The same holds for the byte counters: a replay's collectives run without the host, so
    // its traffic is that of the last eager step, whatever the host counted meanwhile.
    const auto before = traffic();
    replays_->replay();
    set_traffic(traffic_plus(before, step_traffic_));
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
