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
#include "loom/metrics/step_breakdown.h"

namespace loom::metrics {

// Fault-tolerant replica groups (fault_tolerance.enable): the quorum of the logged step.
struct QuorumMetrics {
  int64_t quorum_id = 0;
  std::string participants;  // replica ids, "0,1"
  int64_t replicas = 0;
  std::optional<int64_t> healed_from;  // set on the step this group healed
  int64_t discarded_steps = 0;         // attempts discarded since the last logged step
  double quorum_s = 0;                 // the logged step's wait for its quorum (and healing)
};

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  double tps = 0;             // tokens per second per device
  double tflops = 0;          // achieved TFLOP/s per device
  double mfu_pct = 0;         // model FLOPs utilization, percent of peak
  bool mfu_estimate = false;  // the peak was measured on this machine (CPU), not known
  double mem_peak_gib = 0;    // CUDA max allocated, or peak RSS on CPU
  double step_time_s = 0;
  double data_time_pct = 0;  // share of the step spent waiting for data
  double comm_wait_pct = 0;  // share of the step blocked on collectives (distributed::Work)
  int64_t tokens_seen = 0;   // over all ranks
  double elapsed_s = 0;      // training time since the run first started (summed over resumes)
  double since_start_s = 0;  // since the process started (start-up cost included)
  int64_t data_skipped = 0;  // bad dataset records skipped (training.dataset_on_error = skip)
  // training.skip_nonfinite_steps: steps of this run whose update was skipped (a non-finite
  // gradient norm); logged as "skipped_steps" only when skipping is on.
  std::optional<int64_t> skipped_steps;
  double comm_mb = 0;  // MB this rank sent per step over every process group (ring-model bytes)
  // comm_mb split by collective ("all_to_all", "send", ...; the kinds that moved bytes in the
  // window), logged as "comm_mb/<collective>": expert parallelism's dispatch is all_to_all,
  // the context-parallel ring is send.
  std::vector<std::pair<std::string, double>> comm_mb_by_collective;
  std::optional<double> val_loss;
  // Pipeline parallelism only: the measured bubble over the logging window, 100 x idle over
  // busy time summed over the pp ranks (parallel::pipeline::bubble_fraction, the definition
  // `loom plan schedule` prints): 25 for 1F1B's (P-1)/M with P = 2, M = 4.
  std::optional<double> pp_bubble_pct;
  // metrics.log_layer_grad_norms: the gradient norm of each block ("layers.0", ...,
  // "tok_embeddings", "norm", "output"), logged as "grad_norm/<block>".
  std::vector<std::pair<std::string, double>> block_grad_norms;
  // What the model reports after its optimizer step (ModelSpec::after_optimizer_step), logged
  // under its own keys: a mixture of experts' "moe/..." load statistics (docs/metrics.md).
  std::vector<std::pair<std::string, double>> model_metrics;
  // metrics.step_breakdown: per-step milliseconds by category over the logging window, logged as
  // "breakdown/<category>_ms", "breakdown/overhead_pct" and "breakdown/ops_per_step".
  std::optional<StepBreakdownValues> breakdown;
  std::optional<QuorumMetrics> quorum;
};

// The start record metrics.jsonl gets at each start of a run (fresh or resumed), so that runs
// appended to one dump folder can be told apart. It has no "step" key (readers of step rows skip
// it) and "event": "start".
struct RunStart {
  int64_t first_step = 1;
  int64_t total_steps = 0;        // training.steps
  int64_t resumed_from_step = 0;  // 0: a fresh run
  std::string resumed_from;       // the checkpoint loaded, empty for a fresh run
  std::string config_hash;        // of the effective config (config_hash())
  int64_t world_size = 1;
  std::string layout;       // "pp 1, dp_replicate 1, dp_shard 2, cp 1, tp 1"
  double elapsed_s = 0;     // training time before this start (from the checkpoint)
  std::string peak_source;  // where the MFU peak comes from (PeakFlops::source)
  // model.converters on rank 0: linears and routed-expert modules computing in float8, and
  // whether their GEMMs are emulated (keys only when a converter is on).
  int64_t float8_linears = 0;
  int64_t float8_grouped = 0;
  bool float8_emulated = false;
};

// "crc32c:<8 hex>" of the effective config's TOML.
std::string config_hash(const config::JobConfig& config);

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
  // Also appends the start record.
  void start_run(const RunStart& start);
  // The run ended: "finished" or "stopped" (a signal), at `step`. Without it the destructor
  // records "failed" (an exception ended the run).
  void finish_run(const std::string& state, int64_t step);

  void log_step(const StepMetrics& metrics);
  // A validation result (its own JSON line with val_loss).
  // Same time keys as a step row: elapsed_s, since_start_s, wall_time.
  void log_validation(int64_t step, double val_loss, int64_t tokens_seen, double elapsed_s);
  // The JSON object of a start record, for tests.
  static std::string start_json_line(const RunStart& start, double since_start_s, double wall_time);

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
  bool warned_mfu_ = false;
  bool status_failing_ = false;  // the last run_status.json write failed (warned once)
  std::string peak_source_;
};

// Peak FLOP/s of one device, and how far to trust it.
struct PeakFlops {
  double flops = 0;       // 0: unknown (no MFU)
  std::string source;     // "metrics.peak_tflops", "GPU table (H100)", "CPU nominal (...)"
  bool estimate = false;  // not the device's known peak: MFU is marked as an estimate
};
// metrics.peak_tflops if set; a table of GPUs (bf16 dense); on CPU the nominal float32 peak of
// the cores this rank computes on (cpu_peak_flops), the same for every run on the machine.
PeakFlops peak_flops(const at::Device& device, std::optional<double> override_tflops);
// Dense bf16 peak of a known GPU by its device name (vendor data sheets; "NVIDIA H100 PCIe" is
// 756e12, "NVIDIA H100 80GB HBM3" 989e12); nullopt for one not in the table.
std::optional<double> gpu_table_flops(const std::string& name);

// A CPU's nominal float32 peak, documented in docs/observability.md: `threads` cores x the
// nominal clock (the "@ N GHz" of /proc/cpuinfo's model name, else its "cpu MHz") x the float32
// FLOPs one core can issue per cycle (two FMA pipes: 64 with AVX-512, 32 with AVX2 and FMA, 16
// with AVX, 8 otherwise). Nothing is timed, so two runs of one model report one MFU.
struct CpuPeak {
  double flops = 0;
  double ghz = 0;
  int flops_per_cycle = 0;
  std::string isa;  // "AVX-512", "AVX2+FMA", "AVX", "SSE"
};
CpuPeak cpu_peak_flops(int threads, const std::string& cpuinfo_path = "/proc/cpuinfo");
// The best of `trials` timed GEMMs (at least `min_seconds` in all), in FLOP/s.
double measure_cpu_gemm_flops(int trials = 12, double min_seconds = 0.25);
// The one warning an MFU deserves, if any: above 100% means the peak is wrong.
std::optional<std::string> mfu_warning(double mfu_pct, const PeakFlops& peak);

// Peak memory so far in GiB: CUDA max allocated on `device`, or the process's peak RSS on CPU.
double peak_memory_gib(const at::Device& device);

double seconds_since_process_start();

}  // namespace loom::metrics
