// Parquet, zstd JSONL and Hugging Face save_to_disk folders against the JSONL they were made
// from (fixtures written inside the test by pyarrow, zstandard and datasets:
// tools/make_dataset_fixtures.py): same documents in order, the streamed loader's
// data-parallel slices and its exact resume, and bad inputs refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "loom/core/check.h"
#include "loom/data/columnar.h"
#include "loom/data/document_reader.h"
#include "loom/data/documents.h"
#include "loom/data/mixture.h"
#include "loom/data/streaming_loader.h"
#include "loom/data/tokenizer.h"
#include "support/errors.h"
#include "support/process.h"
#include "support/test_sets.h"

namespace {

using loom::data::ByteTokenizer;

using loom::testing::input_error_of;

// The documents of one byte-tokenized stream: the bytes between each BOS (256) and EOS (257).
std::vector<std::string> split_documents(const std::vector<int64_t>& tokens) {
  std::vector<std::string> documents;
  std::string current;
  bool inside = false;
  for (int64_t t : tokens) {
    if (t == 256) {
      inside = true;
      current.clear();
    } else if (t == 257) {
      if (inside) documents.push_back(current);
      inside = false;
    } else if (inside) {
      current.push_back(static_cast<char>(t));
    }
  }
  return documents;
}

std::vector<int64_t> stream_tokens(loom::data::BatchSource& source, int batches, int64_t batch,
                                   int64_t seq_len) {
  std::vector<int64_t> tokens;
  for (int i = 0; i < batches; ++i) {
    auto b = source.next(batch, seq_len);
    for (int64_t r = 0; r < batch; ++r) {
      // inputs plus the last label: the whole window of seq_len + 1 tokens.
      auto row = b.inputs[r];
      for (int64_t k = 0; k < seq_len; ++k) tokens.push_back(row[k].item<int64_t>());
      tokens.push_back(b.labels[r][seq_len - 1].item<int64_t>());
    }
  }
  return tokens;
}

class DatasetFormats : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(loom::testing::fresh_temp_dir("dataset_formats"));
    const std::string command = std::string("'") + LOOM_PYTHON + "' '" + LOOM_SOURCE_DIR +
                                "/tools/make_dataset_fixtures.py' '" + *dir_ + "' 2>&1";
    const auto result = loom::testing::run_command(command);
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string path(const std::string& name) { return *dir_ + "/" + name; }
  static std::string* dir_;
};

std::string* DatasetFormats::dir_ = nullptr;

TEST_F(DatasetFormats, EveryFormatReadsTheJsonlDocumentsInOrder) {
  const auto source = loom::data::read_documents(path("source.jsonl"));
  ASSERT_EQ(source.size(), 60u);
  EXPECT_EQ(loom::data::read_documents(path("data.parquet")), source);
  EXPECT_EQ(loom::data::read_documents(path("data.jsonl.zst")), source);
  std::vector<std::string> from_folder;
  const auto files = loom::data::expand_dataset_path(path("hf"));
  ASSERT_EQ(files.size(), 2u);
  for (const auto& file : files) {
    for (auto& doc : loom::data::read_documents(file)) from_folder.push_back(std::move(doc));
  }
  EXPECT_EQ(from_folder, source);
  loom::data::ColumnarFile parquet(path("data.parquet"), "text");
  EXPECT_EQ(parquet.units(), 9);  // 60 rows in row groups of 7
  EXPECT_EQ(parquet.rows(), 60);
  // A folder of mixed formats lists them all; a DatasetDict asks for a split.
  const std::string what = input_error_of([&] { loom::data::expand_dataset_path(path("dict")); });
  EXPECT_NE(what.find("DatasetDict"), std::string::npos) << what;
  EXPECT_NE(what.find("train"), std::string::npos) << what;
}

