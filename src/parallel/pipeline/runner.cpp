// The pipeline runner (runner.h).
#include "loom/parallel/pipeline/runner.h"

#include <ATen/ATen.h>

#include "loom/core/check.h"

namespace loom::parallel::pipeline {

// A model part as the executor's stage; its output is cast to the boundary dtype (a no-op unless
// a part's last op computes in another dtype than the next part's input expects).
class PipelineRunner::Stage final : public PipelineStage {
 public:
  Stage(models::CausalLM& part, const PipelineRunnerOptions& options,
        const std::vector<models::TokenLayout>& layouts, bool head)
      : part_(part), options_(options), layouts_(layouts), head_(head) {}
  at::Tensor forward(const at::Tensor& input, int microbatch) override {
    at::Tensor out = options_.forward(part_, input, layouts_.at(static_cast<size_t>(microbatch)));
    return head_ ? out : out.to(options_.boundary_dtype);
  }
  std::vector<at::Tensor> parameters() override { return part_.module().parameters(); }

 private:
  models::CausalLM& part_;
  const PipelineRunnerOptions& options_;
  const std::vector<models::TokenLayout>& layouts_;
  bool head_;
};

PipelineRunner::PipelineRunner(PipelinePlan plan, int pp_rank, std::vector<models::CausalLM*> parts,
                               std::vector<GradientSync*> part_syncs,
                               std::shared_ptr<distributed::Comm> pp, PipelineRunnerOptions options)
    : plan_(std::move(plan)), rank_(pp_rank), pp_(std::move(pp)), options_(std::move(options)) {
  const auto stages = plan_.schedule.stages_of_rank(rank_);
  LOOM_CHECK(parts.size() == stages.size() && part_syncs.size() == parts.size(), "pipeline rank ",
             rank_, " holds ", stages.size(), " stages but got ", parts.size(), " parts and ",
             part_syncs.size(), " gradient syncs");
  LOOM_CHECK(options_.forward && options_.loss_sum && options_.boundary_shape,
             "the pipeline runner needs a forward, a loss and the boundary shape");
  const int last = plan_.schedule.stages() - 1;
  for (size_t i = 0; i < parts.size(); ++i) {
    stages_.push_back(std::make_unique<Stage>(*parts[i], options_, layouts_, stages[i] == last));
    sync_of_stage_[stages[i]] = part_syncs[i];
  }
  for (const Action& a : plan_.schedule.actions.at(static_cast<size_t>(rank_))) {
    if (a.type == ActionType::kFullBackward || a.type == ActionType::kBackwardWeight) {
      final_backward_[a.stage] = a;
    }
  }
}

PipelineRunner::~PipelineRunner() = default;

bool PipelineRunner::holds_last_stage() const {
  return plan_.schedule.rank_of_stage(plan_.schedule.stages() - 1) == rank_;
}

bool PipelineRunner::is_final_backward(const Action& action) const {
  auto it = final_backward_.find(action.stage);
  return it != final_backward_.end() && it->second == action;
}

std::vector<at::Tensor> PipelineRunner::split_rows(const at::Tensor& batch,
                                                   int64_t microbatches) const {
  LOOM_CHECK(batch.size(0) % microbatches == 0, "a batch of ", batch.size(0),
             " rows does not split into ", microbatches, " microbatches");
  std::vector<at::Tensor> out;
  for (const auto& piece : batch.chunk(microbatches, 0)) out.push_back(piece.contiguous());
  return out;
}

void PipelineRunner::split_layout(const models::TokenLayout& layout, int64_t rows,
                                  int64_t microbatches) {
  layouts_.assign(static_cast<size_t>(microbatches), layout);
  // Per-row tensors follow their rows; slots are the same for every row.
  auto split = [&](at::Tensor models::TokenLayout::*member) {
    const at::Tensor& whole = layout.*member;
    if (!whole.defined() || whole.dim() != 2) return;
    LOOM_CHECK(whole.size(0) == rows, "a layout of ", whole.size(0), " rows for ", rows);
    const auto pieces = whole.chunk(microbatches, 0);
    for (size_t i = 0; i < pieces.size(); ++i) layouts_[i].*member = pieces[i];
  };
  split(&models::TokenLayout::positions);
  split(&models::TokenLayout::documents);
  split(&models::TokenLayout::key_documents);
  split(&models::TokenLayout::mtp_tokens);
}

at::Tensor PipelineRunner::train_pass(const at::Tensor& inputs, const at::Tensor& labels,
                                      double divisor, bool last_pass,
                                      const models::TokenLayout& layout) {
  const int64_t m = plan_.microbatches;
  split_layout(layout, inputs.size(0), m);
  const std::vector<int64_t> shape = options_.boundary_shape(inputs.size(0) / m, inputs.size(1));
  if (!executor_ || shape != executor_shape_) {
    ExecutorOptions eo;
    eo.boundary_shape = shape;
    eo.boundary_dtype = options_.boundary_dtype;
    eo.device = options_.device;
    eo.loss = [this](const at::Tensor& output, const at::Tensor& target) {
      return options_.loss_sum(output, target) / divisor_;
    };
    // A stage's wrappers reduce its gradients on its last backward of the step only.
    eo.before_action = [this](const Action& a) {
      if (a.type != ActionType::kFullBackward && a.type != ActionType::kBackwardWeight) return;
      if (GradientSync* sync = sync_of_stage_.at(a.stage)) {
        sync->prepare_microbatch(last_pass_ && is_final_backward(a));
      }
    };
    std::map<int, PipelineStage*> mine;
    const auto stages = plan_.schedule.stages_of_rank(rank_);
    for (size_t i = 0; i < stages.size(); ++i) mine[stages[i]] = stages_[i].get();
    executor_ = std::make_unique<PipelineExecutor>(plan_.schedule, rank_, mine, *pp_, eo);
    executor_shape_ = shape;
  }
  divisor_ = divisor;
  last_pass_ = last_pass;
  const StepResult result = executor_->run_step(split_rows(inputs, m), split_rows(labels, m));
  stats_.compute_seconds += result.stats.compute_seconds;
  stats_.wait_seconds += result.stats.wait_seconds;
  stats_.send_wait_seconds += result.stats.send_wait_seconds;
  stats_.pass_seconds += result.stats.pass_seconds;
  stats_.computes += result.stats.computes;
  stats_.batches += result.stats.batches;
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(options_.device));
  for (const auto& loss : result.losses) total = total + loss.to(at::kFloat);
  return total;
}

