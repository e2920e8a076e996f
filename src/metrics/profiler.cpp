#include "loom/metrics/profiler.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <set>

#include "loom/core/check.h"
#include "loom/core/cuda_support.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"

namespace loom::metrics {
namespace {

namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

ProfilerConfig kineto_config() {
  // Input shapes make the trace say which GEMM is which; stacks and memory would bloat it.
  return ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/true,
                        /*profile_memory=*/false, /*with_stack=*/false, /*with_flops=*/true,
                        /*with_modules=*/false);
}

std::set<ActivityType> activities(const c10::Device& device) {
  std::set<ActivityType> set{ActivityType::CPU};
  if (device.is_cuda()) set.insert(ActivityType::CUDA);
  return set;
}

}  // namespace

StepProfiler::StepProfiler(const config::JobConfig& config, int rank, const c10::Device& device)
    : options_(config.profiling),
      dump_folder_(config.job.dump_folder),
      rank_(rank),
      device_(device) {
  const auto& ranks = options_.ranks;
  traces_ = options_.enable_profiling &&
            std::find(ranks.begin(), ranks.end(), static_cast<int64_t>(rank)) != ranks.end();
  auto log = log::get("profiler");
  if (traces_) {
    log->info("profiler: recording steps {}-{} of every {} (warm-up {}), traces in {}/{}",
              options_.profile_freq - options_.profiler_active + 1, options_.profile_freq,
              options_.profile_freq, options_.profiler_warmup, dump_folder_,
              options_.save_traces_folder);
  }
  if (!options_.enable_memory_snapshot) return;
  if (const device::CudaSupport* cuda = device::cuda_support(); cuda && device_.is_cuda()) {
    // Every allocation and free with its C++ context, up to 100000 entries (PyTorch's default).
    cuda->record_memory_history(100000);
    snapshots_ = true;
    log->info("memory snapshots: every {} steps and on out-of-memory, in {}/{}",
              options_.profile_freq, dump_folder_, options_.save_memory_snapshot_folder);
    return;
  }
  if (rank_ == 0) {
    log->warn(
        "profiling.enable_memory_snapshot: snapshots come from the CUDA caching allocator and "
        "this run is on {}: none will be written (mem_peak_gib in metrics.jsonl is the peak RSS)",
        device_.str());
  }
}

StepProfiler::~StepProfiler() {
  step_scope_.reset();
  if (phase_ != Phase::kIdle) {
    try {
      kineto::disableProfiler();  // an unfinished cycle (the run ended or failed): no trace
    } catch (const std::exception&) {
    }
  }
}

int64_t StepProfiler::cycle_position(int64_t step) const {
  return (step - 1) % options_.profile_freq;
}

void StepProfiler::start_warmup() {
  kineto::prepareProfiler(kineto_config(), activities(device_));
  phase_ = Phase::kWarmup;
}

void StepProfiler::start_recording(int64_t step) {
  if (phase_ == Phase::kIdle) start_warmup();
  kineto::enableProfiler(kineto_config(), activities(device_));
  phase_ = Phase::kRecording;
  (void)step;
}

void StepProfiler::step_begin(int64_t step) {
  if (!traces_) return;
  const int64_t position = cycle_position(step);
  const int64_t record_from = options_.profile_freq - options_.profiler_active;
  const int64_t warm_from = record_from - options_.profiler_warmup;
  if (phase_ == Phase::kIdle && position >= warm_from && position < record_from) start_warmup();
  // A run resumed inside the recording window records what is left of it.
  if (phase_ != Phase::kRecording && position >= record_from) start_recording(step);
  if (phase_ == Phase::kRecording) {
    step_scope_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    step_scope_->before("ProfilerStep#" + std::to_string(step));
  }
}

void StepProfiler::step_end(int64_t step) {
  step_scope_.reset();
  const bool cycle_end = step % options_.profile_freq == 0;
  if (traces_ && phase_ == Phase::kRecording && cycle_end) stop_and_save(step);
  if (snapshots_ && cycle_end) save_memory_snapshot("iteration_" + std::to_string(step));
}

void StepProfiler::stop_and_save(int64_t step) {
  auto result = kineto::disableProfiler();
  phase_ = Phase::kIdle;
  const std::string folder = files::output_folder(dump_folder_, options_.save_traces_folder,
                                                  "profiling.save_traces_folder") +
                             "/iteration_" + std::to_string(step);
  files::create_directories(folder);
  const std::string path = folder + "/rank" + std::to_string(rank_) + "_trace.json";
  result->save(path);
  written_.push_back(path);
  log::get("profiler")
      ->info("profiler trace of steps {}-{} written to {}", step - options_.profiler_active + 1,
             step, path);
}

std::string StepProfiler::save_memory_snapshot(const std::string& folder_name) {
  const device::CudaSupport* cuda = device::cuda_support();
  if (!cuda) return {};
  const std::string folder =
      dump_folder_ + "/" + options_.save_memory_snapshot_folder + "/" + folder_name;
  files::create_directories(folder);
  const std::string path = folder + "/rank" + std::to_string(rank_) + "_memory_snapshot.pickle";
  files::write_atomic(path, cuda->memory_snapshot_pickled());
  written_.push_back(path);
  log::get("profiler")
      ->info("memory snapshot written to {} (open it at pytorch.org/memory_viz)", path);
  return path;
}

void StepProfiler::out_of_memory(int64_t step, const std::string& message) {
  std::string where;
  if (snapshots_) {
    try {
      where = "; memory snapshot: " +
              save_memory_snapshot("iteration_" + std::to_string(step) + "_exit");
    } catch (const std::exception& e) {
      where = std::string("; the memory snapshot failed: ") + e.what();
    }
  } else if (device_.is_cuda()) {
    where = "; set profiling.enable_memory_snapshot = true for a snapshot of the allocator";
  }
  LOOM_THROW(Error, "step ", step, ": out of memory on ", device_.str(), ": ", message, where);
}

}  // namespace loom::metrics
