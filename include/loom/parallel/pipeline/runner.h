// Pipeline parallelism in a training job: this rank's model parts (one per virtual stage, each
// already TP-, AC- and FSDP/DDP-wrapped by the model family's parallelize function) run by the
// executor (executor.h) over the job's schedule (plan.h), on the pp group.
//
// A training pass splits the rank's local batch into the plan's microbatches
// (parallelism.pipeline_parallel_microbatch_size rows each) and runs the rank's action list. The
// data-parallel wrappers of a stage accumulate unreduced gradients over its microbatches and
// reduce them on the stage's last backward of the step (FSDP2's no-sync under PP): the runner
// calls the part's GradientSync::prepare_microbatch(last) before each of its B and W actions,
// `last` only for the stage's final one in the step's final pass. An evaluation pass runs the
// forward-only schedule without keeping anything for a backward.
//
// Losses exist on the rank that holds the last stage; a pass returns them summed there and
// zeros on the other pp ranks (the trainer sums over the pp group when it logs).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "loom/distributed/comm.h"
#include "loom/protocols/causal_lm.h"
#include "loom/parallel/gradient_sync.h"
#include "loom/parallel/pipeline/executor.h"
#include "loom/parallel/pipeline/plan.h"

namespace loom::parallel::pipeline {

struct PipelineRunnerOptions {
  // Shape of the activations crossing stages for a microbatch of (rows, seq) tokens: the model
  // family's hidden state, e.g. [rows, seq / tp, dim] for Llama under sequence parallelism.
  std::function<std::vector<int64_t>(int64_t rows, int64_t seq)> boundary_shape;
  at::ScalarType boundary_dtype = at::kFloat;
  at::Device device = at::kCPU;
  // A part's forward on a microbatch whose tokens sit as `layout` says (positions, documents,
  // context-parallel slots; trivial: whole causal rows). The trainer wraps autocast around it.
  std::function<at::Tensor(models::CausalLM& part, const at::Tensor& input,
                           const models::TokenLayout& layout)>
      forward;
  // The last part's output and the labels -> the microbatch's summed token loss.
  std::function<at::Tensor(const at::Tensor& output, const at::Tensor& labels)> loss_sum;
};

class PipelineRunner {
 public:
  // `parts`: this rank's parts in stage order (plan.split.parts_of_rank(pp_rank)), not owned;
  // `part_syncs`: the gradient synchronization of each part (null: none); `pp`: the pp group.
  PipelineRunner(PipelinePlan plan, int pp_rank, std::vector<models::CausalLM*> parts,
                 std::vector<GradientSync*> part_syncs, std::shared_ptr<distributed::Comm> pp,
                 PipelineRunnerOptions options);
  ~PipelineRunner();

  // One pass of the schedule over a local batch [rows, seq] (rows = the plan's microbatches x
  // microbatch size), each microbatch's loss divided by `divisor` (the step's valid tokens).
  // `last_pass`: the step's last (gradient accumulation), on which gradients are reduced.
  // Returns the pass's summed loss on the last stage's rank, a zero elsewhere (detached).
  // `layout`: where the batch's tokens sit (its per-row tensors are split into the microbatches
  // with the rows).
  at::Tensor train_pass(const at::Tensor& inputs, const at::Tensor& labels, double divisor,
                        bool last_pass, const models::TokenLayout& layout = {});

  // The summed token loss of a batch without gradients (validation), on every pp rank (a
  // collective over the pp group). Splits into microbatches of the training size when the
  // rows divide, else runs the batch as one.
  at::Tensor eval_sum(const at::Tensor& inputs, const at::Tensor& labels,
                      const models::TokenLayout& layout = {});

  bool holds_last_stage() const;
  distributed::Comm& group() { return *pp_; }
  const PipelinePlan& plan() const { return plan_; }
  // Executor time of the training passes since the last call: compute and waiting for
  // activations and gradients (this rank's bubble).
  ExecutorStats take_stats();

 private:
  class Stage;
  bool is_final_backward(const Action& action) const;
  std::vector<at::Tensor> split_rows(const at::Tensor& batch, int64_t microbatches) const;
  void split_layout(const models::TokenLayout& layout, int64_t rows, int64_t microbatches);

  PipelinePlan plan_;
  int rank_;
  std::shared_ptr<distributed::Comm> pp_;
  PipelineRunnerOptions options_;
  std::vector<std::unique_ptr<Stage>> stages_;
  std::map<int, GradientSync*> sync_of_stage_;
  std::map<int, Action> final_backward_;  // per local stage: its last B or W of a pass
  std::unique_ptr<PipelineExecutor> executor_;
  std::vector<int64_t> executor_shape_;       // the boundary shape executor_ was built for
  std::vector<models::TokenLayout> layouts_;  // of the running pass's microbatches
  double divisor_ = 1;
  bool last_pass_ = true;
  ExecutorStats stats_;
};

}  // namespace loom::parallel::pipeline
