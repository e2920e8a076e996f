#include "loom/plan/calibrate.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "loom/config/dump.h"
#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/metrics/metrics.h"
#include "loom/plan/memory_model.h"
#include "loom/plan/step_time_model.h"

extern char** environ;

namespace loom::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Runs argv with stdout and stderr into `log`; returns the exit status.
int run_process(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  LOOM_CHECK_AS(IoError, rc == 0, "--calibrate: cannot start ", args[0], ": error ", rc);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The step time `profile` predicts for `m`, and its exposed communication.
StepTimePlan time_of(const ModelShape& model, const config::JobConfig& config, const Measurement& m,
                     const DeviceProfile& profile) {
  return predict_step_time(model, config, m.layout, profile);
}

}  // namespace

Measurement measure_layout(const config::JobConfig& config, const Layout& layout,
                           const CalibrationOptions& options, const std::string& run_dir) {
  std::filesystem::create_directories(run_dir);
  const std::string job = run_dir + "/job.toml";
  std::ofstream(job) << config::to_toml(with_layout(config, layout));
  const std::string binary = options.loom_binary.empty()
                                 ? std::filesystem::read_symlink("/proc/self/exe").string()
                                 : options.loom_binary;
  const std::vector<std::string> args = {binary,
                                         "launch",
                                         "--nproc-per-node",
                                         std::to_string(layout.world()),
                                         "--master-port",
                                         "0",
                                         "--",
                                         "train",
                                         "--config",
                                         job,
                                         "--training.steps",
                                         std::to_string(options.steps),
                                         "--metrics.log_freq",
                                         "1",
                                         "--job.dump_folder",
                                         run_dir,
                                         "--validation.enable",
                                         "false",
                                         "--checkpoint.enable",
                                         "false",
                                         "--metrics.enable_tensorboard",
                                         "false",
                                         "--profiling.enable_profiling",
                                         "false"};
  const std::string log = run_dir + "/launch.log";
  const int rc = run_process(args, log);
  LOOM_CHECK_AS(InputError, rc == 0, "--calibrate: the run of ", layout.describe(),
                " failed (exit ", rc, "); see ", log);
  std::ifstream in(run_dir + "/metrics.jsonl");
  Measurement m;
  m.layout = layout;
  std::vector<double> steps, comm;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("loss") || !j.contains("step_time_s")) continue;
    m.peak_bytes = j.value("mem_peak_gib", 0.0) * kGiB;
    // The first two steps warm up (allocations, connections).
    if (j.value("step", 0) <= 2) continue;
    steps.push_back(j.value("step_time_s", 0.0));
    comm.push_back(j.value("comm_mb", 0.0) * 1e6);
  }
  LOOM_CHECK_AS(InputError, !steps.empty(), "--calibrate: no step past the second in ", run_dir,
                "/metrics.jsonl (steps must be at least 3)");
  // The fastest step: other processes on a shared machine only ever add time.
  m.step_seconds = *std::min_element(steps.begin(), steps.end());
  m.comm_bytes = median(comm);
  return m;
}

