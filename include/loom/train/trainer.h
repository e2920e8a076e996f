// The training loop `loom train` runs, on one rank of a job (or alone). It reads like the job's
// data path in DESIGN.md: runtime (ranks, mesh, groups), device, data, model and its parallel
// wrappers, optimizer and schedule, then steps with metrics, validation and a clean stop on
// SIGTERM.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/data/batch_source.h"
#include "loom/data/tokenizer.h"
#include "loom/distributed/runtime.h"
#include "loom/metrics/metrics.h"
#include "loom/metrics/profiler.h"
#include "loom/models/model_spec.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/fsdp.h"
#include "loom/train/lr_scheduler.h"
#include "loom/train/optimizer.h"

namespace loom::checkpoint {
class CheckpointManager;
}

namespace loom::train {

struct TrainResult {
  int64_t steps_completed = 0;
  std::vector<double> losses;  // one per step
  std::vector<double> grad_norms;
  bool stopped_by_signal = false;
  double peak_memory_gib = 0;
  uint64_t comm_wire_bytes = 0;  // sent by this rank over every group
};

class Trainer {
 public:
  // `source` / `validation_source` null: built from the config (training.dataset, ...).
  explicit Trainer(config::JobConfig config, std::unique_ptr<data::BatchSource> source = nullptr,
                   std::unique_ptr<data::BatchSource> validation_source = nullptr);
  ~Trainer();

  TrainResult train();

  models::CausalLM& model() { return *model_; }
  // Under FSDP (dp_shard > 1 or debug.force_fsdp): the sharding wrapper; the model's own parameters
  // are then empty unsharded holders outside forward/backward, the shards are here. Null otherwise.
  parallel::FullyShardedDataParallel* fsdp() { return fsdp_.get(); }
  distributed::ParallelRuntime& runtime() { return *runtime_; }
  const at::Device& device() const { return device_; }
  uint64_t seed() const { return seed_; }
  checkpoint::CheckpointManager& checkpointer() { return *checkpoint_; }

 private:
  void setup_runtime();
  void build_model();
  void apply_parallelism();
  void build_data(std::unique_ptr<data::BatchSource> source,
                  std::unique_ptr<data::BatchSource> validation_source);
  void build_checkpointer();
  double train_step(int64_t step, metrics::StepMetrics& metrics);
  double validate();
  std::optional<at::ScalarType> autocast() const;
  bool uses_fsdp() const;  // dp_shard > 1, or debug.force_fsdp
  bool is_log_step(int64_t step) const;
  std::vector<std::pair<std::string, at::Tensor>> named_local_parameters();
  // True on every rank once any rank was asked to stop (all ranks leave after the same step).
  bool any_rank_stopping();

  config::JobConfig config_;
  std::unique_ptr<distributed::ParallelRuntime> runtime_;
  at::Device device_{at::kCPU};
  uint64_t seed_ = 0;
  int64_t accumulation_steps_ = 1;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<models::CausalLM> model_;
  std::vector<at::Tensor> parameters_;
  std::unique_ptr<parallel::DataParallel> data_parallel_;
  std::unique_ptr<parallel::FullyShardedDataParallel> fsdp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<LRSchedule> schedule_;
  int64_t lr_step_offset_ = 0;  // training step minus schedule step (lr_scheduler not resumed)
  std::unique_ptr<data::BatchSource> source_;
  std::unique_ptr<data::BatchSource> validation_source_;
  std::unique_ptr<metrics::MetricsLogger> metrics_;
  std::unique_ptr<metrics::StepProfiler> profiler_;  // profiling.* traces and memory snapshots
  std::unique_ptr<checkpoint::CheckpointManager> checkpoint_;
  double peak_flops_ = 0;
  models::ModelSummary summary_;
};

}  // namespace loom::train
