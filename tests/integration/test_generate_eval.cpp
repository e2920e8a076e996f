// `loom generate` and `loom eval` end to end on a freshly trained debug model: deterministic
// greedy text, JSONL output, batched prompts equal to one-by-one, run/checkpoint/step folders,
// eval's packed windows reproducing the val_loss that training logged, multiple choice, and
// every bad input an exit 2 with a message naming it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/process.h"

using loom::testing::fresh_temp_dir;
using loom::testing::run_command;
using loom::testing::run_loom;
namespace fs = std::filesystem;

namespace {

using loom::testing::contains;

// stdout alone (stderr to a file beside it).
loom::testing::CommandResult run_loom_stdout(const std::string& args, const std::string& dir) {
  return run_command("('" + std::string(LOOM_BINARY) + "' " + args + " 2>'" + dir +
                     "/stderr.txt')");
}

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// 6 steps of the debug model on brown with seq_len 32, validation and a checkpoint at step 6;
// documents attend within themselves (block_causal), which eval must follow to reproduce the
// validation loss.
std::string trained_run(const std::string& name) {
  const std::string dir = fresh_temp_dir(name);
  // Validation on documents of a few tokens each: every 32-token window holds several.
  {
    std::ofstream docs(dir + "/short_docs.jsonl");
    const char* words[] = {"The jury said",    "It was late",      "Mr. Smith left",
                           "They voted twice", "The road was new", "She played a tune"};
    for (int i = 0; i < 60; ++i) docs << "{\"text\": \"" << words[i % 6] << "\"}\n";
  }
  auto result =
      run_loom("train --config '" + std::string(LOOM_SOURCE_DIR) +
               "/configs/llama3_debug.toml' --job.dump_folder '" + dir +
               "' --training.steps 6 --training.seq_len 32 --training.local_batch_size 2"
               " --training.global_batch_size 2 --validation.freq 6 --validation.steps 3"
               " --validation.local_batch_size 2 --validation.seq_len 32"
               " --validation.dataset_path '" +
               dir +
               "/short_docs.jsonl'"
               " --checkpoint.enable true --checkpoint.interval 6 --metrics.log_freq 1"
               " --metrics.peak_tflops 1 --debug.seed 21 --model.attn_mask_type block_causal");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return dir;
}

}  // namespace

