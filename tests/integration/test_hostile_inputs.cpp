// Hostile files given to the loom binary: each is refused with exit 2 naming the file (never a
// signal, never a hang: every command runs under `timeout`), a corrupt newest checkpoint falls
// back to the older one, nothing loom did not make is removed, and a run whose final checkpoint
// cannot be written exits non-zero after training.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "support/process.h"

namespace fs = std::filesystem;
using loom::testing::fresh_temp_dir;
using loom::testing::read_text;

namespace {

using loom::testing::contains;

// `loom <args>` under a 120 s timeout (exit 124 if it hung).
loom::testing::CommandResult run_timed(const std::string& args) {
  return loom::testing::run_command(std::string("timeout 120 '") + LOOM_BINARY + "' " + args);
}

void expect_refused(const loom::testing::CommandResult& r, const std::string& names) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, names)) << "expected '" << names << "' in:\n" << r.output;
  EXPECT_FALSE(contains(r.output, "terminate called")) << r.output;
}

// A tiny synthetic-data run with checkpoints every 2 steps.
std::string train_args(const std::string& dump, int steps) {
  return "train --training.dataset synthetic --training.device cpu --training.steps " +
         std::to_string(steps) +
         " --training.seq_len 16 --training.local_batch_size 2 --model.flavor debugmodel "
         "--activation_checkpoint.mode none --metrics.log_freq 1 --metrics.peak_tflops 1 "
         "--checkpoint.enable true --checkpoint.interval 2 --debug.seed 3 --job.dump_folder '" +
         dump + "'";
}

void edit_json(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(std::ifstream(path));
  edit(j);
  std::ofstream(path) << j.dump(1);
}

}  // namespace

TEST(HostileInputs, CheckpointWithAlteredDtypeFallsBackAndIsRefusedByTheTools) {
  const std::string dir = fresh_temp_dir("hostile_ckpt_cli");
  // Step 4 a full checkpoint (a weights-only last save would be tried after step 2 anyway).
  auto first = run_timed(train_args(dir, 4) + " --checkpoint.last_save_model_only false");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string step4 = dir + "/checkpoint/step-4";
  // The dtype of one tensor widened: reading it used to run past its chunk (SIGSEGV).
  edit_json(step4 + "/index.json",
            [](nlohmann::json& j) { j["tensors"]["model.norm.weight"]["dtype"] = "F64"; });
  expect_refused(run_timed("checkpoint inspect '" + step4 + "'"), step4 + "/index.json");
  expect_refused(run_timed("checkpoint export --to hf '" + step4 + "' '" + dir + "/hf'"),
                 "model.norm.weight");
  // initial_load_path at the altered step (before the resume below re-writes step 4): refused
  // by name, no crash.
  auto initial =
      run_timed(train_args(dir + "/other", 2) + " --checkpoint.initial_load_path '" + step4 + "'");
  expect_refused(initial, "index.json");
  // Resuming: step 4 is refused with a warning, step 2 loads, training goes on to step 6.
  auto resumed = run_timed(train_args(dir, 6));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "falling back to")) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "step-2 (step 2")) << resumed.output;
}

TEST(HostileInputs, FifoSocketAndFolderAreRefusedByTypeWithoutHanging) {
  const std::string dir = fresh_temp_dir("hostile_types");
  const std::string fifo = dir + "/job.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  expect_refused(run_timed("config validate --config '" + fifo + "'"), "FIFO");
  fs::create_directories(dir + "/folder.toml");
  expect_refused(run_timed("config validate --config '" + dir + "/folder.toml'"), "is a folder");
  const std::string tokenizer_fifo = dir + "/tokenizer.json";
  ASSERT_EQ(::mkfifo(tokenizer_fifo.c_str(), 0644), 0);
  expect_refused(run_timed("tokenize --tokenizer '" + tokenizer_fifo + "' --text x"), "FIFO");
  const std::string data_fifo = dir + "/data.jsonl";
  ASSERT_EQ(::mkfifo(data_fifo.c_str(), 0644), 0);
  expect_refused(run_timed("prepare-data --tokenizer byte --input '" + data_fifo + "' --output '" +
                           dir + "/out'"),
                 "FIFO");
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

TEST(HostileInputs, HuggingFaceTokenizerIdsOutOfRangeAreErrorsNamingTheToken) {
  const std::string dir = fresh_temp_dir("hostile_hf_tok");
  const std::string source =
      read_text(std::string(LOOM_SOURCE_DIR) + "/assets/tokenizer/brown_bpe_4k.json");
  ASSERT_FALSE(source.empty());
  auto j = nlohmann::json::parse(source);
  const std::string token = j["model"]["vocab"].begin().key();
  for (const auto& [name, id] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"negative", -3}, {"wrapping", 4294967303ull}, {"beyond", 1 << 30}}) {
    auto altered = j;
    altered["model"]["vocab"][token] = id;
    const std::string path = dir + "/" + name + ".json";
    std::ofstream(path) << altered.dump();
    auto r = run_timed("tokenize --tokenizer '" + path + "' --text 'the cat'");
    expect_refused(r, "id of token '" + token + "'");
    EXPECT_TRUE(contains(r.output, path)) << r.output;
  }
}

