#include "loom/metrics/metrics.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>

#include "loom/config/dump.h"
#include "loom/core/check.h"
#include "loom/core/clock.h"
#include "loom/core/cuda_support.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"
#include "loom/metrics/crc32c.h"
#include "loom/metrics/tensorboard.h"

namespace loom::metrics {
namespace {

// Taken while the program loads, before main: the reference for since_start_s.
const std::chrono::steady_clock::time_point process_start = std::chrono::steady_clock::now();

double seconds_between(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::optional<double> gpu_table_flops(const std::string& name) {
  struct Entry {
    const char* key;
    double flops;
  };
  // First match wins: the H100's PCIe and NVL cards before the SXM one.
  static const Entry table[] = {
      {"H100 PCIe", 756e12}, {"H100 NVL", 835e12}, {"H200", 989e12},  {"H100", 989e12},
      {"H800", 989e12},      {"GH200", 989e12},    {"B200", 2250e12}, {"B100", 1750e12},
      {"A100", 312e12},      {"A800", 312e12},     {"L40S", 362e12},  {"A10G", 125e12},
      {"V100", 125e12},      {"RTX 4090", 165e12},
  };
  for (const auto& entry : table) {
    if (name.find(entry.key) != std::string::npos) return entry.flops;
  }
  return std::nullopt;
}

MetricsSinks metrics_sinks(const config::JobConfig& config, int rank, bool color) {
  MetricsSinks sinks;
  const std::string& dump = config.job.dump_folder;
  const bool main_rank = rank == 0;
  if (main_rank) {
    sinks.jsonl_path = dump + "/metrics.jsonl";
    sinks.status_path = dump + "/run_status.json";
  }
  if (config.metrics.enable_tensorboard && (main_rank || config.metrics.save_for_all_ranks)) {
    sinks.tensorboard_folder =
        files::output_folder(dump, config.metrics.save_tb_folder, "metrics.save_tb_folder");
    if (config.metrics.save_for_all_ranks) {
      sinks.tensorboard_folder += "/rank_" + std::to_string(rank);
    }
  }
  sinks.total_steps = config.training.steps;
  sinks.color = color;
  return sinks;
}

MetricsLogger::MetricsLogger(MetricsSinks sinks) : sinks_(std::move(sinks)) {
  if (!sinks_.jsonl_path.empty()) {
    file_ = std::fopen(sinks_.jsonl_path.c_str(), "a");
    LOOM_CHECK_AS(IoError, file_ != nullptr, "cannot open metrics file '", sinks_.jsonl_path,
                  "': ", std::strerror(errno));
  }
}

MetricsLogger::MetricsLogger(const std::string& jsonl_path, bool color)
    : MetricsLogger(MetricsSinks{jsonl_path, "", "", 0, color}) {}

MetricsLogger::~MetricsLogger() {
  if (!finished_ && last_step_ > 0) {
    try {
      write_status("failed", last_step_);
    } catch (const std::exception&) {
      // Already unwinding from the failure the status would report.
    }
  }
  if (file_) std::fclose(file_);
}

std::string config_hash(const config::JobConfig& config) {
  const std::string toml = config::to_toml(config);
  return fmt::format("crc32c:{:08x}", crc32c(toml.data(), toml.size()));
}

std::string MetricsLogger::start_json_line(const RunStart& start, double since_start_s,
                                           double wall_time) {
  // A run id that differs between starts: the wall time, the host and the process.
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string run_id =
      fmt::format("{}-{}-{}", static_cast<int64_t>(wall_time), host, ::getpid());
  nlohmann::json j = {{"event", "start"},
                      {"run_id", run_id},
                      {"first_step", start.first_step},
                      {"resumed_from_step", start.resumed_from_step},
                      {"resumed_from", start.resumed_from},
                      {"config_hash", start.config_hash},
                      {"world_size", start.world_size},
                      {"layout", start.layout},
                      {"total_steps", start.total_steps},
                      {"peak_flops_source", start.peak_source},
                      {"elapsed_s", start.elapsed_s},
                      {"since_start_s", since_start_s},
                      {"wall_time", wall_time}};
  if (start.float8_linears + start.float8_grouped > 0) {
    j["float8_linears"] = start.float8_linears;
    j["float8_grouped"] = start.float8_grouped;
    j["float8_emulated"] = start.float8_emulated;
  }
  return j.dump();
}

void MetricsLogger::start_run(const RunStart& start) {
  const int64_t first_step = start.first_step;
  first_step_ = first_step;
  last_step_ = first_step - 1;
  peak_source_ = start.peak_source;
  append_line(start_json_line(start, seconds_since_process_start(), now_unix()));
  if (!sinks_.tensorboard_folder.empty()) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(sinks_.tensorboard_folder, first_step);
    log::get("metrics")->info("TensorBoard events in {}", tensorboard_->path());
  }
  write_status("running", last_step_);
}

void MetricsLogger::finish_run(const std::string& state, int64_t step) {
  finished_ = true;
  write_status(state, step);
}

// Small enough to rewrite whole each time; atomic so `loom metrics watch` never reads half.
void MetricsLogger::write_status(const std::string& state, int64_t step) {
  if (sinks_.status_path.empty()) return;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  nlohmann::json j = {{"state", state},
                      {"step", step},
                      {"first_step", first_step_},
                      {"total_steps", sinks_.total_steps},
                      {"pid", static_cast<int64_t>(::getpid())},
                      {"host", std::string(host)},
                      {"wall_time", now_unix()}};
  // A status file that cannot be written (disk full, a folder in its place) costs the watchers
  // their view, never the run: one warning per outage, and training goes on.
  try {
    files::write_atomic(sinks_.status_path, j.dump() + "\n");
    status_failing_ = false;
  } catch (const std::exception& e) {
    if (!status_failing_) {
      log::get("metrics")->warn("cannot write {} ({}); training continues without it",
                                sinks_.status_path, e.what());
    }
    status_failing_ = true;
  }
}

// Every number of the JSON line except the step itself and the wall time (the event's own).
void MetricsLogger::write_scalars(int64_t step, double wall_time, const std::string& json) {
  if (!tensorboard_) return;
  std::vector<std::pair<std::string, double>> scalars;
  const auto parsed = nlohmann::json::parse(json);  // alive for the loop (items() refers to it)
  for (const auto& [key, value] : parsed.items()) {
    if (key == "step" || key == "wall_time" || !value.is_number()) continue;
    scalars.emplace_back(key, value.get<double>());
  }
  tensorboard_->add_scalars(step, wall_time, scalars);
}

std::string MetricsLogger::to_json_line(const StepMetrics& m, double wall_time) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"grad_norm", m.grad_norm},
                      {"lr", m.lr},
                      {"tps", m.tps},
                      {"tflops", m.tflops},
                      {"mfu_pct", m.mfu_pct},
                      {"mfu_estimate", m.mfu_estimate},
                      {"mem_peak_gib", m.mem_peak_gib},
                      {"step_time_s", m.step_time_s},
                      {"data_time_pct", m.data_time_pct},
                      {"comm_wait_pct", m.comm_wait_pct},
                      {"tokens_seen", m.tokens_seen},
                      {"elapsed_s", m.elapsed_s},
                      {"since_start_s", m.since_start_s},
                      {"data_skipped", m.data_skipped},
                      {"comm_mb", m.comm_mb},
                      {"wall_time", wall_time}};
  for (const auto& [collective, mb] : m.comm_mb_by_collective) j["comm_mb/" + collective] = mb;
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  if (m.pp_bubble_pct) j["pp_bubble_pct"] = *m.pp_bubble_pct;
  if (m.skipped_steps) j["skipped_steps"] = *m.skipped_steps;
  for (const auto& [block, norm] : m.block_grad_norms) j["grad_norm/" + block] = norm;
  for (const auto& [key, value] : m.model_metrics) j[key] = value;
  if (m.quorum) {
    j["ft/quorum_id"] = m.quorum->quorum_id;
    j["ft/participants"] = m.quorum->participants;
    j["ft/replicas"] = m.quorum->replicas;
    if (m.quorum->healed_from) j["ft/healed_from"] = *m.quorum->healed_from;
    j["ft/discarded_steps"] = m.quorum->discarded_steps;
    j["ft/quorum_s"] = m.quorum->quorum_s;
  }
  if (m.breakdown) {
    for (size_t c = 0; c < kStepCategories; ++c) {
      j[std::string("breakdown/") + step_category_name(static_cast<StepCategory>(c)) + "_ms"] =
          m.breakdown->ms[c];
    }
    j["breakdown/overhead_pct"] = m.breakdown->overhead_pct;
    j["breakdown/ops_per_step"] = m.breakdown->operators_per_step;
  }
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
  const bool color = sinks_.color;
  const char* cyan = color ? "\033[36m" : "";
  const char* green = color ? "\033[32m" : "";
  const char* yellow = color ? "\033[33m" : "";
  const char* blue = color ? "\033[34m" : "";
  const char* magenta = color ? "\033[35m" : "";
  const char* reset = color ? "\033[39m" : "";
  // An MFU over a peak measured on this machine is an estimate, and says so.
  // Pipeline runs add their measured bubble (pp_bubble_pct).
  std::string bubble =
      m.pp_bubble_pct ? fmt::format("  bubble: {:.1f}%", *m.pp_bubble_pct) : std::string();
  if (m.quorum) {
    bubble +=
        fmt::format("  quorum: {} [{}]{}", m.quorum->quorum_id, m.quorum->participants,
                    m.quorum->healed_from ? fmt::format(" healed from {}", *m.quorum->healed_from)
                                          : std::string());
  }
  log::get("metrics")->info(
      "{}step: {:>5}  {}loss: {:8.4f}  {}grad_norm: {:7.4f}  {}memory: {:6.2f}GiB  {}tps: {:.0f}  "
      "{}tflops: {:.3f}  {}mfu: {}{:.2f}%{}{}{}",
      cyan, m.step, green, m.loss, reset, m.grad_norm, yellow, m.mem_peak_gib, blue, m.tps, reset,
      m.tflops, magenta, m.mfu_estimate ? "~" : "", m.mfu_pct, m.mfu_estimate ? " (est.)" : "",
      reset, bubble);
  if (m.breakdown) log::get("metrics")->info("{}", StepBreakdown::format(*m.breakdown));
  if (!warned_mfu_) {
    if (auto warning = mfu_warning(m.mfu_pct, {0, peak_source_, m.mfu_estimate})) {
      log::get("metrics")->warn("{}", *warning);
      warned_mfu_ = true;
    }
  }
  const double wall_time = now_unix();
  const std::string json = to_json_line(m, wall_time);
  append_line(json);
  write_scalars(m.step, wall_time, json);
  if (m.step > last_step_) {
    last_step_ = m.step;
    write_status("running", m.step);
  }
}

