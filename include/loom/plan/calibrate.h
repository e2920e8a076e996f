// Calibrating a device profile on the machine at hand (`loom plan layout --calibrate`): times a
// few steps of scaled-down layouts of the job's model with real `loom launch ... train` runs on
// this machine's CPU ranks, reads their metrics.jsonl (step_time_s, mem_peak_gib) and fits the
// profile's free constants to them:
//   gemm_tflops          a float32 GEMM timed in this process (metrics' CPU GEMM probe)
//   model_efficiency     the 1-rank run's measured step over its predicted FLOPs time
//   runtime_memory       the 1-rank run's peak RSS less the tensors the model predicts
//   activation_factor    the change in measured peak between AC none and AC full over the
//                        predicted change (the per-block activation bytes)
//   runtime memory of distributed and of FSDP-sharded ranks: their peaks beyond the tensors
//   loopback bandwidth / latency   from FSDP runs on 2 and 4 ranks and TP on 2: the step time
//                        the compute does not explain, over the bytes and collective calls
//                        predicted (least squares)
// The report shows every run's analytic and calibrated predictions beside the measurement.
#pragma once

#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/plan/device_profile.h"
#include "loom/plan/layout.h"
#include "loom/plan/model_shape.h"

namespace loom::plan {

struct Measurement {
  Layout layout;
  double step_seconds = 0;  // the fastest step past the second (load only adds time)
  double peak_bytes = 0;    // rank 0's peak (RSS on CPU) at the last step
  double comm_bytes = 0;    // comm_mb per step, as bytes
};

struct CalibrationRow {
  Measurement measured;
  double analytic_step = 0, analytic_peak = 0;
  double calibrated_step = 0, calibrated_peak = 0;
};

struct Calibration {
  DeviceProfile fitted;
  std::vector<CalibrationRow> rows;
  std::string report;
};

struct CalibrationOptions {
  int steps = 6;
  int repeats = 2;          // runs of each layout, round-robin; the fastest counts
  std::string loom_binary;  // empty: this executable (/proc/self/exe)
  std::string work_dir;     // empty: a fresh folder under the system's temp dir
};

// Fits `start`'s constants to measurements of `config`'s model (pure: no runs).
DeviceProfile fit_profile(const ModelShape& model, const config::JobConfig& config,
                          const DeviceProfile& start, double gemm_tflops,
                          const std::vector<Measurement>& measurements);

// Rows of predicted (analytic with `start`, calibrated with `fitted`) against measured.
std::vector<CalibrationRow> compare(const ModelShape& model, const config::JobConfig& config,
                                    const DeviceProfile& start, const DeviceProfile& fitted,
                                    const std::vector<Measurement>& measurements);
std::string comparison_table(const std::vector<CalibrationRow>& rows);

// Runs `config` with `layout` for `steps` steps through `loom launch` and reads its metrics.
Measurement measure_layout(const config::JobConfig& config, const Layout& layout,
                           const CalibrationOptions& options, const std::string& run_dir);

// The calibration runs (1 rank AC none and full, FSDP on 2 and 4 ranks, TP on 2), the fit, the
// report.
Calibration calibrate_profile(const config::JobConfig& config, const DeviceProfile& start,
                              const CalibrationOptions& options);

}  // namespace loom::plan
