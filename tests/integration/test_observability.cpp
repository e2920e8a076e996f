// Observability end to end: TensorBoard event files read back by TensorBoard's own reader
// against metrics.jsonl (also across a resume), per-block gradient norms, profiler traces, the
// start-up memory estimate, `loom metrics plot | summary | watch`, and flight-recorder dumps on
// SIGUSR1 through `loom launch`.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "loom/core/check.h"
#include "loom/metrics/profiler.h"
#include "loom/train/trainer.h"
#include "support/jobs.h"
#include "support/process.h"

using loom::config::JobConfig;
using loom::testing::fresh_temp_dir;
using loom::testing::read_text;
using loom::testing::run_command;
using loom::testing::run_loom;
using loom::train::Trainer;
using nlohmann::json;

namespace {

namespace fs = std::filesystem;

JobConfig small_job(const std::string& name) {
  return loom::testing::small_job(fresh_temp_dir("obs_" + name));
}

// The step and validation rows (each start of a run also writes a start record, without step).
std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  std::string line;
  while (std::getline(in, line)) {
    auto row = json::parse(line);
    if (row.contains("step")) lines.push_back(std::move(row));
  }
  return lines;
}

// {tag: {step: value}} as TensorBoard's EventAccumulator reads the folder; fails the test (and
// names the reason) when a step appears twice.
std::map<std::string, std::map<int64_t, double>> read_tensorboard(const std::string& folder) {
  const std::string out = folder + "/../tensorboard_scalars.json";
  auto result = run_command(std::string(LOOM_PYTHON) +
                            " " LOOM_SOURCE_DIR "/tests/python/read_tensorboard.py " + folder +
                            " " + out + " 2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const json all = json::parse(read_text(out));
  std::map<std::string, std::map<int64_t, double>> tags;
  for (auto it = all.begin(); it != all.end(); ++it) {
    auto& points = tags[it.key()];
    for (const auto& p : it.value()) {
      const auto step = p.at(0).get<int64_t>();
      EXPECT_EQ(points.count(step), 0u) << it.key() << " has step " << step << " twice";
      points[step] = p.at(1).get<double>();
    }
  }
  return tags;
}

// TensorBoard stores float32.
void expect_float_close(double want, double got, const std::string& what) {
  EXPECT_NEAR(got, want, 1e-6 * std::max(1.0, std::fabs(want))) << what;
}

}  // namespace

