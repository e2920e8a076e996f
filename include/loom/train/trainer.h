// The training loop `loom train` runs, on one rank of a job (or alone). It reads like the job's
// data path in DESIGN.md: runtime (ranks, mesh, groups), device, data, the model built on the
// meta device and handed to its family's parallelize function (which applies TP, activation
// checkpointing, FSDP/DDP and materializes the local parameters), optimizer and schedule, then
// steps with metrics, validation and a clean stop on SIGTERM. The trainer never names a wrapper:
// it holds model parts, parameters with placements, one gradient-sync object and a loss.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/data/batch_source.h"
#include "loom/data/tokenizer.h"
#include "loom/distributed/runtime.h"
#include "loom/metrics/memory_estimate.h"
#include "loom/metrics/metrics.h"
#include "loom/metrics/profiler.h"
#include "loom/models/model_spec.h"
#include "loom/parallel/parallelize.h"
#include "loom/parallel/pipeline/runner.h"
#include "loom/train/lr_scheduler.h"
#include "loom/train/optimizer.h"
#include "loom/train/validator.h"

namespace loom::checkpoint {
class CheckpointManager;
}

namespace loom::train {

struct TrainResult {
  int64_t steps_completed = 0;
  std::vector<double> losses;  // one per step
  std::vector<double> grad_norms;
  bool stopped_by_signal = false;
  int stop_signal = 0;      // the signal that stopped the run (any rank's), 0 if none
  int64_t first_step = 1;   // the first step this run trained (resume step + 1)
  double elapsed_s = 0;     // this run's training time
  double peak_memory_gib = 0;
  uint64_t comm_wire_bytes = 0;  // sent by this rank over every group
};

// The tokenizer a job trains with: null when every dataset it reads is synthetic (the model then
// keeps its flavor's vocabulary). Throws InputError for a bad tokenizer path.
std::unique_ptr<data::Tokenizer> load_job_tokenizer(const config::JobConfig& config);

class Trainer {
 public:
  // `source` / `validation_source` null: built from the config (training.dataset, ...).
  explicit Trainer(config::JobConfig config, std::unique_ptr<data::BatchSource> source = nullptr,
                   std::unique_ptr<data::BatchSource> validation_source = nullptr);
  ~Trainer();

  // `on_started` runs once the run has really started (checkpoint loaded or none to load), so a
  // failed attempt leaves the dump folder's config.toml of the run it tried to resume.
  TrainResult train(const std::function<void()>& on_started = {});

  // The first model part (the whole model without pipeline parallelism).
  models::CausalLM& model() { return *parallel_.parts.front(); }
  const parallel::ParallelModel& parallel_model() const { return parallel_; }
  distributed::ParallelRuntime& runtime() { return *runtime_; }
  const at::Device& device() const { return device_; }
  uint64_t seed() const { return seed_; }
  checkpoint::CheckpointManager& checkpointer() { return *checkpoint_; }

 private:
  // Per-step values kept on the device until a logging step reads them (one host sync per log).
  struct PendingStep {
    int64_t step = 0;
    at::Tensor loss;       // this rank's part of the step's loss (summed over the loss group later)
    at::Tensor grad_norm;  // already global
  };

  void setup_runtime();
  void build_model();
  metrics::MemoryEstimate estimate_rank_memory(
      const std::vector<std::unique_ptr<models::CausalLM>>& parts);
  void build_data(std::unique_ptr<data::BatchSource> source,
                  std::unique_ptr<data::BatchSource> validation_source);
  void build_checkpointer();
  // Pipeline parallelism: the stages' runner over this rank's parts (pp > 1 only).
  void build_pipeline();
  // The step's microbatches forward and backward: through the model, or through the pipeline.
  at::Tensor forward_backward(const std::vector<data::Batch>& micro, int64_t valid_tokens);
  double train_step(int64_t step, PendingStep& pending, metrics::StepMetrics& m);
  // Reduces and reads the pending steps' losses and norms into `result` (a collective).
  void flush_pending(TrainResult& result, metrics::StepMetrics& last);
  double validate();
  bool is_log_step(int64_t step) const;
  // Training time summed over the run's attempts (metrics' elapsed_s, saved in checkpoints).
  double elapsed_s() const;
  // The shard group when parameters are sharded by FSDP (per-block norms sum over it), else null.
  distributed::Comm* shard_group();
  // The stop signal (SIGTERM, SIGINT) once any rank was asked to stop, on every rank (all ranks
  // leave after the same step); 0 otherwise.
  int any_rank_stopping();

  config::JobConfig config_;
  std::unique_ptr<distributed::ParallelRuntime> runtime_;
  at::Device device_{at::kCPU};
  uint64_t seed_ = 0;
  int64_t accumulation_steps_ = 1;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  parallel::ParallelModel parallel_;
  std::optional<parallel::pipeline::PipelinePlan> pipeline_plan_;
  std::unique_ptr<parallel::pipeline::PipelineRunner> pipeline_;
  // parallel_.parameters' tensors and placements, gathered once (clipping reads them every step).
  std::vector<at::Tensor> local_tensors_;
  std::vector<parallel::Placement> placements_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<LRSchedule> schedule_;
  int64_t lr_step_offset_ = 0;  // training step minus schedule step (lr_scheduler not resumed)
  std::unique_ptr<data::BatchSource> source_;
  std::unique_ptr<Validator> validator_;
  std::unique_ptr<metrics::MetricsLogger> metrics_;
  std::unique_ptr<metrics::StepProfiler> profiler_;  // profiling.* traces and memory snapshots
  std::unique_ptr<metrics::StepBreakdown> breakdown_;  // metrics.step_breakdown
  std::unique_ptr<checkpoint::CheckpointManager> checkpoint_;
  std::vector<PendingStep> pending_;
  metrics::PeakFlops peak_;
  // Training time: of the earlier attempts (from the checkpoint) plus this one's.
  double elapsed_before_ = 0;
  std::chrono::steady_clock::time_point train_start_ = std::chrono::steady_clock::now();
  models::ModelSummary summary_;
};

}  // namespace loom::train
