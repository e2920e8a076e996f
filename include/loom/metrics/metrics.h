// Per-step training metrics: a colored console line, one JSON object per line appended (and
// flushed) to <dump_folder>/metrics.jsonl, and the same scalars in TensorBoard event files
// (metrics.enable_tensorboard). Keys are a contract (DESIGN.md section 3): new ones may be added,
// none renamed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/config/job_config.h"

namespace loom::metrics {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  double tps = 0;           // tokens per second per device
  double tflops = 0;        // achieved TFLOP/s per device
  double mfu_pct = 0;       // model FLOPs utilization, percent of peak
  double mem_peak_gib = 0;  // CUDA max allocated, or peak RSS on CPU
  double step_time_s = 0;
  double data_time_pct = 0;  // share of the step spent waiting for data
  double comm_wait_pct = 0;  // share of the step blocked on collectives (distributed::Work)
  int64_t tokens_seen = 0;   // over all ranks
  double elapsed_s = 0;      // since training started
  double since_start_s = 0;  // since the process started (start-up cost included)
  int64_t data_skipped = 0;  // bad dataset records skipped (training.dataset_on_error = skip)
  double comm_mb = 0;  // MB this rank sent per step over every process group (ring-model bytes)
  std::optional<double> val_loss;
  // metrics.log_layer_grad_norms: the gradient norm of each block ("layers.0", ...,
  // "tok_embeddings", "norm", "output"), logged as "grad_norm/<block>".
  std::vector<std::pair<std::string, double>> block_grad_norms;
};

// Where a MetricsLogger writes; each empty path turns its sink off.
struct MetricsSinks {
  std::string jsonl_path;
  std::string tensorboard_folder;
  std::string status_path;  // run_status.json, read by `loom metrics watch`
  int64_t total_steps = 0;  // training.steps (for the status file)
  bool color = false;
};

// The sinks of `rank` under `config`: rank 0 writes metrics.jsonl, run_status.json and, with
// metrics.enable_tensorboard, <dump_folder>/<save_tb_folder>; with metrics.save_for_all_ranks
// every rank writes TensorBoard files, each in <save_tb_folder>/rank_<r>.
MetricsSinks metrics_sinks(const config::JobConfig& config, int rank, bool color);

class TensorBoardWriter;

class MetricsLogger {
 public:
  // Throws loom::IoError when a file cannot be opened.
  explicit MetricsLogger(MetricsSinks sinks);
  // jsonl_path empty: console only.
  MetricsLogger(const std::string& jsonl_path, bool color);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Once the first step of this run is known (1, or the resumed step + 1): opens the
  // TensorBoard file (a resumed run adds a new one) and marks the run as running.
  void start_run(int64_t first_step);
  // The run ended: "finished" or "stopped" (a signal), at `step`. Without it the destructor
  // records "failed" (an exception ended the run).
  void finish_run(const std::string& state, int64_t step);

  void log_step(const StepMetrics& metrics);
  // A validation result (its own JSON line with val_loss).
  void log_validation(int64_t step, double val_loss, int64_t tokens_seen, double elapsed_s);

  // The JSON object for one step (what log_step appends), for tests.
  static std::string to_json_line(const StepMetrics& metrics, double wall_time);

 private:
  void append_line(const std::string& json);
  void write_scalars(int64_t step, double wall_time, const std::string& json);
  void write_status(const std::string& state, int64_t step);

  MetricsSinks sinks_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  int64_t first_step_ = 1;
  int64_t last_step_ = 0;
  bool finished_ = false;
};

// Peak FLOP/s of one device: the override if set; a table of GPUs (bf16 dense); on CPU a GEMM
// measured now (float32, all intra-op threads).
double peak_flops(const at::Device& device, std::optional<double> override_tflops);
double measure_cpu_gemm_flops();

// Peak memory so far in GiB: CUDA max allocated on `device`, or the process's peak RSS on CPU.
double peak_memory_gib(const at::Device& device);

double seconds_since_process_start();

}  // namespace loom::metrics
