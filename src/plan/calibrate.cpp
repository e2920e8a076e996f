#include "loom/plan/calibrate.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/config/dump.h"
#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/metrics/metrics.h"
#include "loom/plan/memory_model.h"
#include "loom/plan/step_time_model.h"

extern char** environ;

namespace loom::plan {
namespace {

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

}  // namespace

Measurement measure_layout(const config::JobConfig& config, const Layout& layout,
                           const CalibrationOptions& options, const std::string& run_dir) {
  std::filesystem::create_directories(run_dir);
  const std::string job = run_dir + "/job.toml";
  const std::string toml = config::to_toml(with_layout(config, layout));
  {
    std::ifstream old(job);
    std::stringstream text;
    text << old.rdbuf();
    if (text.str() != toml) std::filesystem::remove(run_dir + "/done");  // another job
  }
  std::ofstream(job) << toml;
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
  // A finished run of the same job in --calibration-dir is read again (refitting needs no
  // new runs).
  const bool finished = std::filesystem::exists(run_dir + "/done");
  if (!finished) {
    std::filesystem::remove(run_dir + "/metrics.jsonl");
    const int rc = run_process(args, log);
    LOOM_CHECK_AS(InputError, rc == 0, "--calibrate: the run of ", layout.describe(),
                  " failed (exit ", rc, "); see ", log);
    std::ofstream(run_dir + "/done") << "1\n";
  }
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

namespace {

// The memory constants: activation_factor from AC none against full on one rank, the runtime
// from the 1-rank peak, then the distributed and FSDP runs' peaks beyond their tensors.
void fit_memory(const ModelShape& model, const config::JobConfig& config,
                const std::vector<Measurement>& runs, DeviceProfile& p) {
  const Measurement* none = nullptr;
  const Measurement* full = nullptr;
  for (const auto& m : runs) {
    if (m.layout.world() == 1 && m.layout.ac_mode == "none") none = &m;
    if (m.layout.world() == 1 && m.layout.ac_mode == "full") full = &m;
  }
  LOOM_CHECK_AS(InternalError, none != nullptr, "calibration needs a 1-rank run without AC");
  p.activation_factor = 1.0;
  p.runtime_bytes = p.distributed_runtime_bytes = p.fsdp_runtime_bytes = 0;
  p.allocator_factor = 1.0;
  if (full != nullptr) {
    const double counted = predict_memory(model, config, none->layout, p).component("activations") -
                           predict_memory(model, config, full->layout, p).component("activations");
    const double measured = none->peak_bytes - full->peak_bytes;
    if (counted > 0 && measured > 0)
      p.activation_factor = std::clamp(measured / counted, 0.1, 10.0);
  }
  p.runtime_bytes =
      std::max(0.0, none->peak_bytes - predict_memory(model, config, none->layout, p).tensor_bytes);
  auto mean_excess = [&](bool fsdp) {
    double sum = 0;
    int n = 0;
    for (const auto& m : runs) {
      if (m.layout.world() == 1 || (m.layout.fsdp_degree() > 1) != fsdp) continue;
      sum += m.peak_bytes - predict_memory(model, config, m.layout, p).peak_bytes;
      ++n;
    }
    return n > 0 ? std::max(0.0, sum / n) : 0.0;
  };
  p.distributed_runtime_bytes = mean_excess(false);
  p.fsdp_runtime_bytes = mean_excess(true);
}

// A run's predicted step = fixed + flops x (1 / efficiency) + wire x (1 / bandwidth) + steps x
// latency: the terms read off the model by evaluating it at chosen constants.
struct StepTerms {
  double fixed = 0, flops = 0, wire = 0, steps = 0, measured = 0;
};
StepTerms step_terms(const ModelShape& model, const config::JobConfig& config, const Measurement& m,
                     DeviceProfile probe) {
  auto at = [&](double efficiency, double gbps, double latency_us) {
    probe.model_efficiency = efficiency;
    probe.intra_node.bandwidth_gbps = probe.inter_node.bandwidth_gbps = gbps;
    probe.intra_node.latency_us = probe.inter_node.latency_us = latency_us;
    return predict_step_time(model, config, m.layout, probe).step_seconds;
  };
  StepTerms t;
  const double base = at(1.0, 1e12, 0);
  t.flops = at(0.5, 1e12, 0) - base;
  t.fixed = base - t.flops;
  t.wire = at(1.0, 1.0, 0) - base;      // at 1 GB/s
  t.steps = at(1.0, 1e12, 1e6) - base;  // at 1 s per ring step
  t.measured = m.step_seconds;
  return t;
}

// Non-negative least squares in (1 / efficiency, 1 / bandwidth, latency) over every run,
// residuals relative to the measured step (a 0.3 s run counts as much as a 3 s one): the best
// of the 2^3 subsets of free unknowns whose solution is non-negative.
std::array<double, 3> fit_step_constants(const std::vector<StepTerms>& terms) {
  std::array<double, 3> best = {1, 0, 0};
  double best_error = -1;
  for (int mask = 1; mask < 8; ++mask) {
    if ((mask & 1) == 0) continue;  // the compute rate is always fitted
    std::vector<int> free;
    for (int k = 0; k < 3; ++k) {
      if (mask & (1 << k)) free.push_back(k);
    }
    const size_t n = free.size();
    double ata[3][3] = {}, atb[3] = {};
    for (const auto& t : terms) {
      const double w = 1.0 / std::max(t.measured, 1e-9);
      const double col[3] = {t.flops * w, t.wire * w, t.steps * w};
      const double rhs = (t.measured - t.fixed) * w;
      for (size_t i = 0; i < n; ++i) {
        atb[i] += col[free[i]] * rhs;
        for (size_t j = 0; j < n; ++j) ata[i][j] += col[free[i]] * col[free[j]];
      }
    }
    // Gaussian elimination on the n x n normal equations.
    double x[3] = {};
    bool singular = false;
    for (size_t i = 0; i < n && !singular; ++i) {
      size_t pivot = i;
      for (size_t r = i + 1; r < n; ++r) {
        if (std::abs(ata[r][i]) > std::abs(ata[pivot][i])) pivot = r;
      }
      if (std::abs(ata[pivot][i]) < 1e-300) singular = true;
      std::swap(ata[i], ata[pivot]);
      std::swap(atb[i], atb[pivot]);
      for (size_t r = 0; r < n && !singular; ++r) {
        if (r == i) continue;
        const double f = ata[r][i] / ata[i][i];
        for (size_t c = 0; c < n; ++c) ata[r][c] -= f * ata[i][c];
        atb[r] -= f * atb[i];
      }
    }
    if (singular) continue;
    std::array<double, 3> solution = {0, 0, 0};
    bool negative = false;
    for (size_t i = 0; i < n; ++i) {
      x[i] = atb[i] / ata[i][i];
      negative = negative || x[i] < 0;
      solution[static_cast<size_t>(free[i])] = x[i];
    }
    if (negative || solution[0] <= 0) continue;
    double error = 0;
    for (const auto& t : terms) {
      const double predicted =
          t.fixed + t.flops * solution[0] + t.wire * solution[1] + t.steps * solution[2];
      error += std::pow((predicted - t.measured) / std::max(t.measured, 1e-9), 2);
    }
    if (best_error < 0 || error < best_error) {
      best_error = error;
      best = solution;
    }
  }
  return best;
}

}  // namespace

DeviceProfile fit_profile(const ModelShape& model, const config::JobConfig& config,
                          const DeviceProfile& start, double gemm_tflops,
                          const std::vector<Measurement>& runs) {
  DeviceProfile p = start;
  p.calibrated = true;
  p.description = start.description + " (calibrated)";
  if (gemm_tflops > 0) p.gemm_tflops = gemm_tflops;
  p.fsdp_overlap = 0;  // Gloo's collectives run on the ranks' own cores
  fit_memory(model, config, runs, p);
  std::vector<StepTerms> terms;
  for (const auto& m : runs) terms.push_back(step_terms(model, config, m, p));
  const auto [inverse_efficiency, seconds_per_gb, latency_s] = fit_step_constants(terms);
  // An efficiency past 1 means the in-process GEMM probe ran slow (a loaded machine): the rate
  // moves into gemm_tflops.
  const double efficiency = 1.0 / inverse_efficiency;
  p.model_efficiency = std::min(efficiency, 1.0);
  if (efficiency > 1.0) p.gemm_tflops *= efficiency;
  // Calibration measures the compute dtype's rate; where that is float32 (a CPU), both rates
  // are the one measured.
  if (start.fp32_gemm_tflops == start.gemm_tflops) p.fp32_gemm_tflops = p.gemm_tflops;
  p.intra_node.bandwidth_gbps = seconds_per_gb > 0 ? 1.0 / seconds_per_gb : 1e6;
  p.intra_node.latency_us = latency_s * 1e6;
  p.inter_node.bandwidth_gbps = p.intra_node.bandwidth_gbps;
  p.inter_node.latency_us = p.intra_node.latency_us;
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
  // Each layout `repeats` times, round-robin, keeping the fastest: a burst of load from other
  // processes then spoils one run of a layout, not the layout.
  std::vector<Measurement> runs(layouts.size());
  for (int pass = 0; pass < std::max(options.repeats, 1); ++pass) {
    for (size_t i = 0; i < layouts.size(); ++i) {
      log->info("calibration run {}/{} (pass {}): {}", i + 1, layouts.size(), pass + 1,
                layouts[i].describe());
      Measurement m =
          measure_layout(config, layouts[i], options, fmt::format("{}/run{}-{}", dir, i, pass));
      if (pass == 0 || m.step_seconds < runs[i].step_seconds) {
        m.peak_bytes = pass == 0 ? m.peak_bytes : runs[i].peak_bytes;
        runs[i] = m;
      }
    }
  }
  Calibration cal;
  cal.fitted = fit_profile(model, config, start, gemm, runs);
  cal.rows = compare(model, config, start, cal.fitted, runs);
  cal.report =
      fmt::format(
          "calibration on this machine ({} layouts x {} runs of {} steps; the fastest of steps "
          "3+):\n"
          "  gemm_tflops {:.4g}, model_efficiency {:.3g}, activation_factor {:.3g}, "
          "runtime_memory {} (+ {} distributed, + {} FSDP), loopback {:.3g} GB/s + {:.3g} "
          "us per ring step\n",
          runs.size(), std::max(options.repeats, 1), options.steps, cal.fitted.gemm_tflops,
          cal.fitted.model_efficiency, cal.fitted.activation_factor,
          format_bytes(cal.fitted.runtime_bytes),
          format_bytes(cal.fitted.distributed_runtime_bytes),
          format_bytes(cal.fitted.fsdp_runtime_bytes), cal.fitted.intra_node.bandwidth_gbps,
          cal.fitted.intra_node.latency_us) +
      comparison_table(cal.rows);
  return cal;
}

}  // namespace loom::plan