void MetricsLogger::log_validation(int64_t step, double val_loss, int64_t tokens_seen,
                                   double elapsed_s) {
  const bool color = sinks_.color;
  log::get("metrics")->info("{}validate step: {:>5}  val_loss: {:8.4f}{}", color ? "\033[33m" : "",
                            step, val_loss, color ? "\033[39m" : "");
  const double wall_time = now_unix();
  nlohmann::json j = {{"step", step},
                      {"val_loss", val_loss},
                      {"tokens_seen", tokens_seen},
                      {"elapsed_s", elapsed_s},
                      {"since_start_s", seconds_since_process_start()},
                      {"wall_time", wall_time}};
  append_line(j.dump());
  // TensorBoard gets val_loss only: tokens_seen and elapsed_s are the training line's tags.
  if (tensorboard_) tensorboard_->add_scalars(step, wall_time, {{"val_loss", val_loss}});
}

double seconds_since_process_start() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - process_start).count();
}

double measure_cpu_gemm_flops(int trials, double min_seconds) {
  // A square float32 GEMM big enough to reach the BLAS steady state. The best of many trials over
  // a quarter second: a trial slowed by another process only lowers that trial, so on a busy
  // machine the best one still comes close to what the cores can do.
  at::NoGradGuard no_grad;
  const int64_t n = 1024;
  at::Tensor a = at::randn({n, n});
  at::Tensor b = at::randn({n, n});
  at::Tensor c = at::mm(a, b);  // warm-up
  double best = 0;
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < trials || seconds_between(begin) < min_seconds; ++i) {
    if (i >= 4 * trials) break;
    auto start = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    best = std::max(best, 2.0 * n * n * n / seconds_between(start));
  }
  return best;
}

