// Everything a training job builds before its first step, in the order of DESIGN.md's data path:
// runtime (ranks, mesh, groups) and device, the model built on the meta device and handed to its
// family's parallelize function, the optimizer and learning-rate schedule, the step runner (local
// or pipeline), the data loaders and the checkpoint manager. build_run makes it; the trainer's
// loop only uses it.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/data/batch_source.h"
#include "loom/data/tokenizer.h"
#include "loom/distributed/runtime.h"
#include "loom/models/model_spec.h"
#include "loom/optim/optimizer.h"
#include "loom/parallel/parallelize.h"
#include "loom/quantize/convert.h"
#include "loom/train/lr_scheduler.h"
#include "loom/train/step_hook.h"
#include "loom/train/step_runner.h"
#include "loom/train/validator.h"

namespace loom::checkpoint {
class CheckpointManager;
}

namespace loom::train {

struct Run {
  Run();
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  config::JobConfig config;  // with the global batch an elastic resume keeps
  std::unique_ptr<distributed::ParallelRuntime> runtime;
  at::Device device{at::kCPU};
  uint64_t seed = 0;
  int64_t accumulation_steps = 1;  // microbatches of training.local_batch_size per step
  std::unique_ptr<data::Tokenizer> tokenizer;  // null when every dataset is synthetic
  const models::ModelSpec* spec = nullptr;
  models::ModelSummary summary;  // the whole model (FLOPs per token, parameter names)
  quantize::ConverterReport converters;  // what model.converters changed on this rank
  parallel::ParallelModel model;
  // model.parameters' tensors and placements, gathered once (clipping reads them every step).
  std::vector<at::Tensor> local_tensors;
  std::vector<parallel::Placement> placements;
  std::unique_ptr<optim::Optimizer> optimizer;  // over model.parameters, by name
  std::optional<LRSchedule> schedule;
  std::unique_ptr<StepRunner> steps;
  std::unique_ptr<data::BatchSource> source;  // prefetching training batches
  std::unique_ptr<Validator> validator;       // null without validation
  std::unique_ptr<checkpoint::CheckpointManager> checkpoint;
  // What each step passes through (step_hook.h): fault-tolerant replica groups' quorum,
  // averaging and healing (fault_tolerance.enable), else the plain hook.
  std::unique_ptr<StepHook> step_hook;
};

// Builds the job's run on this rank, refusing (InputError, every problem at once, before any
// rendezvous) what loom cannot do. `source` / `validation_source` null: from the config
// (training.dataset, ...). `elapsed_s` gives checkpoints the run's training time.
std::unique_ptr<Run> build_run(config::JobConfig config, std::unique_ptr<data::BatchSource> source,
                               std::unique_ptr<data::BatchSource> validation_source,
                               std::function<double()> elapsed_s);

// The tokenizer a job trains with: null when every dataset it reads is synthetic (the model then
// keeps its flavor's vocabulary). Throws InputError for a bad tokenizer path.
std::unique_ptr<data::Tokenizer> load_job_tokenizer(const config::JobConfig& config);

}  // namespace loom::train
