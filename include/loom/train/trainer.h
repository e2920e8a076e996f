// The training loop `loom train` runs, on one rank of a job (or alone). The run is built first
// (run.h: runtime, device, model handed to its family's parallelize function, optimizer and
// schedule, step runner, data, checkpoints); the loop then steps with metrics, validation,
// checkpoints and a clean stop on SIGTERM. The trainer never names a wrapper or a parallelism:
// it holds model parts, parameters with placements, one gradient-sync object, a loss and a step
// runner.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/data/batch_source.h"
#include "loom/metrics/metrics.h"
#include "loom/metrics/profiler.h"
#include "loom/train/run.h"

namespace loom::train {

class GraphedStep;

struct TrainResult {
  int64_t steps_completed = 0;
  std::vector<double> losses;  // one per step
  std::vector<double> grad_norms;
  bool stopped_by_signal = false;
  int stop_signal = 0;  // the signal that stopped the run (any rank's), 0 if none
  // The first step this run trained: resume step + 1, or past the steps a replica group healed.
  int64_t first_step = 1;
  double elapsed_s = 0;  // this run's training time
  double peak_memory_gib = 0;
  uint64_t comm_wire_bytes = 0;  // sent by this rank over every group
  int64_t graph_replays = 0;     // steps replayed from training.cuda_graph's recorded step
};

// What a run trained, for its last log line: "finished: 2 steps (steps 61-62, resumed from step
// 60) of 62"; a run that a replica group healed forward says so instead of counting from 1.
std::string describe_steps_run(const TrainResult& result, int64_t resumed_from, int64_t total);

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
  models::CausalLM& model() { return *run_->model.parts.front(); }
  const parallel::ParallelModel& parallel_model() const { return run_->model; }
  distributed::ParallelRuntime& runtime() { return *run_->runtime; }
  const at::Device& device() const { return run_->device; }
  uint64_t seed() const { return run_->seed; }
  checkpoint::CheckpointManager& checkpointer() { return *run_->checkpoint; }

 private:
  // Per-step values kept on the device until a logging step reads them (one host sync per log).
  struct PendingStep {
    int64_t step = 0;
    at::Tensor loss;       // this rank's part of the step's loss (summed over the loss group later)
    at::Tensor grad_norm;  // already global
  };

  // The steps since the last logged one: their time, data time, wait in collectives, bytes.
  struct Window {
    double time = 0, data = 0, wait = 0;
    int64_t steps = 0;
    uint64_t comm_start = 0;  // the runtime's wire bytes when the window began
    std::array<uint64_t, distributed::kCollectiveKinds> comm_start_by_collective{};
  };

  struct StepOutcome {
    double data_time = 0;
    bool committed = true;  // false: fault-tolerant replica groups discarded it (retried)
  };
  StepOutcome train_step(int64_t step, PendingStep& pending, metrics::StepMetrics& m);
  // The step's microbatches: the discarded attempt's again, or the loader's next.
  std::vector<data::Batch> step_batches();
  // The step hook's begin_step: returns the committed step to continue from (after healing, the
  // quorum's), with tokens seen, the schedule offset and the data loader moved along.
  int64_t begin_step(int64_t committed, int64_t& tokens_seen);
  void log_window(int64_t step, int64_t tokens_seen, metrics::StepMetrics& m);
  // Reduces and reads the pending steps' losses and norms into `result` (a collective); at the
  // end of a logged window also into `window` (the last step's values, the window's statistics).
  // Null: read before a checkpoint or a stop, the window goes on.
  void flush_pending(TrainResult& result, metrics::StepMetrics* window);
  // A step's gradient norm read at a flush: true when the step skipped its update
  // (training.skip_nonfinite_steps); throws when it may not (off, or too many in a row).
  bool check_gradient_norm(int64_t step, double norm);
  // debug.nonfinite_gradient_steps: rank 0 writes a NaN into its first gradient at those steps.
  void poison_gradient_for_test(int64_t step);
  double validate();
  bool is_log_step(int64_t step) const;
  // Training time summed over the run's attempts (metrics' elapsed_s, saved in checkpoints).
  double elapsed_s() const;
  // The stop signal (SIGTERM, SIGINT) once any rank was asked to stop, on every rank (all ranks
  // leave after the same step); 0 otherwise.
  int any_rank_stopping();
  // The learning rate of training step `step` (1-based) by the schedule.
  double lr_of(int64_t step) const;

  std::unique_ptr<Run> run_;
  const config::JobConfig& config_;       // run_->config
  std::unique_ptr<GraphedStep> graphed_;  // training.cuda_graph's recorded step; null: eager
  int64_t lr_step_offset_ = 0;  // training step minus schedule step (lr_scheduler not resumed)
  std::unique_ptr<metrics::MetricsLogger> metrics_;
  std::unique_ptr<metrics::StepProfiler> profiler_;    // profiling.* traces and memory snapshots
  std::unique_ptr<metrics::StepBreakdown> breakdown_;  // metrics.step_breakdown
  std::vector<PendingStep> pending_;
  std::vector<data::Batch> retry_;  // a discarded step's batches (fault tolerance)
  int64_t discarded_steps_ = 0;     // since the last logged step
  // training.skip_nonfinite_steps: steps whose update was skipped in a row (as of the last flush)
  // and in this run.
  int64_t skipped_in_a_row_ = 0;
  int64_t skipped_steps_ = 0;
  Window window_;
  metrics::PeakFlops peak_;
  // Training time: of the earlier attempts (from the checkpoint) plus this one's.
  double elapsed_before_ = 0;
  std::chrono::steady_clock::time_point train_start_ = std::chrono::steady_clock::now();
};

}  // namespace loom::train