std::optional<std::string> mfu_warning(double mfu_pct, const PeakFlops& peak) {
  if (mfu_pct <= 100.0) return std::nullopt;
  return fmt::format(
      "MFU {:.0f}% is above 100%: {} is too low{}; set metrics.peak_tflops to the device's real "
      "peak for a trustworthy MFU",
      mfu_pct, peak.source.empty() ? "the peak" : peak.source,
      peak.estimate ? " (measured at start-up on a busy machine)" : "");
}

PeakFlops peak_flops(const at::Device& device, std::optional<double> override_tflops) {
  if (override_tflops) return {*override_tflops * 1e12, "metrics.peak_tflops", false};
  if (device.is_cuda()) {
    const device::CudaSupport* cuda = device::cuda_support();
    if (auto properties =
            cuda ? cuda->properties(device.index() < 0 ? 0 : device.index()) : std::nullopt) {
      if (auto flops = gpu_table_flops(properties->name)) {
        return {*flops, "GPU table (" + properties->name + ")", false};
      }
      log::get("metrics")->warn(
          "no peak FLOP/s known for GPU '{}'; set metrics.peak_tflops for MFU", properties->name);
    }
    return {0, "unknown GPU", false};
  }
  (void)device;
  const CpuPeak cpu = cpu_peak_flops(at::get_num_threads());
  if (cpu.flops <= 0) {
    log::get("metrics")->warn("no CPU clock in /proc/cpuinfo; set metrics.peak_tflops for MFU");
    return {0, "unknown CPU clock", false};
  }
  return {cpu.flops,
          fmt::format("CPU nominal: {} threads x {:.3f} GHz x {} float32 FLOP/cycle ({})",
                      at::get_num_threads(), cpu.ghz, cpu.flops_per_cycle, cpu.isa),
          false};
}

