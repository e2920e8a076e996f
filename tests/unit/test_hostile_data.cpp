// Tokenizer and data files from someone else: out-of-range or duplicate ids and ranks, truncated
// gzip, files of the wrong type; plus the start-of-run checks (which tokenizer
// model.hf_assets_path gives, whether the model and batch can fit at all).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/config/job_config.h"
#include "loom/config/loader.h"
#include "loom/core/check.h"
#include "loom/core/json.h"
#include "loom/data/documents.h"
#include "loom/data/tokenizer.h"
#include "loom/train/memory_check.h"
#include "support/process.h"

namespace fs = std::filesystem;

namespace {

const std::string kFixtures = std::string(LOOM_SOURCE_DIR) + "/tests/data/tokenizers";

std::string expect_input_error(const std::function<void()>& run) {
  try {
    run();
  } catch (const loom::InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no InputError";
  return "";
}

}  // namespace

TEST(HostileTokenizers, HfIdsMustBeIntegersInsideTheVocabulary) {
  const std::string dir = loom::testing::fresh_temp_dir("hostile_hf_ids");
  const auto original = nlohmann::json::parse(std::ifstream(kFixtures + "/hf_gpt2_style.json"));
  auto try_vocab_value = [&](const std::string& name, const nlohmann::json& value) {
    auto j = original;
    const std::string token = j["model"]["vocab"].begin().key();
    j["model"]["vocab"][token] = value;
    const std::string path = dir + "/" + name + ".json";
    std::ofstream(path) << j.dump();
    const std::string what = expect_input_error([&] { loom::data::load_tokenizer(path); });
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("'" + token + "'"), std::string::npos) << what;
    return what;
  };
  try_vocab_value("negative", -3);         // wrote out of bounds before
  try_vocab_value("wrap", 4294967303ull);  // 2^32 + 7 silently became 7 before
  try_vocab_value("fraction", 2.5);
  try_vocab_value("text", "12");
  try_vocab_value("beyond", 1 << 30);  // far beyond the tokens the file declares
  // Two tokens sharing one id, and an added token taking an ordinary token's id.
  auto j = original;
  auto it = j["model"]["vocab"].begin();
  const int id = it->get<int>();
  ++it;
  it.value() = id;
  std::ofstream(dir + "/shared.json") << j.dump();
  EXPECT_NE(expect_input_error([&] {
              loom::data::load_tokenizer(dir + "/shared.json");
            }).find("share id"),
            std::string::npos);
  j = original;
  j["added_tokens"][0]["id"] = j["model"]["vocab"].begin().value();
  std::ofstream(dir + "/added.json") << j.dump();
  EXPECT_NE(
      expect_input_error([&] { loom::data::load_tokenizer(dir + "/added.json"); }).find("takes id"),
      std::string::npos);
  // A duplicate key in the vocabulary.
  std::string text = original.dump();
  text.insert(text.find("\"vocab\":{") + 9, "\"x\":1,\"x\":2,");
  std::ofstream(dir + "/dupkey.json") << text;
  EXPECT_NE(expect_input_error([&] {
              loom::data::load_tokenizer(dir + "/dupkey.json");
            }).find("appears twice"),
            std::string::npos);
}

// An empty Split regex tokenized differently from `tokenizers`, BPE dropout was ignored, and a
// PCRE2 match-limit error was reported as invalid UTF-8.
TEST(HostileTokenizers, EmptySplitRegexAndDropoutAreRefusedByName) {
  const std::string dir = loom::testing::fresh_temp_dir("hostile_hf_split");
  const auto original = nlohmann::json::parse(std::ifstream(kFixtures + "/hf_llama3_style.json"));
  auto j = original;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "";
  std::ofstream(dir + "/empty.json") << j.dump();
  EXPECT_NE(expect_input_error([&] {
              loom::data::load_tokenizer(dir + "/empty.json");
            }).find("the Split pattern is an empty regex"),
            std::string::npos);
  j = original;
  j["model"]["dropout"] = 0.1;
  std::ofstream(dir + "/dropout.json") << j.dump();
  EXPECT_NE(expect_input_error([&] {
              loom::data::load_tokenizer(dir + "/dropout.json");
            }).find("model.dropout is 0.1"),
            std::string::npos);
  j["model"]["dropout"] = 0.0;
  std::ofstream(dir + "/no_dropout.json") << j.dump();
  EXPECT_NO_THROW(loom::data::load_tokenizer(dir + "/no_dropout.json"));
  // A pattern that backtracks catastrophically hits PCRE2's match limit: named as such.
  j = original;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a+)+b";
  std::ofstream(dir + "/backtrack.json") << j.dump();
  auto tokenizer = loom::data::load_tokenizer(dir + "/backtrack.json");
  const std::string what =
      expect_input_error([&] { tokenizer->encode(std::string(60, 'a') + "cb"); });
  EXPECT_NE(what.find("could not match"), std::string::npos) << what;
  EXPECT_EQ(what.find("not valid UTF-8"), std::string::npos) << what;
}