TEST(TensorBoard, EveryScalarOfMetricsJsonlReadsBackWithBlockGradNorms) {
  auto job = small_job("tb");
  job.metrics.enable_tensorboard = true;
  job.metrics.log_layer_grad_norms = true;
  job.metrics.step_breakdown = true;
  job.validation.enable = true;
  job.validation.dataset = "synthetic";
  job.validation.freq = 3;
  job.validation.steps = 1;
  job.validation.seq_len = 32;
  job.validation.local_batch_size = 2;
  Trainer(job).train();
  const std::string dump = job.job.dump_folder;
  const auto tags = read_tensorboard(dump + "/tb");
  int checked = 0, blocks = 0;
  for (const auto& line : read_jsonl(dump + "/metrics.jsonl")) {
    const int64_t step = line["step"];
    if (line.contains("val_loss") && !line.contains("loss")) {
      expect_float_close(line["val_loss"], tags.at("val_loss").at(step), "val_loss");
      ++checked;
      continue;
    }
    double sum_squares = 0;
    for (const auto& [key, value] : line.items()) {
      // Flags (mfu_estimate) are not scalars.
      if (key == "step" || key == "wall_time" || value.is_boolean()) continue;
      ASSERT_TRUE(tags.count(key)) << "no TensorBoard tag " << key;
      ASSERT_TRUE(tags.at(key).count(step)) << key << " lacks step " << step;
      expect_float_close(value.get<double>(), tags.at(key).at(step), key);
      ++checked;
      if (key.rfind("grad_norm/", 0) == 0) {
        sum_squares += value.get<double>() * value.get<double>();
        ++blocks;
      }
    }
    // The blocks partition the model: their norms add up (in squares) to the total.
    EXPECT_NEAR(std::sqrt(sum_squares), line["grad_norm"].get<double>(),
                1e-6 * line["grad_norm"].get<double>());
    EXPECT_TRUE(line.contains("grad_norm/layers.0") && line.contains("grad_norm/tok_embeddings") &&
                line.contains("grad_norm/output"))
        << line.dump();
    // metrics.step_breakdown: the categories split the step's time.
    double categories = 0;
    for (const char* c : {"gemm", "attention", "elementwise", "optimizer", "comm_wait", "data",
                          "other"}) {
      categories += line.at(std::string("breakdown/") + c + "_ms").get<double>();
    }
    const double step_ms = 1e3 * line["step_time_s"].get<double>();
    EXPECT_NEAR(categories, step_ms, 0.05 * step_ms + 1.0) << line.dump();
    EXPECT_GT(line["breakdown/gemm_ms"].get<double>(), 0);
    EXPECT_GT(line["breakdown/attention_ms"].get<double>(), 0);
    EXPECT_GT(line["breakdown/elementwise_ms"].get<double>(), 0);
  }
  EXPECT_TRUE(fs::exists(dump + "/step_breakdown/rank0.json"));
  EXPECT_EQ(tags.at("loss").size(), 4u);  // steps 1, 2, 4, 6
  EXPECT_EQ(tags.at("val_loss").size(), 2u);
  EXPECT_GT(blocks, 0);
  EXPECT_GT(checked, 60);
}