TEST_F(DatasetFormats, BadInputsAreRefusedByName) {
  auto expect = [&](const std::string& file, const std::string& needle) {
    const std::string what = input_error_of([&] { loom::data::read_documents(path(file)); });
    EXPECT_NE(what.find(file), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  };
  expect("int_text.parquet", "expected a string column");
  expect("no_text.parquet", "has no column \"text\"");
  expect("null_text.parquet", "row 3");
  expect("corrupt.parquet", "Parquet");
  expect("cut.jsonl.zst", "truncated");
  int64_t skipped = 0;
  EXPECT_EQ(loom::data::read_documents(path("null_text.parquet"), "text", true, &skipped),
            (std::vector<std::string>{"a", "b", "c", "e"}));
  EXPECT_EQ(skipped, 1);
  // Text that is not UTF-8: refused by row, or skipped (Arrow's check passed every text before
  // its tables were initialized, and an .arrow batch was refused whole even when skipping).
  for (const char* file : {"bad_utf8.parquet", "bad_utf8.arrow"}) {
    expect(file, "row 1: the text is not valid UTF-8");
    skipped = 0;
    EXPECT_EQ(loom::data::read_documents(path(file), "text", true, &skipped),
              (std::vector<std::string>{"a", "c"}))
        << file;
    EXPECT_EQ(skipped, 1) << file;
  }
  // An .arrow file that is not Arrow.
  loom::testing::run_command("cp '" + path("source.jsonl") + "' '" + path("bogus.arrow") + "'");
  expect("bogus.arrow", "Arrow");
  // A save_to_disk folder without its state.json: named as such, not "dataset_info.json is not
  // JSONL".
  loom::testing::run_command("cp -r '" + path("hf") + "' '" + path("hf_stateless") + "' && rm '" +
                             path("hf_stateless") + "/state.json'");
  const std::string what =
      input_error_of([&] { loom::data::expand_dataset_path(path("hf_stateless")); });
  EXPECT_NE(what.find("save_to_disk folder (it has dataset_info.json) without its state.json"),
            std::string::npos)
      << what;
}

TEST_F(DatasetFormats, StreamedRanksAreDisjointAndComplete) {
  const auto source = loom::data::read_documents(path("source.jsonl"));
  ByteTokenizer tok;
  // The rows of each rank's row groups (7 rows each, dealt round-robin), in order.
  for (int64_t world : {1, 2, 3}) {
    std::multiset<std::string> seen;
    for (int64_t rank = 0; rank < world; ++rank) {
      loom::data::PackedLoaderOptions options{16, 0, false, rank, world};
      loom::data::StreamingLoader loader({path("data.parquet")}, tok, options);
      std::vector<std::string> expected;
      for (int64_t g = rank; g < 9; g += world) {
        for (int64_t r = 7 * g; r < std::min<int64_t>(60, 7 * g + 7); ++r) {
          expected.push_back(source[static_cast<size_t>(r)]);
        }
      }
      EXPECT_EQ(loader.rank_rows(), static_cast<int64_t>(expected.size()));
      // Enough batches to pass the end of this rank's epoch.
      int64_t bytes = 0;
      for (const auto& doc : expected) bytes += static_cast<int64_t>(doc.size()) + 2;
      const int batches = static_cast<int>(bytes / (4 * 17)) + 2;
      auto docs = split_documents(stream_tokens(loader, batches, 4, 16));
      ASSERT_GE(docs.size(), expected.size());
      docs.resize(expected.size());
      EXPECT_EQ(docs, expected) << "rank " << rank << " of " << world;
      seen.insert(expected.begin(), expected.end());
    }
    EXPECT_EQ(seen, std::multiset<std::string>(source.begin(), source.end()));
  }
  // More ranks than row groups: a rank without rows is an error, not an empty stream.
  loom::data::PackedLoaderOptions many{16, 0, false, 9, 10};
  const std::string what =
      input_error_of([&] { loom::data::StreamingLoader({path("data.parquet")}, tok, many); });
  EXPECT_NE(what.find("row groups"), std::string::npos) << what;
}

// A loader whose first row group has no readable row (skipped as bad) saves its state before its
// first batch (validation does, to start over each time) and loads it back: it was refused as
// "outside its row group".
TEST_F(DatasetFormats, StreamedStateBeforeAnUnreadableFirstRowGroupLoads) {
  ByteTokenizer tok;
  loom::data::PackedLoaderOptions options{8, 0, false, 0, 1, true};
  loom::data::StreamingLoader loader({path("null_first.parquet")}, tok, options);
  const nlohmann::json start = loader.state();
  const auto first = stream_tokens(loader, 2, 1, 8);
  loader.load_state(start);
  EXPECT_EQ(stream_tokens(loader, 2, 1, 8), first);
}

TEST_F(DatasetFormats, StreamedResumeIsExactMidRowGroup) {
  ByteTokenizer tok;
  for (const auto& dataset : {path("data.parquet"), path("hf")}) {
    const auto files = loom::data::expand_dataset_path(dataset);
    loom::data::PackedLoaderOptions options{24, 0, false, 1, 2};
    options.bos_id = tok.bos_id();
    loom::data::StreamingLoader first(files, tok, options);
    (void)first.next(3, 24);
    (void)first.next(3, 24);
    const nlohmann::json state = first.state();
    EXPECT_GT(state.at("row").get<int64_t>() + state.at("token").get<int64_t>(), 0) << state;
    auto rest = stream_tokens(first, 40, 3, 24);  // crosses row groups and an epoch
    loom::data::StreamingLoader resumed(files, tok, options);
    resumed.load_state(nlohmann::json::parse(state.dump()));
    EXPECT_EQ(stream_tokens(resumed, 40, 3, 24), rest) << dataset;
    // Another data-parallel layout is refused by name.
    loom::data::StreamingLoader other(files, tok, {24, 0, false, 0, 1});
    const std::string what = input_error_of([&] { other.load_state(state); });
    EXPECT_NE(what.find("data-parallel"), std::string::npos) << what;
    // So is another tokenizer (a tokenizer file changed under the same path).
    ByteTokenizer changed;
    changed.set_identity({"tokenizer.json", "crc32:00000000:1"});
    loom::data::StreamingLoader retokenized(files, changed, options);
    const std::string why = input_error_of([&] { retokenized.load_state(state); });
    EXPECT_NE(why.find("made with another tokenizer"), std::string::npos) << why;
    // So is the same tokenizer file encoded by other rules (a state from an older loom).
    nlohmann::json older = state;
    older["tokenizer_encoding"] = "byte/0";
    const std::string rules = input_error_of([&] { resumed.load_state(older); });
    EXPECT_NE(rules.find("encoded this tokenizer as 'byte/0'"), std::string::npos) << rules;
    older.erase("tokenizer_encoding");  // before loom recorded it: version 1, the byte rules
    loom::data::StreamingLoader unrecorded(files, tok, options);
    unrecorded.load_state(older);
  }
  // The training path picks the streamed loader for columnar files.
  auto source = loom::data::open_dataset_source("mine", path("data.parquet"), tok,
                                                {16, 0, true, 0, 1}, "training.dataset");
  EXPECT_EQ(source->state().at("kind"), "stream");
}

TEST_F(DatasetFormats, MixturesMixEveryFormat) {
  ByteTokenizer tok;
  loom::data::PackedLoaderOptions options{16, 3, true, 0, 1};
  auto mixture = loom::data::open_mixture(
      {{path("data.parquet"), 1}, {path("data.jsonl.zst"), 1}, {path("hf"), 1}}, tok, options,
      "training.dataset_mixture");
  for (int i = 0; i < 6; ++i) (void)mixture->next(4, 16);
  for (int64_t drawn : mixture->drawn()) EXPECT_GT(drawn, 0);
}

}  // namespace