TEST(HostileTokenizers, TiktokenRanksAreUniqueDecimalAndBounded) {
  const std::string dir = loom::testing::fresh_temp_dir("hostile_tiktoken");
  auto load = [&](const std::string& ranks) {
    std::ofstream(dir + "/t.tiktoken") << ranks;
    std::ofstream(dir + "/t.json")
        << R"({"pat_str": "\\S+|\\s+", "special_tokens": {"<|endoftext|>": 3}})";
    return loom::data::load_tokenizer(dir + "/t.tiktoken");
  };
  EXPECT_EQ(load("IQ== 0\nIg== 1\nIw== 2\n")->vocab_size(), 4);
  EXPECT_EQ(load("IQ== 0\r\nIg== 1\r\n")->vocab_size(), 4);  // CRLF files
  EXPECT_NE(expect_input_error([&] { load("IQ== 0\nIg== 0\n"); }).find("rank 0 is given to two"),
            std::string::npos);
  EXPECT_NE(expect_input_error([&] { load("IQ== 0\nIQ== 1\n"); }).find("appears twice"),
            std::string::npos);
  EXPECT_NE(expect_input_error([&] { load("IQ== 2147483647\n"); }).find("t.tiktoken:1"),
            std::string::npos);
  EXPECT_THROW(load("IQ== 12abc\n"), loom::InputError);
  EXPECT_THROW(load("IQ== -1\n"), loom::InputError);
  // A special token on an ordinary token's rank, or beyond any vocabulary.
  std::ofstream(dir + "/s.tiktoken") << "IQ== 0\nIg== 1\n";
  std::ofstream(dir + "/s.json")
      << R"({"pat_str": "\\S+", "special_tokens": {"<|endoftext|>": 1}})";
  EXPECT_THROW(loom::data::load_tokenizer(dir + "/s.tiktoken"), loom::InputError);
  std::ofstream(dir + "/s.json")
      << R"({"pat_str": "\\S+", "special_tokens": {"<|endoftext|>": 4294967303}})";
  EXPECT_THROW(loom::data::load_tokenizer(dir + "/s.tiktoken"), loom::InputError);
  // Two special tokens on one id: decoding it could not tell which was meant.
  std::ofstream(dir + "/s.json") << R"({"pat_str": "\\S+", "special_tokens": )"
                                 << R"({"<|endoftext|>": 2, "<|begin_of_text|>": 2}})";
  EXPECT_NE(expect_input_error([&] {
              loom::data::load_tokenizer(dir + "/s.tiktoken");
            }).find("share id 2"),
            std::string::npos);
}

