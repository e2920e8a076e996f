// How a training step's microbatches run forward and backward and how a validation batch is
// scored: on the rank's whole model (LocalStepRunner), or through the pipeline schedule over the
// rank's stages (PipelineStepRunner). The trainer's loop calls this interface only, so it has no
// pipeline branch; which runner a job gets is decided once, when the run is built.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>

#include "loom/config/job_config.h"
#include "loom/data/batch_source.h"
#include "loom/distributed/runtime.h"
#include "loom/metrics/metrics.h"
#include "loom/parallel/context_parallel.h"
#include "loom/parallel/parallelize.h"
#include "loom/parallel/pipeline/plan.h"

namespace loom::train {

// The tokens a rank computes of a batch and where they sit: the whole rows, or its context-
// parallel share; documents and their positions under block_causal. A training batch with
// multi-token prediction (`mtp_depths` > 0) also carries each depth's tokens and labels
// (models/mtp.h), cut from the whole rows -- within documents under block_causal -- and then
// shared out like the main ones.
parallel::ContextShard place_tokens(const data::Batch& batch, bool block_causal,
                                    const parallel::ContextParallel* context,
                                    int64_t mtp_depths = 0);

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Forward and backward of one microbatch, its loss divided by `valid_tokens` (those of the
  // whole step, so accumulation equals one big batch), with the gradient sync armed for the step's
  // `last` microbatch. Returns this rank's part of the loss, detached (zero on a pipeline rank
  // without the last stage).
  virtual at::Tensor train_microbatch(const data::Batch& batch, double valid_tokens, bool last) = 0;
  // The same with the count read from a float32 0-d tensor on the device when the kernels run
  // (a recorded CUDA graph replays with the count of the step it replays: train/step_graph.h).
  // Only the local runner can; the pipeline's refuses.
  virtual at::Tensor train_microbatch_counted_on_device(const data::Batch& batch,
                                                        const at::Tensor& valid_tokens, bool last);
  // The summed token loss of a validation batch, forward only (complete on every rank that
  // computes it; zero on pipeline ranks without the last stage).
  virtual at::Tensor eval_sum(const data::Batch& batch) = 0;
  // `losses` of the window's steps, already summed over the loss group, made complete on every
  // rank (a pipeline's live on its last stage); at the end of a logged window (`window` given)
  // adds its runner statistics there (pp_bubble_pct) and starts the next; null (losses read
  // before a checkpoint) keeps them counting. A collective.
  virtual at::Tensor complete_losses(at::Tensor losses, metrics::StepMetrics* window) = 0;
};

// The runner for `model` on this rank: the pipeline's when `plan` is set (pipeline parallelism),
// else the local one. Logs the pipeline's shape.
std::unique_ptr<StepRunner> make_step_runner(
    parallel::ParallelModel& model, const std::optional<parallel::pipeline::PipelinePlan>& plan,
    distributed::ParallelRuntime& runtime, const at::Device& device,
    const config::JobConfig& config);

}  // namespace loom::train