DeviceProfile fit_profile(const ModelShape& model, const config::JobConfig& config,
                          const DeviceProfile& start, double gemm_tflops,
                          const std::vector<Measurement>& runs) {
  DeviceProfile p = start;
  p.calibrated = true;
  p.name = start.name;
  p.description = start.description + " (calibrated)";
  if (gemm_tflops > 0) p.gemm_tflops = gemm_tflops;
  p.fsdp_overlap = 0;  // Gloo's collectives run on the ranks' own cores
  const Measurement* none = nullptr;
  const Measurement* full = nullptr;
  std::vector<const Measurement*> sharded;
  for (const auto& m : runs) {
    if (m.layout.world() == 1 && m.layout.ac_mode == "none") none = &m;
    if (m.layout.world() == 1 && m.layout.ac_mode == "full") full = &m;
    if (m.layout.world() > 1) sharded.push_back(&m);
  }
  LOOM_CHECK_AS(InternalError, none != nullptr, "calibration needs a 1-rank run without AC");
  // Compute: the efficiency that makes the 1-rank run's predicted step its measured one. The
  // step is FLOPs / (rate x efficiency) + the optimizer's memory-bound pass: evaluated at
  // efficiencies 1 and 1/2 to separate the two.
  p.model_efficiency = 1.0;
  const double at_one = time_of(model, config, *none, p).compute_seconds;
  p.model_efficiency = 0.5;
  const double flops_seconds = time_of(model, config, *none, p).compute_seconds - at_one;
  const double optimizer_seconds = at_one - flops_seconds;
  p.model_efficiency =
      std::clamp(flops_seconds / std::max(none->step_seconds - optimizer_seconds, 1e-9), 1e-4, 1.0);
  // Activations: the measured difference between AC none and full over the counted one.
  p.activation_factor = 1.0;
  p.runtime_bytes = 0;
  p.allocator_factor = 1.0;
  const MemoryPlan mem_none = predict_memory(model, config, none->layout, p);
  if (full != nullptr) {
    const MemoryPlan mem_full = predict_memory(model, config, full->layout, p);
    const double counted = mem_none.component("activations") - mem_full.component("activations");
    const double measured = none->peak_bytes - full->peak_bytes;
    if (counted > 0 && measured > 0)
      p.activation_factor = std::clamp(measured / counted, 0.1, 10.0);
  }
  // Runtime: what the 1-rank peak holds beyond the tensors.
  p.runtime_bytes =
      std::max(0.0, none->peak_bytes - predict_memory(model, config, none->layout, p).tensor_bytes);
  // The distributed runs' peaks beyond that: the process groups' own memory (runs without
  // FSDP), then what FSDP holds beyond its counted buffers (FSDP runs).
  p.distributed_runtime_bytes = 0;
  p.fsdp_runtime_bytes = 0;
  auto mean_excess = [&](bool fsdp) {
    double sum = 0;
    int n = 0;
    for (const Measurement* m : sharded) {
      if ((m->layout.fsdp_degree() > 1) != fsdp) continue;
      sum += m->peak_bytes - predict_memory(model, config, m->layout, p).peak_bytes;
      ++n;
    }
    return n > 0 ? std::max(0.0, sum / n) : 0.0;
  };
  p.distributed_runtime_bytes = mean_excess(false);
  p.fsdp_runtime_bytes = mean_excess(true);
  // Links: the step time the compute leaves unexplained = a / bandwidth + b x latency, with a
  // and b read off the model by evaluating it at unit bandwidth and unit latency.
  std::vector<std::array<double, 3>> rows;  // a, b, unexplained seconds
  for (const Measurement* m : sharded) {
    DeviceProfile probe = p;
    probe.intra_node = {p.intra_node.name, 1e12, 0};
    probe.inter_node = probe.intra_node;
    const double compute = time_of(model, config, *m, probe).step_seconds;
    probe.intra_node.bandwidth_gbps = 1;
    probe.inter_node = probe.intra_node;
    const double a = time_of(model, config, *m, probe).step_seconds - compute;
    probe.intra_node = {p.intra_node.name, 1e12, 1e6};  // 1 s per ring step
    probe.inter_node = probe.intra_node;
    const double b = time_of(model, config, *m, probe).step_seconds - compute;
    rows.push_back({a, b, m->step_seconds - compute});
  }
  double inv_bw = 1.0 / p.intra_node.bandwidth_gbps, latency_s = p.intra_node.latency_us * 1e-6;
  if (rows.size() >= 2) {
    // Least squares in (1/bandwidth, latency), both kept non-negative.
    double saa = 0, sab = 0, sbb = 0, sat = 0, sbt = 0;
    for (const auto& [a, b, t] : rows) {
      saa += a * a;
      sab += a * b;
      sbb += b * b;
      sat += a * t;
      sbt += b * t;
    }
    const double det = saa * sbb - sab * sab;
    if (std::abs(det) > 1e-12 * saa * sbb) {
      inv_bw = (sat * sbb - sbt * sab) / det;
      latency_s = (saa * sbt - sab * sat) / det;
    }
    if (inv_bw <= 0 || latency_s < 0) {  // one unknown only: the bandwidth, latency as it was
      latency_s = std::max(latency_s, 0.0);
      double num = 0, den = 0;
      for (const auto& [a, b, t] : rows) {
        num += a * (t - b * latency_s);
        den += a * a;
      }
      inv_bw = den > 0 ? std::max(num / den, 1e-6) : inv_bw;
    }
  } else if (rows.size() == 1 && rows[0][0] > 0) {
    inv_bw = std::max((rows[0][2] - rows[0][1] * latency_s) / rows[0][0], 1e-6);
  }
  p.intra_node.bandwidth_gbps = 1.0 / inv_bw;
  p.intra_node.latency_us = latency_s * 1e6;
  p.inter_node = p.intra_node;
  p.inter_node.name = start.inter_node.name;
  return p;
}

