// Numbers a user can trust (issue 19): MFU over a measured CPU peak is marked as an estimate and
// warned about above 100%; metrics.jsonl's start record tells runs apart and has the same time
// keys as the step rows.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "loom/config/job_config.h"
#include "loom/metrics/metrics.h"

namespace {

using loom::metrics::MetricsLogger;
using loom::metrics::PeakFlops;

TEST(MetricsHonesty, ConfiguredPeakIsTrustedCpuPeakIsOneDocumentedNumber) {
  const auto configured = loom::metrics::peak_flops(at::Device(at::kCPU), 2.0);
  EXPECT_DOUBLE_EQ(configured.flops, 2e12);
  EXPECT_FALSE(configured.estimate);
  EXPECT_EQ(configured.source, "metrics.peak_tflops");
  // Nothing is timed: two runs on one machine divide by the same peak (they re-measured a GEMM
  // before, and two runs of one model reported different MFUs).
  const auto first = loom::metrics::peak_flops(at::Device(at::kCPU), std::nullopt);
  const auto second = loom::metrics::peak_flops(at::Device(at::kCPU), std::nullopt);
  EXPECT_GT(first.flops, 0);
  EXPECT_EQ(first.flops, second.flops);
  EXPECT_EQ(first.source, second.source);
  EXPECT_NE(first.source.find("CPU nominal"), std::string::npos) << first.source;
}

// The documented formula: threads x nominal clock x float32 FLOPs per cycle of the ISA.
// The H100's three cards have three peaks (torchtitan's numbers): MFU on a PCIe or NVL card was
// divided by the SXM card's 989 TFLOP/s.
TEST(MetricsHonesty, GpuPeakTellsTheH100CardsApart) {
  EXPECT_EQ(loom::metrics::gpu_table_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(loom::metrics::gpu_table_flops("NVIDIA H100 NVL"), 835e12);
  EXPECT_EQ(loom::metrics::gpu_table_flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(loom::metrics::gpu_table_flops("NVIDIA H200"), 989e12);
  EXPECT_FALSE(loom::metrics::gpu_table_flops("Some Future GPU").has_value());
}

TEST(MetricsHonesty, CpuPeakIsThreadsTimesClockTimesFlopsPerCycle) {
  const std::string dir = ::testing::TempDir();
  const std::string rated = dir + "/cpuinfo_rated";
  std::ofstream(rated) << "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Gold 6248 CPU @ "
                          "2.50GHz\ncpu MHz\t\t: 3100.000\n";
  const auto peak = loom::metrics::cpu_peak_flops(4, rated);
  EXPECT_DOUBLE_EQ(peak.ghz, 2.5);  // the rated clock, not the current one
  EXPECT_DOUBLE_EQ(peak.flops, 4 * 2.5e9 * peak.flops_per_cycle);
  EXPECT_TRUE(peak.flops_per_cycle == 64 || peak.flops_per_cycle == 32 ||
              peak.flops_per_cycle == 16 || peak.flops_per_cycle == 8);
  const std::string vm = dir + "/cpuinfo_vm";
  std::ofstream(vm) << "model name\t: AMD EPYC\ncpu MHz\t\t: 2445.432\n";
  EXPECT_DOUBLE_EQ(loom::metrics::cpu_peak_flops(2, vm).ghz, 2.445);
  EXPECT_EQ(loom::metrics::cpu_peak_flops(2, dir + "/no_such_file").flops, 0);
}

TEST(MetricsHonesty, MfuAboveHundredPercentIsWarnedAbout) {
  const PeakFlops measured{1e11, "measured CPU GEMM", true};
  EXPECT_FALSE(loom::metrics::mfu_warning(99.5, measured).has_value());
  const auto warning = loom::metrics::mfu_warning(126, measured);
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("126% is above 100%"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("metrics.peak_tflops"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("measured CPU GEMM"), std::string::npos) << *warning;
}

TEST(MetricsHonesty, StepRowsSayWhetherMfuIsAnEstimate) {
  loom::metrics::StepMetrics m;
  m.step = 3;
  m.mfu_pct = 40;
  m.mfu_estimate = true;
  auto row = nlohmann::json::parse(MetricsLogger::to_json_line(m, 1.0e9));
  EXPECT_EQ(row["mfu_estimate"], true);
  m.mfu_estimate = false;
  row = nlohmann::json::parse(MetricsLogger::to_json_line(m, 1.0e9));
  EXPECT_EQ(row["mfu_estimate"], false);
}

TEST(MetricsHonesty, StartRecordTellsRunsApartAndHasNoStep) {
  loom::metrics::RunStart start;
  start.first_step = 61;
  start.total_steps = 62;
  start.resumed_from_step = 60;
  start.resumed_from = "out/checkpoint/step-60";
  start.config_hash = loom::metrics::config_hash(loom::config::JobConfig{});
  start.world_size = 2;
  start.layout = "pp 1, dp_replicate 1, dp_shard 2, cp 1, tp 1";
  start.elapsed_s = 12.5;
  const auto record = nlohmann::json::parse(MetricsLogger::start_json_line(start, 3.0, 1.7e9));
  EXPECT_EQ(record["event"], "start");
  EXPECT_FALSE(record.contains("step")) << "readers of step rows would take it for one";
  EXPECT_EQ(record["resumed_from_step"], 60);
  EXPECT_EQ(record["first_step"], 61);
  EXPECT_EQ(record["world_size"], 2);
  EXPECT_EQ(record["elapsed_s"], 12.5);
  for (const char* key : {"run_id", "config_hash", "layout", "since_start_s", "wall_time"}) {
    EXPECT_TRUE(record.contains(key)) << key;
  }
  // The hash follows the config.
  auto other = loom::config::JobConfig{};
  other.training.steps += 1;
  EXPECT_NE(loom::metrics::config_hash(other), start.config_hash);
  EXPECT_EQ(loom::metrics::config_hash(loom::config::JobConfig{}), start.config_hash);
}

}  // namespace
