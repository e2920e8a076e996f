#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <zlib.h>

#include <fstream>
#include <set>

#include "loom/core/check.h"
#include "loom/data/documents.h"
#include "loom/data/packed_loader.h"
#include "loom/data/tokenizer.h"
#include "support/process.h"

using loom::data::ByteTokenizer;
using loom::data::PackedLoader;

namespace {

std::string write_file(const std::string& dir, const std::string& name,
                       const std::string& content) {
  std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

std::string error_of(const std::string& path) {
  try {
    loom::data::read_documents(path);
  } catch (const loom::InputError& error) {
    return error.message();
  }
  return "<no error>";
}

}  // namespace

TEST(ByteTokenizer, RoundTripsAnyUtf8AndSkipsSpecials) {
  ByteTokenizer tok;
  const std::string text = "Grüße, 世界! \t\n tabs and 🎉";
  auto ids = tok.encode(text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(tok.decode(ids), text);
  ids.insert(ids.begin(), tok.bos_id());
  ids.push_back(tok.eos_id());
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.vocab_size(), 259);
  EXPECT_THROW(tok.decode({300}), loom::InputError);
  EXPECT_THROW(loom::data::load_tokenizer("/some/tokenizer.model"), loom::InputError);
}

TEST(Documents, ReadsJsonlPlainAndGzip) {
  std::string dir = loom::testing::fresh_temp_dir("data_docs");
  auto jsonl =
      write_file(dir, "a.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\", \"id\": 2}\n");
  EXPECT_EQ(loom::data::read_documents(jsonl), (std::vector<std::string>{"one", "two"}));
  auto custom = write_file(dir, "b.jsonl", "{\"body\": \"x\"}\n");
  EXPECT_EQ(loom::data::read_documents(custom, "body"), std::vector<std::string>{"x"});
  auto txt = write_file(dir, "c.txt", "plain text\nline two\n");
  EXPECT_EQ(loom::data::read_documents(txt), std::vector<std::string>{"plain text\nline two\n"});
  gzFile gz = gzopen((dir + "/d.jsonl.gz").c_str(), "wb");
  gzputs(gz, "{\"text\": \"zipped\"}\n");
  gzclose(gz);
  EXPECT_EQ(loom::data::read_documents(dir + "/d.jsonl.gz"), std::vector<std::string>{"zipped"});
}

TEST(Documents, BadInputNamesFileAndLine) {
  std::string dir = loom::testing::fresh_temp_dir("data_bad");
  EXPECT_NE(error_of(write_file(dir, "bad.jsonl", "{\"text\": \"ok\"}\n{not json}\n"))
                .find("bad.jsonl:2: invalid JSON"),
            std::string::npos);
  EXPECT_NE(error_of(write_file(dir, "field.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"x\"}\n"))
                .find("field.jsonl:2: no \"text\" field"),
            std::string::npos);
  EXPECT_NE(error_of(write_file(dir, "type.jsonl", "{\"text\": 5}\n"))
                .find("type.jsonl:1: \"text\" is not a string"),
            std::string::npos);
  EXPECT_NE(
      error_of(write_file(dir, "latin1.txt", "caf\xe9\n")).find("latin1.txt: not valid UTF-8"),
      std::string::npos);
  EXPECT_NE(error_of(write_file(dir, "empty.jsonl", "")).find("empty.jsonl' is empty"),
            std::string::npos);
  EXPECT_NE(error_of(dir + "/missing.jsonl").find("missing.jsonl"), std::string::npos);
}

TEST(Documents, Utf8Validation) {
  EXPECT_TRUE(loom::data::is_valid_utf8("ascii é 世 🎉"));
  EXPECT_FALSE(loom::data::is_valid_utf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(loom::data::is_valid_utf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(loom::data::is_valid_utf8("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(loom::data::is_valid_utf8("\xe4\xb8"));          // truncated
}

TEST(PackedLoader, PacksDocumentsWithBosEosAndShiftsLabels) {
  ByteTokenizer tok;
  PackedLoader loader({"abc", "de"}, tok, {/*seq_len=*/3, /*seed=*/0, /*shuffle=*/false});
  // Stream: BOS a b c EOS BOS d e EOS -> 9 tokens -> two windows of 4.
  EXPECT_EQ(loader.total_tokens(), 9);
  EXPECT_EQ(loader.samples_per_epoch(), 2);
  auto batch = loader.next(2, 3);
  std::vector<int64_t> first(batch.inputs[0].data_ptr<int64_t>(),
                             batch.inputs[0].data_ptr<int64_t>() + 3);
  EXPECT_EQ(first, (std::vector<int64_t>{256, 'a', 'b'}));
  EXPECT_TRUE(at::equal(batch.labels.slice(1, 0, 2), batch.inputs.slice(1, 1, 3)));
  // Second window: EOS BOS d e.
  EXPECT_EQ(batch.inputs[1][0].item<int64_t>(), 257);
  EXPECT_EQ(batch.labels[1][2].item<int64_t>(), 'e');
}

TEST(PackedLoader, EachEpochVisitsEveryWindowOnceInASeededOrder) {
  ByteTokenizer tok;
  std::vector<std::string> docs;
  for (int i = 0; i < 50; ++i)
    docs.push_back(std::string(static_cast<size_t>(10 + i), static_cast<char>('a' + i % 26)));
  PackedLoader a(docs, tok, {7, 42, true});
  PackedLoader b(docs, tok, {7, 42, true});
  PackedLoader c(docs, tok, {7, 43, true});
  const int64_t windows = *a.samples_per_epoch();
  auto window_of = [](const loom::data::Batch& x) {
    std::vector<int64_t> key(x.inputs.data_ptr<int64_t>(), x.inputs.data_ptr<int64_t>() + 7);
    key.push_back(x.labels[0][6].item<int64_t>());
    return key;
  };
  // One shuffled epoch holds exactly the windows of the stream in order (as a multiset).
  PackedLoader in_order(docs, tok, {7, 0, false});
  std::multiset<std::vector<int64_t>> expected, seen;
  for (int64_t i = 0; i < windows; ++i) {
    auto x = a.next(1, 7);
    auto y = b.next(1, 7);
    EXPECT_TRUE(at::equal(x.inputs, y.inputs));
    seen.insert(window_of(x));
    expected.insert(window_of(in_order.next(1, 7)));
  }
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(a.epoch(), 0);
  a.next(1, 7);
  EXPECT_EQ(a.epoch(), 1);
  EXPECT_FALSE(
      at::equal(PackedLoader(docs, tok, {7, 42, true}).next(8, 7).inputs, c.next(8, 7).inputs));
}

TEST(PackedLoader, EmbeddedCorpusLoadsWithAHeldOutSplit) {
  ByteTokenizer tok;
  auto train =
      loom::data::open_dataset("brown", std::nullopt, tok, {256, 0, true}, "training.dataset");
  auto validation = loom::data::open_dataset("brown_validation", std::nullopt, tok, {256, 0, false},
                                             "validation.dataset");
  EXPECT_GT(train->total_tokens(), 5'000'000);
  EXPECT_GT(validation->total_tokens(), 100'000);
  EXPECT_THROW(
      loom::data::open_dataset("c4", std::nullopt, tok, {256, 0, true}, "training.dataset"),
      loom::InputError);
}