TEST(HostileInputs, TruncatedGzipIsAnErrorNamingTheFile) {
  const std::string dir = fresh_temp_dir("hostile_gzip");
  std::string jsonl;
  for (int i = 0; i < 2000; ++i) {
    jsonl += "{\"text\": \"document " + std::to_string(i) + " with some words in it\"}\n";
  }
  // gzip with zlib's gz* API, then cut: without its 8-byte trailer, and at half its length.
  const std::string whole = dir + "/whole.jsonl.gz";
  gzFile out = gzopen(whole.c_str(), "wb");
  ASSERT_NE(out, nullptr);
  gzwrite(out, jsonl.data(), static_cast<unsigned>(jsonl.size()));
  gzclose(out);
  const std::string bytes = read_text(whole);
  ASSERT_GT(bytes.size(), 100u);
  const std::string no_trailer = dir + "/no_trailer.jsonl.gz";
  std::ofstream(no_trailer, std::ios::binary) << bytes.substr(0, bytes.size() - 8);
  const std::string half = dir + "/half.jsonl.gz";
  std::ofstream(half, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  auto ok =
      run_timed("prepare-data --tokenizer byte --input '" + whole + "' --output '" + dir + "/ok'");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  for (const auto& path : {no_trailer, half}) {
    auto r = run_timed("prepare-data --tokenizer byte --input '" + path + "' --output '" + dir +
                       "/cut'");
    expect_refused(r, path);
    EXPECT_TRUE(contains(r.output, "truncated")) << r.output;
  }
}

TEST(HostileInputs, OverwriteReplacesOnlyALoomPreparedDataset) {
  const std::string dir = fresh_temp_dir("hostile_overwrite");
  const std::string corpus = dir + "/corpus.jsonl";
  std::ofstream(corpus) << "{\"text\": \"hello there\"}\n{\"text\": \"general kenobi\"}\n";
  const std::string prepare =
      "prepare-data --tokenizer byte --input '" + corpus + "' --overwrite --output ";
  // A folder of someone's files: refused, and every file is still there.
  fs::create_directories(dir + "/photos");
  std::ofstream(dir + "/photos/cat.jpg") << "meow";
  expect_refused(run_timed(prepare + "'" + dir + "/photos'"), "refusing to replace");
  EXPECT_EQ(read_text(dir + "/photos/cat.jpg"), "meow");
  // A file: refused.
  std::ofstream(dir + "/notes.txt") << "keep";
  expect_refused(run_timed(prepare + "'" + dir + "/notes.txt'"), "not a folder");
  EXPECT_EQ(read_text(dir + "/notes.txt"), "keep");
  // A folder that only pretends (an index.json of another format): refused.
  fs::create_directories(dir + "/fake");
  std::ofstream(dir + "/fake/index.json") << "{\"format\": \"other\"}";
  expect_refused(run_timed(prepare + "'" + dir + "/fake'"), "not a loom prepared dataset");
  // A real prepared dataset: replaced; with a stranger file beside its shards: refused.
  auto made = run_timed(prepare + "'" + dir + "/data'");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto again = run_timed(prepare + "'" + dir + "/data'");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  std::ofstream(dir + "/data/README") << "mine";
  expect_refused(run_timed(prepare + "'" + dir + "/data'"), "'README' in it");
  EXPECT_EQ(read_text(dir + "/data/README"), "mine");
  // Nothing else was left beside the outputs (temporary folders are removed).
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_FALSE(contains(entry.path().filename().string(), ".tmp-")) << entry.path();
  }
}

TEST(HostileInputs, PreparedIndexPathsOutsideTheFolderAreRefused) {
  const std::string dir = fresh_temp_dir("hostile_prepared");
  const std::string corpus = dir + "/corpus.jsonl";
  std::ofstream(corpus) << "{\"text\": \"hello there\"}\n";
  ASSERT_EQ(run_timed("prepare-data --tokenizer byte --input '" + corpus + "' --output '" + dir +
                      "/data'")
                .exit_code,
            0);
  const std::string common =
      "train --training.device cpu --training.steps 1 "
      "--validation.enable false "
      "--training.seq_len 8 --training.local_batch_size 1 "
      "--model.tokenizer_path byte --job.dump_folder '" +
      dir + "/run' --training.dataset_path '" + dir + "/data'";
  for (const std::string escape : {"../corpus.jsonl", "/etc/passwd", ""}) {
    edit_json(dir + "/data/index.json",
              [&](nlohmann::json& j) { j["shards"][0]["tokens_file"] = escape; });
    expect_refused(run_timed(common), "outside the dataset folder");
  }
  edit_json(dir + "/data/index.json",
            [](nlohmann::json& j) { j["shards"][0]["tokens_file"] = 12; });
  expect_refused(run_timed(common), "key 'tokens_file' must be a string");
}