std::vector<CalibrationRow> compare(const ModelShape& model, const config::JobConfig& config,
                                    const DeviceProfile& start, const DeviceProfile& fitted,
                                    const std::vector<Measurement>& runs) {
  std::vector<CalibrationRow> rows;
  for (const auto& m : runs) {
    CalibrationRow r;
    r.measured = m;
    r.analytic_step = predict_step_time(model, config, m.layout, start).step_seconds;
    r.analytic_peak = predict_memory(model, config, m.layout, start).peak_bytes;
    r.calibrated_step = predict_step_time(model, config, m.layout, fitted).step_seconds;
    r.calibrated_peak = predict_memory(model, config, m.layout, fitted).peak_bytes;
    rows.push_back(r);
  }
  return rows;
}

std::string comparison_table(const std::vector<CalibrationRow>& rows) {
  std::string out =
      fmt::format("{:<46} {:>9} {:>9} {:>9} {:>7} | {:>9} {:>9} {:>9} {:>7}\n", "layout", "step s",
                  "analytic", "calib.", "err", "peak GiB", "analytic", "calib.", "err");
  for (const auto& r : rows) {
    const double ms = r.measured.step_seconds, mp = r.measured.peak_bytes / kGiB;
    out += fmt::format(
        "{:<46} {:>9.3f} {:>9.3f} {:>9.3f} {:>6.1f}% | {:>9.3f} {:>9.3f} {:>9.3f} {:>6.1f}%\n",
        r.measured.layout.describe().substr(0, 46), ms, r.analytic_step, r.calibrated_step,
        100.0 * (r.calibrated_step - ms) / ms, mp, r.analytic_peak / kGiB, r.calibrated_peak / kGiB,
        100.0 * (r.calibrated_peak / kGiB - mp) / mp);
  }
  return out;
}

Calibration calibrate_profile(const config::JobConfig& config, const DeviceProfile& start,
                              const CalibrationOptions& options) {
  LOOM_CHECK_AS(InputError, start.node_shares_compute,
                "--calibrate runs CPU ranks on this machine: use it with --device cpu (or a "
                "profile with node_shares_compute = true); GPU calibration is not implemented");
  auto log = log::get("plan");
  const ModelShape model = read_model_shape(config, 0);
  const std::string dir =
      options.work_dir.empty()
          ? (std::filesystem::temp_directory_path() / fmt::format("loom-calibrate-{}", ::getpid()))
                .string()
          : options.work_dir;
  const double gemm = metrics::measure_cpu_gemm_flops() / 1e12;
  log->info("calibrating on this machine: float32 GEMM {:.3f} TFLOP/s; runs under {}", gemm, dir);
  // Scaled-down layouts of the job's model: 1 rank with and without checkpointing, FSDP on
  // 2 and 4 ranks, each one local batch per step.
  std::vector<Layout> layouts;
  Layout one;
  one.local_batch_size = config.training.local_batch_size;
  one.ac_mode = "none";
  layouts.push_back(one);
  Layout full = one;
  full.ac_mode = "full";
  layouts.push_back(full);
  for (int64_t ranks : {2, 4}) {
    Layout fsdp = one;
    fsdp.dp_shard = ranks;
    layouts.push_back(fsdp);
  }
  Layout tp = one;  // many small collectives on the critical path: the latency
  tp.tp = 2;
  layouts.push_back(tp);
  std::vector<Measurement> runs;
  for (size_t i = 0; i < layouts.size(); ++i) {
    log->info("calibration run {}/{}: {}", i + 1, layouts.size(), layouts[i].describe());
    runs.push_back(measure_layout(config, layouts[i], options, fmt::format("{}/run{}", dir, i)));
  }
  Calibration cal;
  cal.fitted = fit_profile(model, config, start, gemm, runs);
  cal.rows = compare(model, config, start, cal.fitted, runs);
  cal.report = fmt::format(
                   "calibration on this machine ({} runs of {} steps; the fastest of steps 3+):\n"
                   "  gemm_tflops {:.4g}, model_efficiency {:.3g}, activation_factor {:.3g}, "
                   "runtime_memory {} (+ {} distributed, + {} FSDP), loopback {:.3g} GB/s + {:.3g} "
                   "us per ring step\n",
                   runs.size(), options.steps, cal.fitted.gemm_tflops, cal.fitted.model_efficiency,
                   cal.fitted.activation_factor, format_bytes(cal.fitted.runtime_bytes),
                   format_bytes(cal.fitted.distributed_runtime_bytes),
                   format_bytes(cal.fitted.fsdp_runtime_bytes),
                   cal.fitted.intra_node.bandwidth_gbps, cal.fitted.intra_node.latency_us) +
               comparison_table(cal.rows);
  return cal;
}

}  // namespace loom::plan
