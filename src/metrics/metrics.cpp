#include "loom/metrics/metrics.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <sys/resource.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstring>

#include "loom/core/check.h"
#include "loom/core/logging.h"

#if LOOM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace loom::metrics {
namespace {

// Taken while the program loads, before main: the reference for since_start_s.
const std::chrono::steady_clock::time_point process_start = std::chrono::steady_clock::now();

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Dense bf16 peak of known GPUs (vendor data sheets), matched by substring of the device name.
std::optional<double> gpu_table_flops(const std::string& name) {
  struct Entry {
    const char* key;
    double flops;
  };
  static const Entry table[] = {
      {"H200", 989e12},  {"H100", 989e12},  {"H800", 989e12}, {"GH200", 989e12},
      {"B200", 2250e12}, {"B100", 1750e12}, {"A100", 312e12}, {"A800", 312e12},
      {"L40S", 362e12},  {"A10G", 125e12},  {"V100", 125e12}, {"RTX 4090", 165e12},
  };
  for (const auto& entry : table) {
    if (name.find(entry.key) != std::string::npos) return entry.flops;
  }
  return std::nullopt;
}

}  // namespace

MetricsLogger::MetricsLogger(const std::string& jsonl_path, bool color) : color_(color) {
  if (!jsonl_path.empty()) {
    file_ = std::fopen(jsonl_path.c_str(), "a");
    LOOM_CHECK_AS(IoError, file_ != nullptr, "cannot open metrics file '", jsonl_path,
                  "': ", std::strerror(errno));
  }
}

MetricsLogger::~MetricsLogger() {
  if (file_) std::fclose(file_);
}

std::string MetricsLogger::to_json_line(const StepMetrics& m, double wall_time) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"grad_norm", m.grad_norm},
                      {"lr", m.lr},
                      {"tps", m.tps},
                      {"tflops", m.tflops},
                      {"mfu_pct", m.mfu_pct},
                      {"mem_peak_gib", m.mem_peak_gib},
                      {"step_time_s", m.step_time_s},
                      {"data_time_pct", m.data_time_pct},
                      {"tokens_seen", m.tokens_seen},
                      {"elapsed_s", m.elapsed_s},
                      {"since_start_s", m.since_start_s},
                      {"data_skipped", m.data_skipped},
                      {"comm_mb", m.comm_mb},
                      {"wall_time", wall_time}};
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  return j.dump();
}

// One JSON object per line, flushed at once so a reader (or a crash) never sees half a line.
void MetricsLogger::append_line(const std::string& json) {
  if (!file_) return;
  std::string line = json + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

void MetricsLogger::log_step(const StepMetrics& m) {
  // Colors as torchtitan: step cyan, loss green, memory yellow, throughput blue, mfu magenta.
  const char* cyan = color_ ? "\033[36m" : "";
  const char* green = color_ ? "\033[32m" : "";
  const char* yellow = color_ ? "\033[33m" : "";
  const char* blue = color_ ? "\033[34m" : "";
  const char* magenta = color_ ? "\033[35m" : "";
  const char* reset = color_ ? "\033[39m" : "";
  log::get("metrics")->info(
      "{}step: {:>5}  {}loss: {:8.4f}  {}grad_norm: {:7.4f}  {}memory: {:6.2f}GiB  {}tps: {:.0f}  "
      "{}tflops: {:.3f}  {}mfu: {:.2f}%{}",
      cyan, m.step, green, m.loss, reset, m.grad_norm, yellow, m.mem_peak_gib, blue, m.tps, reset,
      m.tflops, magenta, m.mfu_pct, reset);
  append_line(to_json_line(m, now_unix()));
}

void MetricsLogger::log_validation(int64_t step, double val_loss, int64_t tokens_seen,
                                   double elapsed_s) {
  log::get("metrics")->info("{}validate step: {:>5}  val_loss: {:8.4f}{}", color_ ? "\033[33m" : "",
                            step, val_loss, color_ ? "\033[39m" : "");
  nlohmann::json j = {{"step", step},
                      {"val_loss", val_loss},
                      {"tokens_seen", tokens_seen},
                      {"elapsed_s", elapsed_s},
                      {"wall_time", now_unix()}};
  append_line(j.dump());
}

double seconds_since_process_start() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - process_start).count();
}

double measure_cpu_gemm_flops() {
  // A square float32 GEMM big enough to reach the BLAS steady state, small enough to take well
  // under a second on two cores; the best of a few runs.
  at::NoGradGuard no_grad;
  const int64_t n = 1024;
  at::Tensor a = at::randn({n, n});
  at::Tensor b = at::randn({n, n});
  at::Tensor c = at::mm(a, b);  // warm-up
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    auto start = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * n * n * n / seconds);
  }
  return best;
}

double peak_flops(const at::Device& device, std::optional<double> override_tflops) {
  if (override_tflops) return *override_tflops * 1e12;
#if LOOM_WITH_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, device.index() < 0 ? 0 : device.index()) ==
        cudaSuccess) {
      if (auto flops = gpu_table_flops(properties.name)) return *flops;
      log::get("metrics")->warn(
          "no peak FLOP/s known for GPU '{}'; set metrics.peak_tflops for MFU", properties.name);
    }
    return 0;
  }
#else
  (void)gpu_table_flops;
#endif
  (void)device;
  return measure_cpu_gemm_flops();
}

double peak_memory_gib(const at::Device& device) {
#if LOOM_WITH_CUDA
  if (device.is_cuda()) {
    auto stats =
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
    return static_cast<double>(stats.allocated_bytes[0].peak) / (1024.0 * 1024.0 * 1024.0);
  }
#endif
  (void)device;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is in KiB
}

}  // namespace loom::metrics
