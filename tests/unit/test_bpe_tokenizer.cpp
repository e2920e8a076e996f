// loom's tiktoken-format BPE against ids from the PyPI tiktoken package
// (tests/data/tokenizers/tiktoken_vectors.json, made by tools/make_tokenizer_vectors.py).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>

#include "loom/core/check.h"
#include "loom/data/bpe_tokenizer.h"
#include "support/errors.h"
#include "support/process.h"

namespace {

const std::string kTokenizers = std::string(LOOM_SOURCE_DIR) + "/tests/data/tokenizers";

nlohmann::json vectors() {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/tests/data/tokenizers/tiktoken_vectors.json");
  return nlohmann::json::parse(in);
}

void check_encoding(const std::string& name) {
  const std::string path = kTokenizers + "/" + name + ".tiktoken";
  ASSERT_TRUE(std::ifstream(path).good())
      << path << " is missing (shipped in tests/data/tokenizers)";
  auto tokenizer = loom::data::load_tokenizer(path);
  const auto cases = vectors()["encodings"][name];
  ASSERT_GE(cases.size(), 10u);
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const auto expected = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer->encode(text), expected) << name << ": " << text;
    EXPECT_EQ(tokenizer->decode(expected), text) << name;
  }
}

}  // namespace

TEST(BpeTokenizer, Cl100kMatchesTiktoken) {
  check_encoding("cl100k_base");
}

TEST(BpeTokenizer, Gpt2MatchesTiktoken) {
  check_encoding("gpt2");
}

TEST(BpeTokenizer, SpecialTokensAndVocabulary) {
  auto tokenizer = loom::data::load_tokenizer(kTokenizers + "/cl100k_base.tiktoken");
  EXPECT_EQ(tokenizer->vocab_size(), 100277);
  EXPECT_EQ(tokenizer->eos_id(), 100257);
  EXPECT_EQ(tokenizer->decode({100257}), "<|endoftext|>");
  EXPECT_THROW(tokenizer->decode({100270}), loom::InputError);  // a hole in the id space
}

// gpt-oss's o200k_harmony: o200k_base's ranks (a tiny stand-in file here: the single bytes)
// under that name get the harmony special tokens, every id to 201087 named, so the vocabulary is
// the models' 201088 rows.
TEST(BpeTokenizer, O200kHarmonyNamesTheHarmonySpecialTokens) {
  const std::string dir = loom::testing::fresh_temp_dir("bpe_harmony");
  {
    std::ofstream ranks(dir + "/o200k_harmony.tiktoken");
    static const char* kBase64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int byte = 0; byte < 256; ++byte) {
      // One byte in base64: two characters and "==" padding.
      ranks << kBase64[byte >> 2] << kBase64[(byte & 3) << 4] << "== " << byte << "\n";
    }
  }
  auto tokenizer = loom::data::load_tokenizer(dir + "/o200k_harmony.tiktoken");
  EXPECT_EQ(tokenizer->vocab_size(), 201088);
  EXPECT_EQ(tokenizer->bos_id(), 199998);
  EXPECT_EQ(tokenizer->eos_id(), 199999);
  EXPECT_EQ(tokenizer->decode({200002}), "<|return|>");
  EXPECT_EQ(tokenizer->decode({200006, 200008, 200007}), "<|start|><|message|><|end|>");
  EXPECT_EQ(tokenizer->decode({201087}), "<|reserved_201087|>");
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("hi")), "hi");
}

TEST(BpeTokenizer, RoundTripsArbitraryText) {
  auto tokenizer = loom::data::load_tokenizer(kTokenizers + "/gpt2.tiktoken");
  std::string text;
  for (int i = 0; i < 2000; ++i) text += static_cast<char>(' ' + (i * 7919) % 95);
  text += "ünïcödé 🎉\n\t";
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
}