TEST(GenerateEval, FromATrainingCheckpoint) {
  const std::string run = trained_run("geneval_run");
  const std::string step = run + "/checkpoint/step-6";
  ASSERT_TRUE(fs::exists(step + "/COMPLETE"));

  // Greedy is deterministic, and the run folder, checkpoint folder and step folder agree.
  const std::string args = " --prompt 'The jury said' --max-new-tokens 16 --ignore-eos";
  auto a = run_loom_stdout("generate --checkpoint '" + run + "'" + args, run);
  ASSERT_EQ(a.exit_code, 0) << a.output << loom::testing::read_text(run + "/stderr.txt");
  EXPECT_FALSE(a.output.empty());
  EXPECT_EQ(run_loom_stdout("generate --checkpoint '" + run + "/checkpoint'" + args, run).output,
            a.output);
  EXPECT_EQ(run_loom_stdout("generate --checkpoint '" + step + "'" + args, run).output, a.output);

  // JSONL; batched prompts of different lengths equal one by one (greedy and sampled).
  const std::string prompts = run + "/prompts.jsonl";
  std::ofstream(prompts) << "{\"prompt\": \"The\", \"id\": \"a\"}\n"
                         << "{\"prompt\": \"In the morning the county board\"}\n\n"
                         << "{\"text\": \"He said that\"}\n";
  for (const std::string sampling : {"", " --temperature 0.8 --top-p 0.9 --seed 4"}) {
    const std::string common = "generate --checkpoint '" + run + "' --prompts '" + prompts +
                               "' --format json --max-new-tokens 12" + sampling;
    auto batched = run_loom_stdout(common + " --batch-size 3", run);
    auto single = run_loom_stdout(common + " --batch-size 1", run);
    ASSERT_EQ(batched.exit_code, 0) << loom::testing::read_text(run + "/stderr.txt");
    const auto b = json_lines(batched.output), s = json_lines(single.output);
    ASSERT_EQ(b.size(), 3u) << batched.output;
    ASSERT_EQ(s.size(), 3u) << single.output;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(b[i]["tokens"], s[i]["tokens"]) << "prompt " << i << sampling;
      EXPECT_EQ(b[i]["completion"], s[i]["completion"]);
      EXPECT_EQ(b[i]["index"], i);
      EXPECT_GE(b[i]["tokens"].size(), 1u);
    }
    EXPECT_EQ(b[0]["id"], "a");
    EXPECT_EQ(b[0]["prompt_ids"].size(), 2u);  // BOS + "The"
  }

  // Stop strings end the text before them.
  auto stopped = run_loom_stdout("generate --checkpoint '" + run +
                                     "' --prompt 'The' --format json"
                                     " --max-new-tokens 40 --ignore-eos --stop ' ' --stop ','",
                                 run);
  ASSERT_EQ(stopped.exit_code, 0);
  const auto stop = json_lines(stopped.output).at(0);
  if (stop["finish_reason"] == "stop") {
    EXPECT_FALSE(contains(stop["completion"].get<std::string>(), " "));
    EXPECT_FALSE(contains(stop["completion"].get<std::string>(), ","));
  }

  // Packed windows are the validation's samples: eval reproduces the val_loss at step 6.
  double val_loss = -1;
  {
    std::ifstream metrics(run + "/metrics.jsonl");
    std::string line;
    while (std::getline(metrics, line)) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("val_loss") && j["step"] == 6) val_loss = j["val_loss"].get<double>();
    }
  }
  ASSERT_GT(val_loss, 0);
  auto eval = run_loom_stdout("eval --checkpoint '" + run + "' --dataset '" + run +
                                  "/short_docs.jsonl' --windows packed --seq-len 32"
                                  " --max-windows 6 --batch-size 4",
                              run);
  ASSERT_EQ(eval.exit_code, 0) << loom::testing::read_text(run + "/stderr.txt");
  const auto e = nlohmann::json::parse(eval.output);
  EXPECT_NEAR(e["loss"].get<double>(), val_loss, 1e-4 * val_loss) << eval.output;
  EXPECT_EQ(e["tokens"], 6 * 32);
  EXPECT_NEAR(e["perplexity"].get<double>(), std::exp(e["loss"].get<double>()), 1e-9);
  EXPECT_TRUE(contains(loom::testing::read_text(run + "/stderr.txt"), "[eval] 6/6 windows"));
  // eval logs under its own name, not generate's.
  EXPECT_TRUE(contains(loom::testing::read_text(run + "/stderr.txt"), "[eval] info: loaded "));
  EXPECT_FALSE(contains(loom::testing::read_text(run + "/stderr.txt"), "[generate]"));

  // Sliding windows per document with details; multiple choice.
  const std::string docs = run + "/docs.jsonl";
  std::ofstream(docs) << "{\"text\": \"The committee met on Tuesday to discuss the budget.\"}\n"
                      << "{\"text\": \"Rain fell all night over the quiet town.\"}\n";
  auto sliding = run_loom_stdout("eval --checkpoint '" + run + "' --dataset '" + docs +
                                     "' --seq-len 8 --stride 4 --per-document --details",
                                 run);
  ASSERT_EQ(sliding.exit_code, 0) << loom::testing::read_text(run + "/stderr.txt");
  const auto sl = nlohmann::json::parse(sliding.output);
  ASSERT_EQ(sl["per_document"].size(), 2u);
  double nll = 0;
  int64_t tokens = 0;
  for (const auto& d : sl["per_document"]) {
    nll += d["nll"].get<double>();
    tokens += d["tokens"].get<int64_t>();
  }
  EXPECT_EQ(sl["tokens"], tokens);
  EXPECT_NEAR(sl["loss"].get<double>(), nll / tokens, 1e-9);

  const std::string task = run + "/task.jsonl";
  std::ofstream(task) << "{\"context\": \"The jury said\", \"choices\": [\" that\", \" zebra "
                         "quantum\"], \"answer\": 0}\n"
                      << "{\"context\": \"It was\", \"choices\": [\" a\", \" the\", \" xq\"], "
                         "\"answer\": 2}\n";
  auto choice = run_loom_stdout(
      "eval --checkpoint '" + run + "' --dataset 'choice:" + task + "' --details", run);
  ASSERT_EQ(choice.exit_code, 0) << loom::testing::read_text(run + "/stderr.txt");
  const auto c = nlohmann::json::parse(choice.output);
  EXPECT_EQ(c["items"], 2);
  ASSERT_EQ(c["per_item"].size(), 2u);
  EXPECT_EQ(c["per_item"][1]["loglik"].size(), 3u);
  double correct = 0;
  for (const auto& item : c["per_item"]) correct += item["predicted"] == item["answer"];
  EXPECT_DOUBLE_EQ(c["accuracy"].get<double>(), correct / 2);

  // Bad input that needs a model: a prompt longer than the context (32 tokens), a step without
  // config.toml.
  const std::string long_prompt(400, 'x');
  auto too_long = run_loom("generate --checkpoint '" + run + "' --prompt '" + long_prompt + "'");
  EXPECT_EQ(too_long.exit_code, 2) << too_long.output;
  EXPECT_TRUE(contains(too_long.output, "--prompt: the prompt has")) << too_long.output;
  EXPECT_TRUE(contains(too_long.output, "context is 32")) << too_long.output;
  const std::string bare = run + "/bare/step-6";
  fs::create_directories(bare);
  fs::copy(step, bare, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  fs::remove(bare + "/config.toml");
  auto no_config = run_loom("generate --checkpoint '" + bare + "' --prompt 'x'");
  EXPECT_EQ(no_config.exit_code, 2) << no_config.output;
  EXPECT_TRUE(contains(no_config.output, "has no config.toml")) << no_config.output;
  EXPECT_TRUE(contains(no_config.output, "--flavor")) << no_config.output;
  EXPECT_TRUE(contains(no_config.output, "--tokenizer")) << no_config.output;
  auto with_flags = run_loom_stdout("generate --checkpoint '" + bare + "'" + args +
                                        " --model llama3 --flavor debugmodel --tokenizer brown_bpe"
                                        " --max-seq-len 32",
                                    run);
  EXPECT_EQ(with_flags.exit_code, 0) << loom::testing::read_text(run + "/stderr.txt");
  EXPECT_EQ(with_flags.output, a.output);
}

