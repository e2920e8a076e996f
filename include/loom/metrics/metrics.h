// Per-step training metrics: a colored console line and one JSON object per line appended (and
// flushed) to <dump_folder>/metrics.jsonl. Keys are a contract (DESIGN.md section 3): new ones
// may be added, none renamed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdio>
#include <optional>
#include <string>

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
  int64_t tokens_seen = 0;   // over all ranks
  double elapsed_s = 0;      // since training started
  double since_start_s = 0;  // since the process started (start-up cost included)
  int64_t data_skipped = 0;  // bad dataset records skipped (training.dataset_on_error = skip)
  double comm_mb = 0;  // MB this rank sent per step over every process group (ring-model bytes)
  std::optional<double> val_loss;
};

class MetricsLogger {
 public:
  // jsonl_path empty: console only. Throws loom::IoError when the file cannot be opened.
  MetricsLogger(const std::string& jsonl_path, bool color);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  void log_step(const StepMetrics& metrics);
  // A validation result (its own JSON line with val_loss).
  void log_validation(int64_t step, double val_loss, int64_t tokens_seen, double elapsed_s);

  // The JSON line for one step (what log_step appends), for tests.
  static std::string to_json_line(const StepMetrics& metrics, double wall_time);

 private:
  void append_line(const std::string& json);

  std::FILE* file_ = nullptr;
  bool color_;
};

// Peak FLOP/s of one device: the override if set; a table of GPUs (bf16 dense); on CPU a GEMM
// measured now (float32, all intra-op threads).
double peak_flops(const at::Device& device, std::optional<double> override_tflops);
double measure_cpu_gemm_flops();

// Peak memory so far in GiB: CUDA max allocated on `device`, or the process's peak RSS on CPU.
double peak_memory_gib(const at::Device& device);

double seconds_since_process_start();

}  // namespace loom::metrics