TEST(HostileData, TruncatedOrDamagedGzipIsRefusedAndAWholeOneReads) {
  const std::string dir = loom::testing::fresh_temp_dir("hostile_gz_unit");
  std::string jsonl;
  for (int i = 0; i < 500; ++i) jsonl += "{\"text\": \"line " + std::to_string(i) + "\"}\n";
  const std::string path = dir + "/d.jsonl.gz";
  gzFile out = gzopen(path.c_str(), "wb");
  gzwrite(out, jsonl.data(), static_cast<unsigned>(jsonl.size()));
  gzclose(out);
  EXPECT_EQ(loom::data::read_documents(path).size(), 500u);
  const std::string bytes = loom::testing::read_text(path);
  for (size_t cut : {bytes.size() - 1, bytes.size() - 8, bytes.size() / 2, size_t{12}}) {
    std::ofstream(dir + "/cut.jsonl.gz", std::ios::binary) << bytes.substr(0, cut);
    const std::string what =
        expect_input_error([&] { loom::data::read_documents(dir + "/cut.jsonl.gz"); });
    EXPECT_NE(what.find("cut.jsonl.gz"), std::string::npos) << what;
  }
  ASSERT_EQ(::mkfifo((dir + "/f.jsonl").c_str(), 0644), 0);
  EXPECT_NE(expect_input_error([&] { loom::data::read_documents(dir + "/f.jsonl"); }).find("FIFO"),
            std::string::npos);
  // Members concatenated (cat a.gz b.gz) read whole, zero padding after them too. A damaged
  // second member header and a .gz that is not gzip are refused: zlib's gzread ended quietly at
  // the first (half the documents) and read the second as plain text.
  std::ofstream(dir + "/two.jsonl.gz", std::ios::binary) << bytes << bytes;
  EXPECT_EQ(loom::data::read_documents(dir + "/two.jsonl.gz").size(), 1000u);
  std::ofstream(dir + "/padded.jsonl.gz", std::ios::binary) << bytes << std::string(512, '\0');
  EXPECT_EQ(loom::data::read_documents(dir + "/padded.jsonl.gz").size(), 500u);
  std::string damaged = bytes + bytes;
  damaged[bytes.size()] = 'x';
  std::ofstream(dir + "/damaged.jsonl.gz", std::ios::binary) << damaged;
  EXPECT_NE(expect_input_error([&] {
              loom::data::read_documents(dir + "/damaged.jsonl.gz");
            }).find("neither a gzip member nor zero padding after member 1"),
            std::string::npos);
  std::ofstream(dir + "/plain.jsonl.gz") << jsonl;
  EXPECT_NE(expect_input_error([&] {
              loom::data::read_documents(dir + "/plain.jsonl.gz");
            }).find("is not gzip data"),
            std::string::npos);
}

// A zstd file a few KB long holding one line of gigabytes grew the line buffer without a cap: a
// line longer than training.dataset_max_document_mib is refused naming the file and the key.
TEST(HostileData, ALineLongerThanTheCapIsRefused) {
  const std::string dir = loom::testing::fresh_temp_dir("hostile_zstd_bomb");
  const std::string line = "{\"text\": \"" + std::string(3 << 20, 'a') + "\"}\n";
  std::string packed(ZSTD_compressBound(line.size()), '\0');
  const size_t size = ZSTD_compress(packed.data(), packed.size(), line.data(), line.size(), 19);
  ASSERT_FALSE(ZSTD_isError(size));
  ASSERT_LT(size, 4096u);  // a bomb: kilobytes on disk
  const std::string path = dir + "/bomb.jsonl.zst";
  std::ofstream(path, std::ios::binary) << packed.substr(0, size);
  const std::string what = expect_input_error(
      [&] { loom::data::read_documents(path, "text", false, nullptr, int64_t{1} << 20); });
  EXPECT_NE(what.find("bomb.jsonl.zst': one line is longer than 1 MiB "
                      "(training.dataset_max_document_mib)"),
            std::string::npos)
      << what;
  // Under a cap that holds it, the same file reads.
  EXPECT_EQ(loom::data::read_documents(path, "text", false, nullptr, int64_t{8} << 20).size(), 1u);
}

TEST(HostileData, StrictJsonNamesTheKey) {
  EXPECT_NE(expect_input_error([] {
              loom::json::parse_strict(R"({"a":1,"b":{"c":1,"c":2}})", "f");
            }).find("'c' appears twice"),
            std::string::npos);
  // The same key in two different objects is fine.
  EXPECT_NO_THROW(loom::json::parse_strict(R"({"a":{"c":1},"b":{"c":2}})", "f"));
  const auto j =
      loom::json::parse_strict(R"({"n": 5, "s": "x", "big": 18446744073709551615})", "f");
  EXPECT_NE(expect_input_error([&] {
              loom::json::int_field(j, "s", "f.json");
            }).find("f.json: key 's' must be an integer"),
            std::string::npos);
  EXPECT_THROW(loom::json::int_field(j, "big", "f"), loom::InputError);
  EXPECT_THROW(loom::json::int_field(j, "n", "f", 0, 4), loom::InputError);
  EXPECT_THROW(loom::json::string_field(j, "n", "f"), loom::InputError);
}

TEST(StartChecks, HfAssetsPathGivesItsTokenizerJson) {
  using loom::data::tokenizer_location;
  const std::string dir = loom::testing::fresh_temp_dir("hf_assets_unit");
  std::ofstream(dir + "/tokenizer.json") << "{}";
  EXPECT_EQ(tokenizer_location(std::nullopt, dir), dir + "/tokenizer.json");
  EXPECT_EQ(tokenizer_location(std::string("byte"), dir), "byte");  // tokenizer_path wins
  fs::create_directories(dir + "/empty");
  EXPECT_THROW(tokenizer_location(std::nullopt, dir + "/empty"), loom::InputError);
  EXPECT_THROW(tokenizer_location(std::nullopt, dir + "/missing"), loom::InputError);
  // torchtitan's default folder, absent: the byte tokenizer.
  EXPECT_EQ(tokenizer_location(std::nullopt, loom::config::ModelSection{}.hf_assets_path), "byte");
}