TEST(TensorBoard, ResumedRunAppendsAFileAndShowsOneCurve) {
  auto job = small_job("tb_resume");
  job.metrics.enable_tensorboard = true;
  job.metrics.log_freq = 1;
  job.checkpoint.enable = true;
  job.checkpoint.interval = 4;
  job.checkpoint.keep_latest_k = 0;
  Trainer(job).train();
  const std::string dump = job.job.dump_folder;
  // The run "crashed" after step 6 with its last checkpoint at step 4: steps 5-6 are redone,
  // with another learning rate so the redone values differ from the first ones.
  fs::remove_all(dump + "/checkpoint/step-6");
  job.training.steps = 8;
  job.optimizer.lr = 1e-3;
  Trainer(job).train();
  int files = 0;
  for (const auto& item : fs::directory_iterator(dump + "/tb")) {
    files += item.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_EQ(files, 2);
  std::map<int64_t, json> latest;  // what the runs computed last for each step
  for (const auto& line : read_jsonl(dump + "/metrics.jsonl")) latest[line["step"]] = line;
  const auto tags = read_tensorboard(dump + "/tb");
  ASSERT_EQ(tags.at("loss").size(), 8u);
  for (const auto& [step, line] : latest) {
    expect_float_close(line["loss"], tags.at("loss").at(step), "loss at " + std::to_string(step));
    expect_float_close(line["lr"], tags.at("lr").at(step), "lr at " + std::to_string(step));
  }
  EXPECT_NE(latest.at(5)["lr"], 0.0);
}

TEST(Profiler, TraceOfTheRecordedStepHoldsTheModelOps) {
  const std::string dump = fresh_temp_dir("obs_profiler");
  auto result = run_loom(
      "train --job.dump_folder " + dump +
      " --training.steps 4 --training.seq_len 32 --training.local_batch_size 2 --training.device "
      "cpu --training.dataset synthetic --metrics.peak_tflops 1 --validation.enable false "
      "--profiling.enable_profiling true "
      "--profiling.profile_freq 2 --profiling.profiler_warmup 0 --profiling.profiler_active 1 "
      "--profiling.enable_memory_snapshot true");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // CPU: the memory snapshot key says why there is none.
  EXPECT_NE(result.output.find("snapshots come from the CUDA caching allocator"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("estimated peak memory per rank"), std::string::npos);
  for (int step : {2, 4}) {
    const std::string path =
        dump + "/profile_traces/iteration_" + std::to_string(step) + "/rank0_trace.json";
    ASSERT_TRUE(fs::exists(path)) << path << "\n" << result.output;
    const json trace = json::parse(read_text(path));
    std::map<std::string, int> names;
    for (const auto& event : trace["traceEvents"]) {
      if (event.contains("name")) names[event["name"].get<std::string>()]++;
    }
    EXPECT_TRUE(names.count("ProfilerStep#" + std::to_string(step)));
    for (const char* op : {"aten::embedding", "aten::mm",
                           "aten::_scaled_dot_product_flash_attention_for_cpu",
                           // loom's fused CPU kernels: the model and loss take each of them
                           "loom::kernel_rms_norm", "loom::kernel_swiglu", "loom::kernel_rotary",
                           "loom::kernel_cross_entropy", "loom::kernel_cross_entropy_backward",
                           "loom::kernel_squared_norm"}) {
      EXPECT_TRUE(names.count(op)) << op << " not in the trace of step " << step;
    }
  }
  EXPECT_FALSE(fs::exists(dump + "/profile_traces/iteration_1"));
}

TEST(Profiler, OutOfMemoryErrorNamesTheStepAndDevice) {
  auto job = small_job("oom");
  loom::metrics::StepProfiler profiler(job, 0, at::Device(at::kCPU));
  try {
    profiler.out_of_memory(7, "DefaultCPUAllocator: not enough memory");
    FAIL() << "no exception";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.message(), "step 7: out of memory on cpu: DefaultCPUAllocator: not enough memory");
  }
}

namespace {

// A finished 6-step run with validation, shared by the metrics-tool tests.
std::string finished_run(const std::string& name, double lr) {
  auto job = small_job(name);
  job.metrics.log_freq = 1;
  job.optimizer.lr = lr;
  job.validation.enable = true;
  job.validation.dataset = "synthetic";
  job.validation.freq = 3;
  job.validation.steps = 1;
  job.validation.seq_len = 32;
  job.validation.local_batch_size = 2;
  Trainer(job).train();
  return job.job.dump_folder;
}

bool wait_until(const std::function<bool()>& done, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return true;
}

}  // namespace

TEST(MetricsTools, PlotRendersSummaryAndWatchReadTheRun) {
  const std::string a = finished_run("tools_a", 3e-3);
  const std::string b = finished_run("tools_b", 1e-3);
  const std::string svg = a + "/plot.svg";
  auto plot = run_loom("metrics plot " + a + " " + b + " -o " + svg);
  ASSERT_EQ(plot.exit_code, 0) << plot.output;
  const std::string text = read_text(svg);
  EXPECT_NE(text.find("obs_tools_a"), std::string::npos);  // the legend names both runs
  EXPECT_NE(text.find("obs_tools_b"), std::string::npos);
  EXPECT_NE(text.find("stroke-dasharray"), std::string::npos);  // val_loss
  // Renders with librsvg (what GNOME, Wikipedia and many CIs use) into a non-trivial PNG.
  auto png = run_command("rsvg-convert -o " + a + "/plot.png " + svg + " 2>&1");
  ASSERT_EQ(png.exit_code, 0) << png.output;
  EXPECT_GT(fs::file_size(a + "/plot.png"), 20000u);
  EXPECT_NE(run_loom("metrics plot " + a + " -o " + a + "/plot.png").exit_code, 0);
  EXPECT_EQ(run_loom("metrics plot /nonexistent -o " + svg).exit_code, 2);
  auto by_tokens = run_loom("metrics plot " + a + " -o " + a + "/tokens.svg --x tokens");
  ASSERT_EQ(by_tokens.exit_code, 0) << by_tokens.output;
  EXPECT_NE(read_text(a + "/tokens.svg").find(">tokens</text>"), std::string::npos);

  auto summary = run_loom("metrics summary " + a + " --format json");
  ASSERT_EQ(summary.exit_code, 0) << summary.output;
  const json s = json::parse(summary.output);
  const auto lines = read_jsonl(a + "/metrics.jsonl");
  double lowest = 1e9;
  for (const auto& l : lines) {
    if (l.contains("loss")) lowest = std::min(lowest, l["loss"].get<double>());
  }
  EXPECT_EQ(s["last_step"], 6);
  EXPECT_EQ(s["state"], "finished");
  EXPECT_DOUBLE_EQ(s["metrics"]["loss"]["best"].get<double>(), lowest);
  EXPECT_DOUBLE_EQ(s["metrics"]["loss"]["last"].get<double>(),
                   lines[lines.size() - 1].contains("loss")
                       ? lines.back()["loss"].get<double>()
                       : lines[lines.size() - 2]["loss"].get<double>());
  EXPECT_TRUE(s["metrics"].contains("val_loss"));
  EXPECT_FALSE(s["metrics"]["lr"].contains("best"));
  auto table = run_loom("metrics summary " + a);
  EXPECT_NE(table.output.find("loss"), std::string::npos) << table.output;

  auto watch = run_loom("metrics watch " + a + " --compare " + b + " --once");
  ASSERT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_NE(watch.output.find("FINISHED at step 6"), std::string::npos) << watch.output;
  EXPECT_NE(watch.output.find("step 6/6"), std::string::npos) << watch.output;
  EXPECT_NE(watch.output.find("val_loss"), std::string::npos) << watch.output;
  EXPECT_NE(watch.output.find("compare at step 6"), std::string::npos) << watch.output;
}

// `loom metrics watch` in a terminal (tmux) beside a job that is running, then stopped.
TEST(MetricsTools, WatchShowsARunningJobInTmux) {
  ASSERT_EQ(run_command("command -v tmux").exit_code, 0) << "tmux is missing (scripts/setup.sh)";
  const std::string dump = fresh_temp_dir("obs_watch");
  const std::string session = "loom_watch_" + std::to_string(::getpid());
  const std::string train =
      std::string(LOOM_BINARY) + " train --job.dump_folder " + dump +
      " --training.steps 100000 --training.seq_len 32 --training.local_batch_size 2"
      " --training.device cpu --training.dataset synthetic --metrics.log_freq 1"
      " --metrics.peak_tflops 1"
      " --validation.enable false";
  ASSERT_EQ(
      run_command("tmux new-session -d -s " + session + " -x 150 -y 40 '" + train + "'").exit_code,
      0);
  auto cleanup = [&] { run_command("tmux kill-session -t " + session + " 2>/dev/null"); };
  const bool started = wait_until([&] { return fs::exists(dump + "/metrics.jsonl"); }, 60);
  if (!started) cleanup();
  ASSERT_TRUE(started);
  run_command("tmux new-window -t " + session + " '" + std::string(LOOM_BINARY) +
              " metrics watch " + dump + " --interval 0.3'");
  std::string screen;
  auto capture = [&] {
    screen = run_command("tmux capture-pane -p -t " + session + ":1").output;
    return screen;
  };
  const bool running =
      wait_until([&] { return capture().find("RUNNING: last step") != std::string::npos; }, 30);
  EXPECT_TRUE(running) << screen;
  EXPECT_NE(screen.find("step "), std::string::npos) << screen;
  EXPECT_NE(screen.find("/100000 ["), std::string::npos) << screen;
  EXPECT_NE(screen.find("ETA"), std::string::npos) << screen;
  EXPECT_NE(screen.find("loss"), std::string::npos) << screen;
  // Ctrl-C to the trainer: it finishes its step and stops; the view says so.
  run_command("tmux send-keys -t " + session + ":0 C-c");
  const bool stopped =
      wait_until([&] { return capture().find("STOPPED by a signal") != std::string::npos; }, 30);
  EXPECT_TRUE(stopped) << screen;
  cleanup();
}

// SIGUSR1 to `loom launch` reaches every worker: each dumps its flight recorder, and `loom debug
// hang` finds nothing wrong with a healthy job. The job is FSDP over 2 ranks, which also checks
// that per-block gradient norms sum their shards over the ranks, and TensorBoard for all ranks.
TEST(FlightRecorderDumps, SigUsr1ToTheLauncherDumpsEveryRank) {
  const std::string dump = fresh_temp_dir("obs_sigusr1");
  const std::string log = dump + "/launch.log";
  const std::string command =
      std::string(LOOM_BINARY) + " launch --nproc-per-node 2 --master-port " +
      std::to_string(loom::testing::free_port()) + " -- train --job.dump_folder " + dump +
      " --training.steps 100000 --training.seq_len 32 --training.local_batch_size 2"
      " --training.device cpu --training.dataset synthetic --metrics.log_freq 1"
      " --metrics.peak_tflops 1"
      " --validation.enable false --parallelism.data_parallel_shard_degree 2"
      " --metrics.enable_tensorboard true --metrics.save_for_all_ranks true"
      " --metrics.log_layer_grad_norms true";
  auto started = run_command(command + " > " + log + " 2>&1 & echo $!");
  const std::string pid = started.output.substr(0, started.output.find('\n'));
  ASSERT_FALSE(pid.empty());
  auto kill = [&](const char* signal) { run_command("kill -" + std::string(signal) + " " + pid); };
  const bool training = wait_until(
      [&] { return read_text(dump + "/metrics.jsonl").find("\"step\":3") != std::string::npos; },
      90);
  if (!training) kill("KILL");
  ASSERT_TRUE(training) << read_text(log);
  kill("USR1");
  const bool dumped = wait_until(
      [&] {
        return fs::exists(dump + "/comm_traces/rank_0.json") &&
               fs::exists(dump + "/comm_traces/rank_1.json");
      },
      30);
  kill("TERM");
  wait_until([&] { return run_command("kill -0 " + pid + " 2>/dev/null").exit_code != 0; }, 60);
  ASSERT_TRUE(dumped) << read_text(log);
  const json rank1 = json::parse(read_text(dump + "/comm_traces/rank_1.json"));
  EXPECT_EQ(rank1["reason"], "SIGUSR1");
  EXPECT_EQ(rank1["rank"], 1);
  EXPECT_GT(rank1["entries"].size(), 3u);
  for (const char* rank : {"rank_0", "rank_1"}) {  // metrics.save_for_all_ranks
    EXPECT_FALSE(fs::is_empty(dump + "/tb/" + rank)) << rank;
  }
  // Each rank holds half of every parameter: the block norms are whole only once summed.
  const auto lines = read_jsonl(dump + "/metrics.jsonl");
  ASSERT_GE(lines.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    double squares = 0;
    for (const auto& [key, value] : lines[i].items()) {
      if (key.rfind("grad_norm/", 0) == 0) squares += value.get<double>() * value.get<double>();
    }
    EXPECT_NEAR(std::sqrt(squares), lines[i]["grad_norm"].get<double>(),
                1e-6 * lines[i]["grad_norm"].get<double>())
        << lines[i].dump();
  }
  auto report = run_loom("debug hang " + dump);
  EXPECT_EQ(report.exit_code, 0) << report.output;
  EXPECT_NE(report.output.find("ranks 0-1"), std::string::npos) << report.output;
  auto json_report = run_loom("debug hang " + dump + " --format json");
  ASSERT_EQ(json_report.exit_code, 0) << json_report.output;
  EXPECT_EQ(json::parse(json_report.output)["ranks_with_dumps"], json({0, 1}));
}
