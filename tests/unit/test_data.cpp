#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <fstream>
#include <set>
#include <thread>

#include "loom/core/check.h"
#include "loom/core/signals.h"
#include "loom/data/batch_source.h"
#include "loom/data/bpe_trainer.h"
#include "loom/data/documents.h"
#include "loom/data/packed_loader.h"
#include "loom/data/prefetch.h"
#include "loom/data/tokenizer.h"
#include "support/process.h"

using loom::data::ByteTokenizer;
using loom::data::PackedLoader;
using loom::data::PackedLoaderOptions;

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
  // Nested a million deep: refused as it is read, not followed.
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  EXPECT_NE(error_of(write_file(dir, "deep.jsonl", "{\"text\": " + deep + "}\n"))
                .find("deep.jsonl:1: invalid JSON: JSON nested deeper than 256 levels"),
            std::string::npos);
  EXPECT_NE(error_of(write_file(dir, "field.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"x\"}\n"))
                .find("field.jsonl:2: no \"text\" field"),
            std::string::npos);
  EXPECT_NE(
      error_of(write_file(dir, "array.json", "[{\"text\": \"a\"}, {\"text\": \"b\"}]\n"))
          .find("array.json:1: expected one JSON object per line (JSON Lines), found an array"),
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
  EXPECT_EQ(a.epoch(), 1);  // the next sample opens epoch 1, in a new order
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

namespace {

std::vector<std::string> numbered_docs(int n) {
  std::vector<std::string> docs;
  for (int i = 0; i < n; ++i)
    docs.push_back("document " + std::to_string(i) + " " +
                   std::string(static_cast<size_t>(i % 13), 'x'));
  return docs;
}

// Rows of a batch as vectors, to compare samples across loaders.
std::vector<std::vector<int64_t>> rows(const loom::data::Batch& batch) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < batch.inputs.size(0); ++r) {
    auto row = batch.inputs[r].contiguous();
    out.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  return out;
}

}  // namespace

TEST(PackedLoader, DataParallelRanksSplitEachGlobalBatchWithoutOverlap) {
  ByteTokenizer tok;
  auto docs = numbered_docs(300);
  PackedLoader single(docs, tok, {16, 7, true, 0, 1});
  PackedLoader rank0(docs, tok, {16, 7, true, 0, 2});
  PackedLoader rank1(docs, tok, {16, 7, true, 1, 2});
  for (int step = 0; step < 40; ++step) {  // crosses epoch boundaries
    auto global = rows(single.next(8, 16));
    auto a = rows(rank0.next(4, 16));
    auto b = rows(rank1.next(4, 16));
    a.insert(a.end(), b.begin(), b.end());
    EXPECT_EQ(a, global) << "step " << step;
  }
}

TEST(PackedLoader, ResumesExactlyAndReshardsByTheSampleCountRule) {
  ByteTokenizer tok;
  auto docs = numbered_docs(300);
  PackedLoader straight(docs, tok, {16, 3, true, 0, 1});
  for (int i = 0; i < 5; ++i) straight.next(8, 16);
  nlohmann::json saved = straight.state();
  EXPECT_EQ(saved["samples_consumed"], 40);
  auto expected = rows(straight.next(8, 16));

  PackedLoader resumed(docs, tok, {16, 3, true, 0, 1});
  resumed.load_state(saved);
  EXPECT_EQ(rows(resumed.next(8, 16)), expected);

  // Two ranks resuming the one-rank state continue with the same global batch.
  PackedLoader r0(docs, tok, {16, 3, true, 0, 2}), r1(docs, tok, {16, 3, true, 1, 2});
  r0.load_state(saved);
  r1.load_state(saved);
  auto both = rows(r0.next(4, 16));
  auto second = rows(r1.next(4, 16));
  both.insert(both.end(), second.begin(), second.end());
  EXPECT_EQ(both, expected);

  PackedLoader other_seed(docs, tok, {16, 4, true, 0, 1});
  EXPECT_THROW(other_seed.load_state(saved), loom::InputError);
  EXPECT_THROW(resumed.load_state(nlohmann::json{{"kind", "packed"}}), loom::InputError);
}

TEST(Prefetch, SameBatchesAndStateOfWhatWasHandedOut) {
  ByteTokenizer tok;
  auto docs = numbered_docs(200);
  PackedLoader plain(docs, tok, {16, 9, true, 0, 1});
  loom::data::PrefetchingSource prefetched(
      std::make_unique<PackedLoader>(docs, tok, PackedLoaderOptions{16, 9, true, 0, 1}), 4, 16, 3);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(rows(prefetched.next(4, 16)), rows(plain.next(4, 16))) << i;
  }
  // The thread is ahead, but the state reflects only the 10 batches handed out.
  EXPECT_EQ(prefetched.state()["samples_consumed"], 40);
  prefetched.load_state(plain.state());
  EXPECT_EQ(rows(prefetched.next(4, 16)), rows(plain.next(4, 16)));
  // A state the source refuses: the error goes up, and the source goes on from where it stood
  // (its thread stayed stopped, and the next batch never came).
  EXPECT_THROW(prefetched.load_state(nlohmann::json{{"kind", "packed"}}), loom::InputError);
  EXPECT_EQ(prefetched.state()["samples_consumed"], 44);
  EXPECT_EQ(rows(prefetched.next(4, 16)), rows(plain.next(4, 16)));
}