TEST(HostileInputs, FailingFinalCheckpointMakesTheRunExitNonZeroAfterTraining) {
  const std::string dir = fresh_temp_dir("hostile_final_save");
  // The checkpoint folder's path is taken by a file: every save fails.
  fs::create_directories(dir + "/run");
  std::ofstream(dir + "/run/checkpoint") << "not a folder";
  auto r = run_timed(train_args(dir + "/run", 3));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "finished: 3 steps")) << r.output;  // training ran to the end
  EXPECT_TRUE(contains(r.output, "2 of 2 checkpoint saves failed")) << r.output;
  EXPECT_TRUE(contains(r.output, "the final checkpoint could not be written")) << r.output;
}

TEST(HostileInputs, SizesThatCannotFitAreRefusedAtStartWithAnEstimate) {
  const std::string dir = fresh_temp_dir("hostile_sizes");
  auto r = run_timed(
      "train --training.dataset synthetic --training.device cpu --training.steps 1 "
      "--training.seq_len 1048576 --training.local_batch_size 4096 "
      "--model.flavor debugmodel --job.dump_folder '" +
      dir + "'");
  expect_refused(r, "training.local_batch_size = 4096");
  EXPECT_TRUE(contains(r.output, "GiB")) << r.output;
}

TEST(HostileInputs, HfAssetsPathTokenizerIsLoadedAndAMissingOneIsAnError) {
  const std::string dir = fresh_temp_dir("hostile_hf_assets");
  fs::create_directories(dir + "/assets");
  fs::copy_file(std::string(LOOM_SOURCE_DIR) + "/assets/tokenizer/brown_bpe_4k.json",
                dir + "/assets/tokenizer.json");
  const std::string common =
      "train --training.device cpu --training.steps 1 "
      "--training.dataset brown --validation.enable false "
      "--training.seq_len 16 --training.local_batch_size 1 "
      "--metrics.log_freq 1 --job.dump_folder '" +
      dir + "/run' --model.hf_assets_path '";
  auto loaded = run_timed(common + dir + "/assets'");
  EXPECT_EQ(loaded.exit_code, 0) << loaded.output;
  EXPECT_TRUE(contains(loaded.output, "4096")) << loaded.output;  // the BPE's vocabulary
  fs::create_directories(dir + "/empty");
  expect_refused(run_timed(common + dir + "/empty'"), "holds no tokenizer.json");
}

namespace {

bool says(const loom::testing::CommandResult& r, const std::string& part) {
  return r.output.find(part) != std::string::npos;
}

}  // namespace

// `plan layout --output /dev/full` printed "wrote /dev/full" and exited 0, `--output FIFO` and
// `plan memory --device FIFO` hung, and commands whose stdout is on a full disk exited 0.
TEST(HostileInputs, PlanOutputsAndStdoutOnAFullDiskOrFifoFailWithoutHanging) {
  const std::string dir = loom::testing::fresh_temp_dir("hostile_plan_outputs");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string job = "--config " LOOM_SOURCE_DIR "/configs/llama3_debug.toml --world-size 2";
  auto full = run_timed("plan layout " + job + " --device cpu --output /dev/full");
  EXPECT_EQ(full.exit_code, 2) << full.output;
  EXPECT_TRUE(says(full, "--output '/dev/full' exists and is not a regular file")) << full.output;
  EXPECT_FALSE(says(full, "wrote /dev/full")) << full.output;
  auto into_fifo = run_timed("plan layout " + job + " --device cpu --output " + fifo);
  EXPECT_EQ(into_fifo.exit_code, 2) << into_fifo.output;
  auto device_fifo = run_timed("plan memory " + job + " --device " + fifo);
  EXPECT_EQ(device_fifo.exit_code, 2) << device_fifo.output;
  EXPECT_TRUE(says(device_fifo, "FIFO")) << device_fifo.output;
  auto written = run_timed("plan layout " + job + " --device cpu --output " + dir + "/best.toml");
  EXPECT_EQ(written.exit_code, 0) << written.output;
  EXPECT_TRUE(fs::is_regular_file(dir + "/best.toml"));
  for (const std::string& command : std::vector<std::string>{
           "config show --config " LOOM_SOURCE_DIR "/configs/llama3_debug.toml",
           "plan memory " + job + " --device cpu"}) {
    // stdout alone on the full device; stderr still comes back through the subshell.
    auto result = loom::testing::run_command(std::string("( timeout 120 '") + LOOM_BINARY + "' " +
                                             command + " > /dev/full )");
    EXPECT_EQ(result.exit_code, 1) << command << "\n" << result.output;
    EXPECT_TRUE(says(result, "cannot write the output to standard output")) << result.output;
  }
}