TEST(BpeTokenizer, BadFilesAreNamed) {
  const std::string dir = loom::testing::fresh_temp_dir("bpe_bad");
  std::ofstream(dir + "/cl100k_base.tiktoken") << "IQ== 0\nnot-base64!! 1\n";
  try {
    loom::data::load_tokenizer(dir + "/cl100k_base.tiktoken");
    FAIL();
  } catch (const loom::InputError& error) {
    EXPECT_NE(error.message().find("cl100k_base.tiktoken:2"), std::string::npos) << error.message();
  }
  std::ofstream(dir + "/mystery.tiktoken") << "IQ== 0\n";
  EXPECT_THROW(loom::data::load_tokenizer(dir + "/mystery.tiktoken"), loom::InputError);
  std::ofstream(dir + "/custom.tiktoken") << "IQ== 0\n";
  std::ofstream(dir + "/custom.json")
      << R"({"pat_str": "(unclosed", "special_tokens": {"<|endoftext|>": 1}})";
  EXPECT_THROW(loom::data::load_tokenizer(dir + "/custom.tiktoken"), loom::InputError);
}

// Hugging Face tokenizer.json (byte-level BPE) against the PyPI `tokenizers` package
// (fixtures and ids from tools/make_hf_tokenizer_fixture.py).
namespace {

void check_hf(const std::string& style) {
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/tests/data/tokenizers";
  auto tokenizer = loom::data::load_tokenizer(dir + "/hf_" + style + "_style.json");
  std::ifstream in(dir + "/hf_vectors.json");
  const auto cases = nlohmann::json::parse(in)["tokenizers"][style];
  ASSERT_GE(cases.size(), 10u);
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tokenizer->encode(text), c["ids"].get<std::vector<int32_t>>())
        << style << ": " << text;
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text) << style;
  }
  EXPECT_EQ(tokenizer->vocab_size(), 1024);
  EXPECT_EQ(tokenizer->decode({tokenizer->bos_id()}), "<|begin_of_text|>");
}

}  // namespace

TEST(HfTokenizer, Gpt2StyleByteLevelMatchesTokenizers) {
  check_hf("gpt2");
}

TEST(HfTokenizer, Llama3StyleSplitAndIgnoreMergesMatchesTokenizers) {
  check_hf("llama3");
}

TEST(HfTokenizer, UnsupportedPartsAreRefusedByName) {
  const std::string dir = loom::testing::fresh_temp_dir("hf_bad");
  std::ofstream(dir + "/wordpiece.json")
      << R"({"model": {"type": "WordPiece", "vocab": {}}, "normalizer": null})";
  try {
    loom::data::load_tokenizer(dir + "/wordpiece.json");
    FAIL();
  } catch (const loom::InputError& error) {
    EXPECT_NE(error.message().find("WordPiece"), std::string::npos) << error.message();
  }
  std::ofstream(dir + "/broken.json") << "{\"model\": ";
  EXPECT_THROW(loom::data::load_tokenizer(dir + "/broken.json"), loom::InputError);
  // Settings that would change the ids encode() returns or the text decode() writes.
  const auto original = nlohmann::json::parse(
      std::ifstream(std::string(LOOM_SOURCE_DIR) + "/tests/data/tokenizers/hf_llama3_style.json"));
  auto refused = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change,
                     const std::string& said) {
    nlohmann::json j = original;
    change(j);
    std::ofstream(dir + "/" + name + ".json") << j.dump();
    const std::string error = loom::testing::input_error_of(
        [&] { loom::data::load_tokenizer(dir + "/" + name + ".json"); });
    EXPECT_NE(error.find(said), std::string::npos) << name << ": " << error;
  };
  refused(
      "truncation",
      [](auto& j) {
        j["truncation"] = {{"max_length", 8}};
      },
      "truncation is");
  refused(
      "padding",
      [](auto& j) {
        j["padding"] = {{"strategy", "BatchLongest"}};
      },
      "padding is");
  refused(
      "metaspace",
      [](auto& j) {
        j["decoder"] = {{"type", "Metaspace"}};
      },
      "decoder");
  refused(
      "merge3",
      [](auto& j) {
        j["model"]["merges"][0] = {"a", "b", "c"};
      },
      "is not [\"left\"");
  refused(
      "single_word", [](auto& j) { j["added_tokens"][0]["single_word"] = true; },
      "single_word true");
  refused(
      "vocab_id",
      [](auto& j) {
        j["added_tokens"].push_back({{"id", 1024}, {"content", "a"}, {"special", false}});
      },
      "added token 'a' declares id 1024, but the vocabulary holds it at");
}
