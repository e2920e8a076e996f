// SentencePiece models (BPE with byte fallback, Unigram) and Qwen-style tokenizer.json files
// (NFC / NFKC normalizer, Qwen's Split regex, ByteLevel) against the Python packages' ids on 100
// varied texts. The fixtures are made inside the test by sentencepiece's trainer and
// `tokenizers` (tools/make_tokenizer_fixtures.py).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "loom/core/check.h"
#include "loom/data/normalizer.h"
#include "loom/data/sentencepiece_tokenizer.h"
#include "loom/data/tokenizer.h"
#include "support/process.h"

namespace {

class TokenizerFormats : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(loom::testing::fresh_temp_dir("tokenizer_formats"));
    const std::string command = std::string("'") + LOOM_PYTHON + "' '" + LOOM_SOURCE_DIR +
                                "/tools/make_tokenizer_fixtures.py' '" + *dir_ + "' 2>&1";
    const auto result = loom::testing::run_command(command);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    expected_ = new nlohmann::json(nlohmann::json::parse(std::ifstream(*dir_ + "/expected.json")));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete expected_;
    dir_ = nullptr;
    expected_ = nullptr;
  }
  // Every text's ids from loom's tokenizer equal the Python package's; decode round-trips.
  static void expect_same_ids(const std::string& fixture, const std::string& file,
                              bool round_trip) {
    auto tokenizer = loom::data::load_tokenizer(*dir_ + "/" + file);
    const auto& texts = expected_->at("texts");
    const auto& ids = expected_->at(fixture);
    ASSERT_EQ(texts.size(), 100u);
    int mismatches = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      const auto want = ids[i].get<std::vector<int32_t>>();
      const auto got = tokenizer->encode(text);
      if (got != want && ++mismatches <= 5) {
        ADD_FAILURE() << fixture << " text " << i << " '" << text
                      << "': " << nlohmann::json(got).dump()
                      << " != " << nlohmann::json(want).dump();
      }
      if (round_trip && got == want) {
        EXPECT_EQ(tokenizer->decode(got), text) << fixture << " " << i;
      }
    }
    EXPECT_EQ(mismatches, 0) << fixture;
  }
  static std::string* dir_;
  static nlohmann::json* expected_;
};

std::string* TokenizerFormats::dir_ = nullptr;
nlohmann::json* TokenizerFormats::expected_ = nullptr;

TEST_F(TokenizerFormats, SentencePieceBpeWithByteFallbackMatchesPython) {
  expect_same_ids("sp_bpe", "sp_bpe.model", /*round_trip=*/false);
  auto tokenizer = loom::data::load_tokenizer(*dir_ + "/sp_bpe.model");
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_id(), 2);
  EXPECT_EQ(tokenizer->vocab_size(), 600);
  EXPECT_EQ(tokenizer->name().rfind("sentencepiece:", 0), 0u);
  // Identity normalization with byte fallback: any text comes back whole.
  const std::string text = "rare 𓀀 hieroglyph  and   spaces";
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
}

TEST_F(TokenizerFormats, SentencePieceUnigramMatchesPython) {
  expect_same_ids("sp_unigram", "sp_unigram.model", /*round_trip=*/false);
}

TEST_F(TokenizerFormats, QwenStyleNfcTokenizerJsonMatchesTokenizers) {
  expect_same_ids("qwen_style", "qwen_style.json", /*round_trip=*/false);
  expect_same_ids("nfkc_style", "nfkc_style.json", /*round_trip=*/false);
  // NFC composes: the decomposed and precomposed é encode alike.
  auto tokenizer = loom::data::load_tokenizer(*dir_ + "/qwen_style.json");
  EXPECT_EQ(tokenizer->encode("e\u0301"), tokenizer->encode("\u00e9"));
  EXPECT_EQ(loom::data::UnicodeNormalizer("NFKC").normalize("ﬁ ＡＢ①"), "fi AB1");
}

// Added tokens are found in the text as `tokenizers` finds them: the special ones (normalized
// false, with lstrip / rstrip taking the whitespace beside them) in the raw text, ordinary
// normalized ones after NFKC, the longest at the leftmost position (expected ids by the venv's
// `tokenizers`; qwen_style's texts hold its special tokens too).
TEST_F(TokenizerFormats, AddedTokensInTheTextAreMatchedAsTokenizersMatchesThem) {
  expect_same_ids("added_style", "added_style.json", /*round_trip=*/false);
  auto tokenizer = loom::data::load_tokenizer(*dir_ + "/added_style.json");
  const auto ids = tokenizer->encode("x<|endoftext|>y");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(tokenizer->decode({ids[1]}), "<|endoftext|>");
}

TEST_F(TokenizerFormats, TiktokenAndGarbageModelFilesAreToldApart) {
  // tiktoken text named tokenizer.model (Llama 3) stays a tiktoken BPE.
  std::ofstream(*dir_ + "/tiktoken.model") << "IQ== 0\nIg== 1\nIw== 2\n";
  EXPECT_FALSE(loom::data::is_sentencepiece_model(*dir_ + "/tiktoken.model"));
  EXPECT_TRUE(loom::data::is_sentencepiece_model(*dir_ + "/sp_unigram.model"));
  // Garbage is refused naming the file and both formats.
  std::ofstream(*dir_ + "/garbage.model", std::ios::binary)
      << std::string("\x01\xff\x17garbage", 10);
  try {
    loom::data::load_tokenizer(*dir_ + "/garbage.model");
    ADD_FAILURE() << "garbage loaded";
  } catch (const loom::InputError& error) {
    const std::string what = error.message();
    EXPECT_NE(what.find("garbage.model"), std::string::npos) << what;
    EXPECT_NE(what.find("SentencePiece"), std::string::npos) << what;
  }
  // An unsupported normalizer is refused by name.
  auto j = nlohmann::json::parse(std::ifstream(*dir_ + "/qwen_style.json"));
  j["normalizer"] = {{"type", "Lowercase"}};
  std::ofstream(*dir_ + "/lower.json") << j.dump();
  try {
    loom::data::load_tokenizer(*dir_ + "/lower.json");
    ADD_FAILURE() << "Lowercase loaded";
  } catch (const loom::InputError& error) {
    EXPECT_NE(error.message().find("Lowercase"), std::string::npos) << error.message();
  }
}

}  // namespace