at::Tensor PipelineRunner::eval_sum(const at::Tensor& inputs, const at::Tensor& labels,
                                    const models::TokenLayout& layout) {
  const int64_t rows = inputs.size(0);
  const int64_t size = rows / plan_.microbatches;  // the training microbatch size
  const int64_t m = size > 0 && rows % size == 0 ? rows / size : 1;
  split_layout(layout, rows, m);
  const Schedule schedule =
      make_forward_schedule(plan_.schedule.pp, plan_.schedule.stages_per_rank, static_cast<int>(m));
  ExecutorOptions eo;
  eo.boundary_shape = options_.boundary_shape(rows / m, inputs.size(1));
  eo.boundary_dtype = options_.boundary_dtype;
  eo.device = options_.device;
  eo.loss = options_.loss_sum;
  std::map<int, PipelineStage*> mine;
  const auto stages = schedule.stages_of_rank(rank_);
  for (size_t i = 0; i < stages.size(); ++i) mine[stages[i]] = stages_[i].get();
  PipelineExecutor executor(schedule, rank_, mine, *pp_, eo);
  const StepResult result = executor.run_forward(split_rows(inputs, m), split_rows(labels, m));
  at::Tensor total = at::zeros({1}, at::TensorOptions().dtype(at::kDouble));
  for (const auto& loss : result.losses) total += loss.to(at::kCPU).to(at::kDouble);
  pp_->all_reduce(total);  // only the last stage's rank holds a nonzero sum
  return total.squeeze(0);
}

ExecutorStats PipelineRunner::take_stats() {
  ExecutorStats out = stats_;
  stats_ = {};
  return out;
}

}  // namespace loom::parallel::pipeline