TEST(GenerateEval, BadInputIsAnErrorWithExitTwo) {
  const std::string dir = fresh_temp_dir("geneval_bad");
  auto missing = run_loom("generate --checkpoint '" + dir + "/nope' --prompt x");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_TRUE(contains(missing.output, "does not exist")) << missing.output;

  fs::create_directories(dir + "/checkpoint/step-3");
  std::ofstream(dir + "/checkpoint/step-3/index.json") << "{}";
  auto incomplete = run_loom("eval --checkpoint '" + dir + "/checkpoint/step-3' --dataset brown");
  EXPECT_EQ(incomplete.exit_code, 2) << incomplete.output;
  EXPECT_TRUE(contains(incomplete.output, "incomplete")) << incomplete.output;
  auto none = run_loom("generate --checkpoint '" + dir + "/checkpoint' --prompt x");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_TRUE(contains(none.output, "holds no complete checkpoint")) << none.output;

  const std::string prompts = dir + "/prompts.jsonl";
  std::ofstream(prompts)
      << "{\"prompt\": \"fine\"}\n{\"prompt\": \"also fine\"}\n{\"promt\": \"x\"}\n";
  auto bad_line = run_loom("generate --checkpoint '" + dir + "' --prompts '" + prompts + "'");
  EXPECT_EQ(bad_line.exit_code, 2) << bad_line.output;
  EXPECT_TRUE(contains(bad_line.output, prompts + ":3")) << bad_line.output;

  auto format = run_loom("eval --checkpoint '" + dir + "' --dataset 'mmlu:" + prompts + "'");
  EXPECT_EQ(format.exit_code, 2) << format.output;
  EXPECT_TRUE(contains(format.output, "unknown task format 'mmlu'")) << format.output;

  auto no_prompt = run_loom("generate --checkpoint '" + dir + "'");
  EXPECT_EQ(no_prompt.exit_code, 2) << no_prompt.output;
  auto bad_sampling = run_loom("generate --checkpoint '" + dir + "' --prompt x --top-p 0");
  EXPECT_EQ(bad_sampling.exit_code, 2) << bad_sampling.output;
  EXPECT_TRUE(contains(bad_sampling.output, "--top-p")) << bad_sampling.output;
}