namespace {
class FailingSource : public loom::data::BatchSource {
 public:
  loom::data::Batch next(int64_t, int64_t) override {
    if (++calls_ > 2) LOOM_THROW(loom::InputError, "corrupt shard");
    loom::data::Batch batch;
    batch.inputs = at::zeros({1, 4}, at::kLong);
    batch.labels = at::zeros({1, 4}, at::kLong);
    return batch;
  }
  nlohmann::json state() const override { return calls_; }
  void load_state(const nlohmann::json&) override {}
  int calls_ = 0;
};
}  // namespace

TEST(Prefetch, ErrorsInTheThreadReachTheCaller) {
  loom::data::PrefetchingSource source(std::make_unique<FailingSource>(), 1, 4, 2);
  source.next(1, 4);
  source.next(1, 4);
  EXPECT_THROW(source.next(1, 4), loom::InputError);
}

TEST(BpeTrainer, LearnsDeterministicMergesThatRoundTrip) {
  std::vector<std::string> docs = {"the cat sat on the mat", "the hat that the cat ate",
                                   "the the the"};
  loom::data::BpeTrainingOptions options;
  options.vocab_size = 259 + 10;
  auto a = loom::data::train_bpe(docs, options);
  auto b = loom::data::train_bpe(docs, options);
  EXPECT_EQ(a.tokenizer_json, b.tokenizer_json);
  EXPECT_GT(a.merges, 0);
  EXPECT_LE(a.merges, 10);
  auto json = nlohmann::json::parse(a.tokenizer_json);
  // The most frequent pair of these documents: " t" + "he" style pieces start with "t"+"h".
  auto first = json["model"]["merges"][0];
  EXPECT_EQ(first[0].get<std::string>() + first[1].get<std::string>(), "th");

  std::string dir = loom::testing::fresh_temp_dir("bpe_trainer");
  std::ofstream(dir + "/tok.json") << a.tokenizer_json;
  auto tokenizer = loom::data::load_tokenizer(dir + "/tok.json");
  const std::string text = "the cat sat on a different mat, ünïcödé 🎉";
  auto ids = tokenizer->encode(text);
  EXPECT_LT(ids.size(), text.size());  // merges apply
  EXPECT_EQ(tokenizer->decode(ids), text);
  EXPECT_EQ(tokenizer->vocab_size(), 256 + a.merges + 3);
  options.vocab_size = 100;
  EXPECT_THROW(loom::data::train_bpe(docs, options), loom::InputError);
}

TEST(BpeTrainer, ShippedCorpusTokenizerLoadsByName) {
  auto tokenizer = loom::data::load_tokenizer("brown_bpe");
  EXPECT_EQ(tokenizer->vocab_size(), 4096);
  const std::string text = "The Fulton County Grand Jury said Friday an investigation";
  EXPECT_LT(tokenizer->encode(text).size(), text.size() / 3);
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
}

TEST(Documents, DatasetPathsExpandDirectoriesAndGlobs) {
  std::string dir = loom::testing::fresh_temp_dir("data_paths");
  write_file(dir, "b.jsonl", "{\"text\": \"b\"}\n");
  write_file(dir, "a.txt", "a");
  write_file(dir, "notes.md", "ignored");
  EXPECT_EQ(loom::data::expand_dataset_path(dir),
            (std::vector<std::string>{dir + "/a.txt", dir + "/b.jsonl"}));
  EXPECT_EQ(loom::data::expand_dataset_path(dir + "/*.jsonl"),
            std::vector<std::string>{dir + "/b.jsonl"});
  // A glob takes the dataset files among its matches, as a folder does (notes.md was a document).
  EXPECT_EQ(loom::data::expand_dataset_path(dir + "/*"),
            (std::vector<std::string>{dir + "/a.txt", dir + "/b.jsonl"}));
  EXPECT_THROW(loom::data::expand_dataset_path(dir + "/*.parquet"), loom::InputError);
  ByteTokenizer tok;
  auto loader = loom::data::open_dataset("mine", dir, tok, {1, 0, false, 0, 1}, "training.dataset");
  EXPECT_EQ(loader->total_tokens(), 6);  // BOS a EOS BOS b EOS
}

// A healed replica group's loader skips to the quorum's step batch by batch; SIGTERM ends the
// skipping within a batch however far that step is (a claimed step of 10^15 once kept a group
// skipping for hours, deaf to SIGTERM).
TEST(SkipBatches, AStopSignalEndsTheSkippingWithinABatch) {
  using namespace std::chrono_literals;
  struct SlowSource : loom::data::BatchSource {
    int64_t reads = 0;
    loom::data::Batch next(int64_t, int64_t) override {
      ++reads;
      std::this_thread::sleep_for(1ms);
      return {};
    }
    nlohmann::json state() const override { return {}; }
    void load_state(const nlohmann::json&) override {}
  } source;
  EXPECT_EQ(loom::data::skip_batches(source, 5, 1, 8), 5);
  loom::signals::install_shutdown_handlers();
  std::thread signaller([] {
    std::this_thread::sleep_for(100ms);
    std::raise(SIGTERM);
  });
  const auto start = std::chrono::steady_clock::now();
  const int64_t far = 20000;  // 20 s of reads when the signal is not heard
  const int64_t skipped = loom::data::skip_batches(source, far, 1, 8);
  const auto took = std::chrono::steady_clock::now() - start;
  signaller.join();
  const int signal = loom::signals::shutdown_signal();
  loom::signals::clear_shutdown_request();
  EXPECT_EQ(signal, SIGTERM);
  EXPECT_LT(skipped, far);
  EXPECT_EQ(source.reads, 5 + skipped);
  EXPECT_LT(took, 5s);
}