namespace {

// The nominal clock in GHz: the model name's "@ 2.60GHz" (the rated clock), else the first
// "cpu MHz" (a virtual machine's TSC clock); 0 when neither is there.
double nominal_ghz(const std::string& cpuinfo_path) {
  std::ifstream in(cpuinfo_path);
  std::string line;
  double mhz = 0;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const std::string value = line.substr(colon + 1);
    if (key == "model name") {
      const auto at = value.find('@');
      if (at != std::string::npos) {
        const double ghz = std::strtod(value.c_str() + at + 1, nullptr);
        if (ghz > 0 && value.find("GHz", at) != std::string::npos) return ghz;
      }
    } else if (key == "cpu MHz" && mhz == 0) {
      mhz = std::strtod(value.c_str(), nullptr);
    }
  }
  return mhz > 0 ? std::round(mhz) / 1000.0 : 0.0;
}

}  // namespace

CpuPeak cpu_peak_flops(int threads, const std::string& cpuinfo_path) {
  CpuPeak peak;
  peak.ghz = nominal_ghz(cpuinfo_path);
#if defined(__x86_64__) || defined(__i386__)
  if (__builtin_cpu_supports("avx512f")) {
    peak.flops_per_cycle = 64;
    peak.isa = "AVX-512";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    peak.flops_per_cycle = 32;
    peak.isa = "AVX2+FMA";
  } else if (__builtin_cpu_supports("avx")) {
    peak.flops_per_cycle = 16;
    peak.isa = "AVX";
  } else {
    peak.flops_per_cycle = 8;
    peak.isa = "SSE";
  }
#else
  peak.flops_per_cycle = 16;  // two 128-bit FMA pipes (NEON)
  peak.isa = "NEON";
#endif
  peak.flops = std::max(threads, 1) * peak.ghz * 1e9 * peak.flops_per_cycle;
  return peak;
}

double peak_memory_gib(const at::Device& device) {
  if (device.is_cuda()) {
    const device::CudaSupport* cuda = device::cuda_support();
    const double bytes =
        cuda ? cuda->peak_allocated_bytes(device.index() < 0 ? 0 : device.index()) : 0;
    return bytes / (1024.0 * 1024.0 * 1024.0);
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is in KiB
}

}  // namespace loom::metrics
