// The one pipeline executor: runs a rank's action list (schedule.h) for one training step over
// the stages this rank holds, whatever schedule produced the list.
//
// Forward (F): the stage's input is the microbatch (stage 0), or the activation received from
// the previous stage (a leaf that requires grad). The last stage's output goes through the loss.
// Full backward (B): autograd backward from the stage's output (or loss), accumulating weight
// gradients; the input's gradient goes to the previous stage.
// Zero bubble splits it: I computes only the input's gradient with autograd::grad(output, input,
// retain_graph = true), so the graph and its saved tensors stay alive and no weight gradient is
// computed yet; W later runs autograd::backward(output, grad, inputs = the stage's parameters),
// which accumulates the weight gradients and frees the graph. W re-traverses the stage's graph
// (the gradients of its internal activations are computed again), so I + W cost more than B
// here; torchtitan avoids that by splitting each matmul's backward, loom does not (yet).
// Communication: each run of consecutive SEND/RECV actions is one Comm::batch_send_recv; a
// receive is waited for by the compute that reads it (not by the next compute: schedules post
// receives early, and interleaved 1F1B posts some a whole microbatch before their use, so waiting
// at once would serialize the ranks and cost interleaving its smaller bubble), sends at the end
// of the step (their tensors are kept alive until then). The time spent waiting for receives is
// most of the rank's idle time (ExecutorStats).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "loom/distributed/comm.h"
#include "loom/parallel/pipeline/schedule.h"

namespace loom::parallel::pipeline {

// One stage's model part on this rank (e.g. a models::CausalLM built for a StagePart).
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // `microbatch`: the index of the input's microbatch in the pass (the stage may need what the
  // tokens of that microbatch are, e.g. their positions).
  virtual at::Tensor forward(const at::Tensor& input, int microbatch) = 0;
  // The tensors W accumulates gradients into (the stage's trainable parameters).
  virtual std::vector<at::Tensor> parameters() = 0;
};

struct ExecutorOptions {
  // Shape and dtype of the tensors that cross stage boundaries (the activations and their
  // gradients), the same for every boundary and microbatch: [microbatch, seq, dim] for a
  // transformer. Receive buffers are allocated with them on `device`.
  std::vector<int64_t> boundary_shape;
  at::ScalarType boundary_dtype = at::kFloat;
  at::Device device = at::kCPU;
  // The last stage's output and the microbatch's target -> scalar loss of the microbatch. The
  // step's loss is the sum over microbatches (scale inside when a mean over the step is wanted).
  std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)> loss;
  // Called around each action this rank runs (a batch's communication actions: before the batch
  // is posted, after it was posted); may be empty. For tracing, profiler ranges, tests,
  // and for wrappers that act per stage and microbatch (e.g. FSDP arming its gradient
  // reduce-scatter before a stage's last backward).
  std::function<void(const Action&)> before_action;
  std::function<void(const Action&)> after_action;
};

struct ExecutorStats {
  double compute_seconds = 0;    // in F, I, W, B: busy (bubble_fraction() in simulate.h)
  double pass_seconds = 0;       // the whole pass on this rank: busy + idle
  double wait_seconds = 0;       // waiting for receives (most of the idle time)
  double send_wait_seconds = 0;  // waiting for the step's sends at its end
  int64_t computes = 0;
  int64_t batches = 0;
};

struct StepResult {
  std::vector<at::Tensor> losses;  // per microbatch, on the rank with the last stage (detached)
  ExecutorStats stats;
};

class PipelineExecutor {
 public:
  // `stages`: this rank's stages by global stage index (schedule.stages_of_rank(rank)); `comm`:
  // the pp group, whose rank r holds stages r, r + pp, ...
  PipelineExecutor(Schedule schedule, int rank, std::map<int, PipelineStage*> stages,
                   distributed::Comm& comm, ExecutorOptions options);

  // Runs this rank's actions once. `inputs`: the microbatches (needed on the rank with stage 0),
  // `targets`: their targets (on the rank with the last stage); empty elsewhere. Gradients
  // accumulate into the stages' parameters as in a plain backward over the whole batch.
  StepResult run_step(const std::vector<at::Tensor>& inputs,
                      const std::vector<at::Tensor>& targets);
  // Runs a forward-only schedule (make_forward_schedule) without keeping anything for a
  // backward: evaluation. Call it under at::NoGradGuard.
  StepResult run_forward(const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& targets);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace loom::parallel::pipeline
