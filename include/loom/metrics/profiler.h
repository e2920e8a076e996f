// Profiler traces and memory snapshots on a step schedule (torchtitan's profiling.* keys).
//
// Traces: LibTorch's Kineto profiler on the ranks in profiling.ranks. Each cycle of
// profile_freq steps waits, warms up for profiler_warmup steps, records profiler_active steps
// and ends at a multiple of profile_freq, writing a Chrome/Perfetto trace (chrome://tracing,
// ui.perfetto.dev, TensorBoard's profiler plugin) to
//   <dump_folder>/<save_traces_folder>/iteration_<step>/rank<r>_trace.json
// with CPU operator activity, and CUDA kernels on a CUDA device.
//
// Memory snapshots (profiling.enable_memory_snapshot, CUDA only): the caching allocator records
// its history from the start; at the end of each cycle, and on an out-of-memory error, every
// rank writes the snapshot in the pickle format PyTorch's memory visualizer
// (pytorch.org/memory_viz, torch.cuda.memory._snapshot()) reads, to
//   <dump_folder>/<save_memory_snapshot_folder>/iteration_<step>[_exit]/rank<r>_memory_snapshot.pickle
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "loom/config/job_config.h"

namespace at {
class RecordFunction;
}

namespace loom::metrics {

class StepProfiler {
 public:
  StepProfiler(const config::JobConfig& config, int rank, const c10::Device& device);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void step_begin(int64_t step);
  void step_end(int64_t step);

  // Called with the out-of-memory error of `step`: writes a memory snapshot (when enabled on
  // CUDA) and throws loom::Error with the message and the snapshot's path.
  [[noreturn]] void out_of_memory(int64_t step, const std::string& message);

  // Traces and snapshots written so far (tests, logs).
  const std::vector<std::string>& files_written() const { return written_; }

 private:
  enum class Phase { kIdle, kWarmup, kRecording };
  int64_t cycle_position(int64_t step) const;  // 0 .. profile_freq - 1
  void start_warmup();
  void start_recording(int64_t step);
  void stop_and_save(int64_t step);
  std::string save_memory_snapshot(const std::string& folder_name);

  config::ProfilingSection options_;
  std::string dump_folder_;
  int rank_;
  c10::Device device_;
  bool traces_ = false;     // enable_profiling and this rank is in profiling.ranks
  bool snapshots_ = false;  // enable_memory_snapshot on CUDA
  Phase phase_ = Phase::kIdle;
  std::unique_ptr<at::RecordFunction> step_scope_;  // "ProfilerStep#<n>" around a recorded step
  std::vector<std::string> written_;
};

}  // namespace loom::metrics
