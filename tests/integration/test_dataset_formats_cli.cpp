// The new formats through the loom binary: prepare-data over Parquet, zstd JSONL and a
// save_to_disk folder with a SentencePiece tokenizer, `loom tokenize` with it, and a short
// training run streaming Parquet with a Qwen-style tokenizer.json (mixtures of the formats:
// test_dataset_formats.cpp).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "loom/core/strings.h"
#include "support/process.h"

namespace {

using loom::testing::run_command;
using loom::testing::run_loom;

using loom::testing::contains;

TEST(DatasetFormatsCli, PrepareTokenizeAndTrainOnEveryFormat) {
  const std::string dir = loom::testing::fresh_temp_dir("dataset_formats_cli");
  const std::string python = std::string("'") + LOOM_PYTHON + "' '" + LOOM_SOURCE_DIR + "/tools/";
  auto made = run_command(python + "make_dataset_fixtures.py' '" + dir + "' 2>&1 && " + python +
                          "make_tokenizer_fixtures.py' '" + dir + "/tok' 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string sp = dir + "/tok/sp_bpe.model";

  auto prepared = run_loom("prepare-data --tokenizer '" + sp + "' --input '" + dir +
                           "/data.parquet' --input '" + dir + "/data.jsonl.zst' --input '" + dir +
                           "/hf' --output '" + dir + "/shards'");
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  EXPECT_TRUE(contains(prepared.output, "prepare-data: 180 documents,")) << prepared.output;

  // loom tokenize with the SentencePiece model gives the Python package's ids.
  const auto expected =
      nlohmann::json::parse(std::ifstream(dir + "/tok/expected.json")).at("sp_bpe").at(3);
  const auto text =
      nlohmann::json::parse(std::ifstream(dir + "/tok/expected.json")).at("texts").at(3);
  std::ofstream(dir + "/text.txt") << text.get<std::string>();
  auto ids =
      run_loom("tokenize --tokenizer '" + sp + "' --input '" + dir + "/text.txt' --format json");
  ASSERT_EQ(ids.exit_code, 0) << ids.output;
  EXPECT_EQ(nlohmann::json::parse(ids.output), expected) << ids.output;

  const std::string common = "train --config '" + std::string(LOOM_SOURCE_DIR) +
                             "/configs/llama3_debug.toml' --training.steps 2 --training.seq_len "
                             "32 --training.local_batch_size 2 --validation.enable false";
  auto streamed = run_loom(common + " --model.tokenizer_path '" + dir +
                           "/tok/qwen_style.json' --training.dataset_path '" + dir +
                           "/data.parquet' --job.dump_folder '" + dir + "/run1'");
  ASSERT_EQ(streamed.exit_code, 0) << streamed.output;
  EXPECT_TRUE(contains(streamed.output, "streamed")) << streamed.output;

  // config validate reads the Parquet schema: a text column the file lacks is refused up front.
  const std::string validate = "config validate --config '" + std::string(LOOM_SOURCE_DIR) +
                               "/configs/llama3_debug.toml' --model.tokenizer_path '" + dir +
                               "/tok/qwen_style.json' --training.dataset_path '" + dir +
                               "/data.parquet'";
  auto good = run_loom(validate);
  EXPECT_EQ(good.exit_code, 0) << good.output;
  auto missing = run_loom(validate + " --training.dataset_text_field body");
  EXPECT_NE(missing.exit_code, 0) << missing.output;
  EXPECT_TRUE(contains(missing.output, "training.dataset_text_field = 'body'")) << missing.output;
  EXPECT_TRUE(contains(missing.output, "data.parquet")) << missing.output;
}

}  // namespace