TEST(StartChecks, MemoryEstimateRefusesWhatCannotFitAndPassesTheDebugJob) {
  loom::config::JobConfig c;
  c.model.flavor = "debugmodel";
  c.training.local_batch_size = 4;
  c.training.seq_len = 256;
  const auto small = loom::train::estimate_memory(c, 0, 1, at::Device(at::kCPU));
  EXPECT_GT(small.model_state_bytes, 0);
  EXPECT_LT(small.total(), 4e9);
  EXPECT_NO_THROW(loom::train::check_memory_fits(c, 0, 1, at::Device(at::kCPU)));
  // FSDP shards the model state.
  EXPECT_NEAR(loom::train::estimate_memory(c, 0, 4, at::Device(at::kCPU)).model_state_bytes,
              small.model_state_bytes / 4, 1.0);
  // The optimizer's own state count: Muon keeps one momentum on its matrices, not two moments.
  EXPECT_DOUBLE_EQ(small.optimizer_states, 2.0);
  c.optimizer.name = "Muon";
  const auto muon = loom::train::estimate_memory(c, 0, 1, at::Device(at::kCPU));
  EXPECT_LT(muon.optimizer_states, 1.9);
  EXPECT_NEAR(muon.model_state_bytes / small.model_state_bytes, (2.0 + muon.optimizer_states) / 4.0,
              1e-9);
  c.optimizer.name = "AdamW";
  c.training.seq_len = 1 << 20;
  c.training.local_batch_size = 4096;
  const std::string what =
      expect_input_error([&] { loom::train::check_memory_fits(c, 0, 1, at::Device(at::kCPU)); });
  EXPECT_NE(what.find("training.seq_len = 1048576"), std::string::npos) << what;
  EXPECT_NE(what.find("GiB"), std::string::npos) << what;
}

// Found by tools/fuzz.sh (fuzz_config): a number too large for a double made nlohmann throw
// out_of_range, which escaped the JSON readers' parse_error handlers and terminated loom.
TEST(FuzzFindings, JsonNumberOverflowIsAnInputError) {
  const std::string config = R"({"job": {"dump_folder": "tb"}, "model": 999E999999999999999})";
  const std::string what =
      expect_input_error([&] { loom::config::load_job_config_text(config, "fuzz.json", {}); });
  EXPECT_NE(what.find("fuzz.json"), std::string::npos) << what;
  const std::string dir = loom::testing::fresh_temp_dir("fuzz_number_overflow");
  std::ofstream(dir + "/d.jsonl") << "{\"text\": \"fine\"}\n{\"text\": \"x\", \"n\": 1e999}\n";
  const std::string record =
      expect_input_error([&] { loom::data::read_documents(dir + "/d.jsonl"); });
  EXPECT_NE(record.find("d.jsonl:2"), std::string::npos) << record;
  EXPECT_THROW(loom::json::parse_strict("[1e999]", "f"), loom::InputError);
}

// Found by tools/fuzz.sh (fuzz_hf_tokenizer, AddressSanitizer): a tokenizer.json whose model has
// no "continuing_subword_prefix" / "end_of_word_suffix" key read past a map node (operator[] on a
// const object with a missing key). Such a file loads like one with the keys set to null.
TEST(FuzzFindings, HfTokenizerWithoutOptionalModelKeysLoads) {
  const std::string dir = loom::testing::fresh_temp_dir("fuzz_hf_optional_keys");
  auto j = nlohmann::json::parse(std::ifstream(kFixtures + "/hf_gpt2_style.json"));
  j["model"].erase("continuing_subword_prefix");
  j["model"].erase("end_of_word_suffix");
  j.erase("normalizer");
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  auto tokenizer = loom::data::load_tokenizer(dir + "/tokenizer.json");
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("hello world")), "hello world");
  j["model"]["end_of_word_suffix"] = "</w>";
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  EXPECT_THROW(loom::data::load_tokenizer(dir + "/tokenizer.json"), loom::InputError);
}
