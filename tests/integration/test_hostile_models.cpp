// Hostile inputs of the second hardening round (issue 38) against the commands that load a
// model or plan one: a Hugging Face folder whose config.json or weights lie, sizes that cannot
// fit, options at the edge of their range, and a rendezvous endpoint that never answers. Each
// must end within seconds with exit 2 (or the network's exit 1) and a message naming the input.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "support/process.h"

namespace fs = std::filesystem;
using loom::testing::fresh_temp_dir;

namespace {
namespace test_hostile_models {  // its own names in a unity batch

const std::string kFixture = std::string(LOOM_SOURCE_DIR) + "/tests/data/hf_llama/transformers4";

using loom::testing::contains;

struct TimedResult {
  loom::testing::CommandResult result;
  double seconds = 0;
};

// `loom <args>` under a 60 s timeout (exit 124 if it hung), timed.
TimedResult run_timed(const std::string& args) {
  const auto start = std::chrono::steady_clock::now();
  TimedResult out;
  out.result = loom::testing::run_command(std::string("timeout 60 '") + LOOM_BINARY + "' " + args);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

void expect_refused(const TimedResult& r, const std::string& names, int exit_code = 2) {
  EXPECT_EQ(r.result.exit_code, exit_code) << r.result.output;
  EXPECT_TRUE(contains(r.result.output, names)) << "expected '" << names << "' in:\n"
                                                << r.result.output;
  EXPECT_FALSE(contains(r.result.output, "terminate called")) << r.result.output;
  EXPECT_FALSE(contains(r.result.output, "frame #")) << r.result.output;  // no C++ trace
  EXPECT_LT(r.seconds, 30) << r.result.output;
}

// A copy of the tiny Llama fixture whose config.json `edit` changed.
std::string hf_folder(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  const std::string dir = fresh_temp_dir(name);
  for (const auto& entry : fs::directory_iterator(kFixture)) {
    fs::copy_file(entry.path(), dir + "/" + entry.path().filename().string());
  }
  auto config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  edit(config);
  std::ofstream(dir + "/config.json") << config.dump(1);
  return dir;
}

// A one-line text file for eval's text windows.
std::string text_file(const std::string& name) {
  const std::string path = fresh_temp_dir(name) + "/text.txt";
  std::ofstream(path) << "the quick brown fox jumps over the lazy dog\n";
  return path;
}

std::string generate(const std::string& folder, const std::string& extra = "") {
  return "generate --checkpoint '" + folder + "' --tokenizer byte --prompt hi --max-new-tokens 2 " +
         extra;
}

// num_hidden_layers far beyond the weights would build (and allocate) every layer before the
// missing weights were noticed; vocab or hidden sizes typed wrong would allocate hundreds of GiB.
TEST(HostileModels, HuggingFaceSizesThatDoNotMatchOrFitAreRefusedBeforeBuilding) {
  expect_refused(run_timed(generate(hf_folder(
                     "layers_1e9", [](auto& c) { c["num_hidden_layers"] = int64_t{1000000000}; }))),
                 "num_hidden_layers is 1000000000, but the weights in");
  expect_refused(
      run_timed(generate(hf_folder("layers_3", [](auto& c) { c["num_hidden_layers"] = 3; }))),
      "num_hidden_layers is 3, but the weights in");
  const std::string huge_vocab =
      hf_folder("vocab_2e9", [](auto& c) { c["vocab_size"] = int64_t{2000000000}; });
  expect_refused(run_timed(generate(huge_vocab)), "GiB on cpu, which has");
  expect_refused(run_timed("eval --checkpoint '" + huge_vocab +
                           "' --tokenizer byte --dataset text:" + text_file("vocab_2e9_text")),
                 "GiB on cpu, which has");
  // A size inside its range whose square overflows a tensor's bytes: an error naming the file,
  // not LibTorch's alone (exit 1, no file).
  expect_refused(run_timed(generate(hf_folder("hidden_2e31",
                                              [](auto& c) {
                                                c["hidden_size"] = int64_t{1} << 31;
                                                c.erase("head_dim");
                                              }))),
                 "config.json' describes (Storage size calculation overflowed");
  // A context of 10^15 tokens: the RoPE table is sized before it is built.
  expect_refused(run_timed(generate(kFixture, "--max-seq-len 1000000000000000")),
                 "the RoPE table of a 1000000000000000-token context needs");
}

// A weight stored as integers is another file, not a weight to convert (same bytes as F32).
TEST(HostileModels, WeightStoredAsIntegersIsRefusedByName) {
  const std::string dir = hf_folder("int32_weight", [](auto&) {});
  const std::string path = dir + "/model.safetensors";
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  std::string head(8, '\0');
  file.read(head.data(), 8);
  uint64_t size = 0;
  std::memcpy(&size, head.data(), 8);  // little-endian, as this machine
  std::string header(size, '\0');
  file.read(header.data(), static_cast<std::streamsize>(size));
  const size_t at = header.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  header.replace(at, 5, "\"I32\"");
  file.seekp(8);
  file.write(header.data(), static_cast<std::streamsize>(size));
  file.close();
  expect_refused(run_timed(generate(dir)), "model weights are floating point");
}

TEST(HostileModels, OptionsAtTheEdgeOfTheirRangeAreRefusedOrHandled) {
  // 0 or -1 never silently means "the default".
  const std::string text = "--dataset text:" + text_file("edge_text");
  expect_refused(
      run_timed("eval --checkpoint '" + kFixture + "' --tokenizer byte " + text + " --stride 0"),
      "--stride: Value 0 not in range");
  expect_refused(run_timed("eval --checkpoint '" + kFixture + "' --tokenizer byte " + text +
                           " --max-windows -1"),
                 "--max-windows: Value -1 not in range");
  // A temperature near the smallest float samples the most likely token, never NaN.
  const auto cold = run_timed(generate(kFixture, "--temperature 1e-38 --format json"));
  EXPECT_EQ(cold.result.exit_code, 0) << cold.result.output;
  EXPECT_FALSE(contains(cold.result.output, std::string(1, '\0'))) << cold.result.output;
  // A schedule that cannot fit is refused by size, not grown until the OOM killer ends it.
  expect_refused(run_timed("plan schedule --pp 100000 --microbatches 100000"),
                 "of host memory, which has");
  // A misspelled schedule is a mistake at pp = 1 too.
  expect_refused(run_timed("config validate --training.dataset synthetic "
                           "--parallelism.pipeline_parallel_schedule Gpipz"),
                 "unknown schedule \"Gpipz\"");
}

// A program that accepts connections and never answers (here: a socket nobody accepts on) must
// not hold a worker past comm.init_timeout_seconds.
TEST(HostileModels, RendezvousEndpointThatNeverAnswersEndsAtTheDeadline) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);
  const std::string dump = fresh_temp_dir("silent_store");
  const auto r =
      run_timed("launch --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port " +
                std::to_string(port) +
                " --nproc-per-node 1 -- train --training.dataset synthetic "
                "--training.steps 1 --comm.init_timeout_seconds 2 --job.dump_folder '" +
                dump + "'");
  ::close(fd);
  EXPECT_EQ(r.result.exit_code, 1) << r.result.output;
  // The rank dials the store's gate, which never greets: it gives up at the init timeout.
  EXPECT_TRUE(contains(r.result.output,
                       "within 2 s: the rendezvous store at 127.0.0.1:" + std::to_string(port) +
                           " accepted the connection but did not greet"))
      << r.result.output;
  EXPECT_LT(r.seconds, 20) << r.result.output;
}

// run_status.json is for watchers: a status file that cannot be written (here a folder in its
// place) is one warning, and the run trains to the end.
TEST(HostileModels, StatusFileThatCannotBeWrittenIsAWarningNotTheEndOfTheRun) {
  const std::string dump = fresh_temp_dir("status_folder");
  fs::create_directories(dump + "/run_status.json");
  const auto r = run_timed(
      "train --training.dataset synthetic --training.steps 3 --training.seq_len 16 "
      "--training.local_batch_size 2 --metrics.log_freq 1 --job.dump_folder '" +
      dump + "'");
  EXPECT_EQ(r.result.exit_code, 0) << r.result.output;
  EXPECT_TRUE(contains(r.result.output, "training continues without it")) << r.result.output;
  EXPECT_TRUE(contains(loom::testing::read_text(dump + "/metrics.jsonl"), "\"step\":3"))
      << r.result.output;
}

}  // namespace test_hostile_models
}  // namespace
