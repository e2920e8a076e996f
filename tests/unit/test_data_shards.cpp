// Prepared token shards (write, mmap read, validation) and weighted dataset mixtures.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "loom/config/dataset_mixture.h"
#include "loom/core/check.h"
#include "loom/data/assets.h"
#include "loom/data/mixture.h"
#include "loom/data/packed_loader.h"
#include "loom/data/prefetch.h"
#include "loom/data/shards.h"
#include "loom/data/tokenizer.h"
#include "support/process.h"

using loom::data::PackedLoader;
using loom::data::PackedLoaderOptions;
namespace fs = std::filesystem;

namespace {
namespace test_data_shards {  // its own names in a unity batch

std::vector<std::string> varied_docs(int n, int seed = 0) {
  std::vector<std::string> docs;
  for (int i = 0; i < n; ++i) {
    docs.push_back("doc " + std::to_string(i + seed) + " " +
                   std::string(static_cast<size_t>((i * 7 + seed) % 23), 'a' + (i + seed) % 26) +
                   " café ✓");
  }
  return docs;
}

std::string write_jsonl(const std::string& path, const std::vector<std::string>& docs) {
  std::ofstream out(path);
  for (const auto& doc : docs) out << nlohmann::json{{"text", doc}}.dump() << "\n";
  return path;
}

std::string prepare(const std::string& output, const std::vector<std::string>& docs,
                    const loom::data::Tokenizer& tokenizer, int64_t shard_tokens) {
  loom::data::ShardWriter writer(output, tokenizer, shard_tokens);
  for (const auto& doc : docs) writer.add_document(doc);
  writer.finish();
  return output;
}

std::vector<std::vector<int64_t>> rows(const loom::data::Batch& batch) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < batch.inputs.size(0); ++r) {
    auto row = at::cat({batch.inputs[r], batch.labels[r].slice(0, -1)}).contiguous();
    out.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  return out;
}

std::string open_error(const std::string& path, const loom::data::Tokenizer& tokenizer,
                       bool verify = false) {
  try {
    loom::data::ShardedTokenStream stream(path, tokenizer);
    if (verify) stream.verify_all();
  } catch (const loom::InputError& error) {
    return error.message();
  }
  return "<no error>";
}

using loom::testing::contains;

nlohmann::json read_index(const std::string& dir) {
  return nlohmann::json::parse(loom::testing::read_text(dir + "/index.json"));
}

void write_index(const std::string& dir, const nlohmann::json& index) {
  std::ofstream(dir + "/index.json") << index.dump(2);
}

TEST(Shards, IndexDescribesShardsAndTheStreamMatchesTheTextPath) {
  auto tokenizer = loom::data::load_tokenizer("byte");
  const std::string dir = loom::testing::fresh_temp_dir("shards_layout");
  auto docs = varied_docs(40);
  prepare(dir + "/prepared", docs, *tokenizer, 200);
  EXPECT_FALSE(fs::exists(dir + "/prepared.tmp-" + std::to_string(::getpid())));
  auto index = read_index(dir + "/prepared");
  EXPECT_EQ(index["format"], loom::data::kShardFormat);
  EXPECT_EQ(index["version"], 1);
  EXPECT_EQ(index["dtype"], "uint16");
  EXPECT_EQ(index["vocab_size"], 259);
  EXPECT_EQ(index["tokenizer"]["path"], "byte");
  EXPECT_EQ(index["documents"], 40);
  ASSERT_GT(index["shards"].size(), 2u);  // 200-token shards of whole documents

  // The stream of the shards is the text path's stream: every document as BOS ids EOS.
  std::vector<int32_t> expected;
  for (const auto& doc : docs) loom::data::append_document(*tokenizer, doc, expected);
  loom::data::ShardedTokenStream stream(dir + "/prepared", *tokenizer);
  ASSERT_EQ(stream.size(), static_cast<int64_t>(expected.size()));
  EXPECT_EQ(index["tokens"], stream.size());
  std::vector<int64_t> all(expected.size());
  stream.read(0, stream.size(), all.data());  // crosses every shard boundary
  EXPECT_TRUE(std::equal(all.begin(), all.end(), expected.begin()));

  // Byte layout: shard 0 is little-endian uint16 ids; its offsets are uint64 document starts.
  const auto& first = index["shards"][0];
  std::ifstream bin(dir + "/prepared/" + first["tokens_file"].get<std::string>(), std::ios::binary);
  uint16_t head[2];
  bin.read(reinterpret_cast<char*>(head), sizeof(head));
  EXPECT_EQ(head[0], 256);  // BOS
  EXPECT_EQ(head[1], 'd');
  std::ifstream idx(dir + "/prepared/" + first["offsets_file"].get<std::string>(),
                    std::ios::binary);
  std::vector<uint64_t> offsets(first["documents"].get<size_t>() + 1);
  idx.read(reinterpret_cast<char*>(offsets.data()),
           static_cast<std::streamsize>(offsets.size() * 8));
  EXPECT_EQ(offsets.front(), 0u);
  EXPECT_EQ(offsets[1], docs[0].size() + 2);
  EXPECT_EQ(offsets.back(), first["tokens"].get<uint64_t>());

  // Overwriting needs the flag.
  EXPECT_THROW(loom::data::ShardWriter(dir + "/prepared", *tokenizer, 100), loom::InputError);
}

TEST(Shards, JsonlAndItsPreparedShardsGiveIdenticalBatchesResumeAndDpSlices) {
  auto tokenizer = loom::data::load_tokenizer("brown_bpe");
  const std::string dir = loom::testing::fresh_temp_dir("shards_parity");
  auto docs = varied_docs(300);
  const std::string jsonl = write_jsonl(dir + "/corpus.jsonl", docs);
  prepare(dir + "/prepared", docs, *tokenizer, 300);
  EXPECT_EQ(read_index(dir + "/prepared")["dtype"], "uint16");
  const PackedLoaderOptions one{16, 11, true, 0, 1};
  auto text = loom::data::open_dataset("mine", jsonl, *tokenizer, one, "training.dataset");
  auto shards =
      loom::data::open_dataset("mine", dir + "/prepared", *tokenizer, one, "training.dataset");
  ASSERT_EQ(text->samples_per_epoch(), shards->samples_per_epoch());
  for (int step = 0; step < 30; ++step) {  // several epochs
    ASSERT_EQ(rows(text->next(8, 16)), rows(shards->next(8, 16))) << "step " << step;
  }
  EXPECT_EQ(text->state(), shards->state());

  // Resume: the state of the text loader restores the shard loader on two ranks.
  auto expected = rows(text->next(8, 16));
  auto r0 = loom::data::open_dataset("mine", dir + "/prepared/index.json", *tokenizer,
                                     {16, 11, true, 0, 2}, "training.dataset");
  auto r1 = loom::data::open_dataset("mine", dir + "/prepared", *tokenizer, {16, 11, true, 1, 2},
                                     "training.dataset");
  r0->load_state(shards->state());
  r1->load_state(shards->state());
  auto both = rows(r0->next(4, 16));
  auto second = rows(r1->next(4, 16));
  both.insert(both.end(), second.begin(), second.end());
  EXPECT_EQ(both, expected);

  // Through the prefetch thread too.
  loom::data::PrefetchingSource prefetched(
      loom::data::open_dataset("mine", dir + "/prepared", *tokenizer, one, "training.dataset"), 8,
      16, 2);
  auto fresh = loom::data::open_dataset("mine", jsonl, *tokenizer, one, "training.dataset");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(rows(prefetched.next(8, 16)), rows(fresh->next(8, 16)));
}

TEST(Shards, LargeVocabulariesUseUint32) {
  const std::string path =
      std::string(LOOM_SOURCE_DIR) + "/tests/data/tokenizers/cl100k_base.tiktoken";
  ASSERT_TRUE(fs::exists(path)) << path << " is missing (shipped in tests/data/tokenizers)";
  auto tokenizer = loom::data::load_tokenizer(path);
  const std::string dir = loom::testing::fresh_temp_dir("shards_uint32");
  auto docs = varied_docs(20);
  prepare(dir + "/prepared", docs, *tokenizer, 1000);
  auto index = read_index(dir + "/prepared");
  EXPECT_EQ(index["dtype"], "uint32");
  EXPECT_EQ(index["vocab_size"], tokenizer->vocab_size());
  std::vector<int32_t> expected;
  for (const auto& doc : docs) loom::data::append_document(*tokenizer, doc, expected);
  loom::data::ShardedTokenStream stream(dir + "/prepared", *tokenizer);
  stream.verify_all();
  std::vector<int64_t> all(static_cast<size_t>(stream.size()));
  stream.read(0, stream.size(), all.data());
  ASSERT_EQ(all.size(), expected.size());
  EXPECT_TRUE(std::equal(all.begin(), all.end(), expected.begin()));
  EXPECT_GT(*std::max_element(all.begin(), all.end()), 65535);  // <|endoftext|> is 100257
}

TEST(Shards, EveryBrokenDatasetIsAnInputErrorNamingTheFile) {
  auto byte = loom::data::load_tokenizer("byte");
  const std::string dir = loom::testing::fresh_temp_dir("shards_errors");
  auto docs = varied_docs(30);
  const std::string good = prepare(dir + "/good", docs, *byte, 150);
  ASSERT_EQ(open_error(good, *byte, true), "<no error>");
  auto fresh = [&](const std::string& name) {
    const std::string copy = dir + "/" + name;
    fs::copy(good, copy, fs::copy_options::recursive);
    return copy;
  };
  const auto index = read_index(good);
  const std::string shard0 = index["shards"][0]["tokens_file"];
  const std::string offsets0 = index["shards"][0]["offsets_file"];

  // No index: not prepared, or an interrupted prepare.
  auto e = open_error(dir + "/nothing", *byte);
  EXPECT_TRUE(contains(e, "nothing/index.json' does not exist")) << e;
  auto missing_index = fresh("no_index");
  fs::remove(missing_index + "/index.json");
  EXPECT_FALSE(loom::data::is_prepared_dataset(missing_index));

  // A missing shard.
  auto missing = fresh("missing");
  fs::remove(missing + "/" + shard0);
  e = open_error(missing, *byte);
  EXPECT_TRUE(contains(e, "token shard '" + missing + "/" + shard0 + "' is missing")) << e;

  // A truncated shard (a crash mid-copy) and a truncated offsets file.
  auto truncated = fresh("truncated");
  fs::resize_file(truncated + "/" + shard0, fs::file_size(truncated + "/" + shard0) - 6);
  e = open_error(truncated, *byte);
  EXPECT_TRUE(contains(e, shard0) && contains(e, "(truncated)")) << e;
  auto short_offsets = fresh("short_offsets");
  fs::resize_file(short_offsets + "/" + offsets0, 8);
  e = open_error(short_offsets, *byte);
  EXPECT_TRUE(contains(e, offsets0) && contains(e, "uint64 offsets")) << e;

  // A corrupt shard (same size, one id flipped): caught by the checksum on first read.
  auto corrupt = fresh("corrupt");
  {
    std::fstream f(corrupt + "/" + shard0, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('\x7f');
  }
  e = open_error(corrupt, *byte, true);
  EXPECT_TRUE(contains(e, shard0) && contains(e, "checksum") && contains(e, "corrupt")) << e;
  loom::data::ShardedTokenStream lazy(corrupt, *byte);  // opening alone reads no token
  std::vector<int64_t> window(8);
  EXPECT_THROW(lazy.read(0, 8, window.data()), loom::InputError);

  // Wrong dtype in the index: every size disagrees with the files.
  auto dtype = fresh("dtype");
  auto changed = index;
  changed["dtype"] = "uint32";
  write_index(dtype, changed);
  e = open_error(dtype, *byte);
  EXPECT_TRUE(contains(e, shard0) && contains(e, "uint32") &&
              contains(e, "wrong dtype in the index"))
      << e;
  changed["dtype"] = "int8";
  write_index(dtype, changed);
  e = open_error(dtype, *byte);
  EXPECT_TRUE(contains(e, "dtype \"int8\"")) << e;
  changed = index;
  changed["vocab_size"] = 70000;  // cannot be uint16 ids
  write_index(dtype, changed);
  e = open_error(dtype, *byte);
  EXPECT_TRUE(contains(e, "vocab_size 70000 does not fit dtype uint16")) << e;

  // Malformed index: invalid JSON, a missing key, a wrong format name, totals that disagree.
  auto malformed = fresh("malformed");
  std::ofstream(malformed + "/index.json") << "{\"format\": ";
  e = open_error(malformed, *byte);
  EXPECT_TRUE(contains(e, "index.json: not valid JSON")) << e;
  changed = index;
  changed.erase("shards");
  write_index(malformed, changed);
  e = open_error(malformed, *byte);
  EXPECT_TRUE(contains(e, "index.json: key 'shards' is missing")) << e;
  changed = index;
  changed["format"] = "megatron";
  write_index(malformed, changed);
  EXPECT_TRUE(contains(open_error(malformed, *byte), "expected \"loom.token_shards\""));
  changed = index;
  changed["tokens"] = index["tokens"].get<int64_t>() + 1;
  write_index(malformed, changed);
  EXPECT_TRUE(contains(open_error(malformed, *byte), "the index totals say"));

  // Tokenizer mismatch: same vocabulary size is not enough, the content hash must match.
  auto bpe = loom::data::load_tokenizer("brown_bpe");
  e = open_error(good, *bpe);
  EXPECT_TRUE(contains(e, "prepared with tokenizer 'byte'") && contains(e, "'brown_bpe'")) << e;
  const std::string bpe_prepared = prepare(dir + "/bpe", docs, *bpe, 1000);
  e = open_error(bpe_prepared, *byte);  // 4096-token ids, 259-token model
  EXPECT_TRUE(contains(e, "larger than the model's 259")) << e;
  const std::string hf_copy = dir + "/my_tokenizer.json";
  fs::copy_file(loom::data::assets_dir() + "/tokenizer/brown_bpe_4k.json", hf_copy);
  EXPECT_EQ(open_error(bpe_prepared, *loom::data::load_tokenizer(hf_copy)), "<no error>")
      << "the same file at another path is the same tokenizer";

  // The same file under other encoding rules: shards of a tokenizer.json prepared before loom
  // matched added tokens in the text (no "encoding" key: version 1) may hold other ids.
  const auto bpe_good = read_index(bpe_prepared);
  EXPECT_EQ(bpe_good["tokenizer"]["encoding"], "hf/2");
  changed = bpe_good;
  changed["tokenizer"].erase("encoding");
  write_index(bpe_prepared, changed);
  e = open_error(bpe_prepared, *bpe);
  EXPECT_TRUE(contains(e, "encoded as 'hf/1'") && contains(e, "encodes it as 'hf/2'") &&
              contains(e, "index.json"))
      << e;
  changed["tokenizer"]["encoding"] = 2;
  write_index(bpe_prepared, changed);
  EXPECT_TRUE(contains(open_error(bpe_prepared, *bpe), "index.json")) << "a non-string encoding";
  // A byte tokenizer's rules never changed: its old indexes (no key) still open.
  changed = index;
  changed["tokenizer"].erase("encoding");
  write_index(malformed, changed);
  EXPECT_EQ(open_error(malformed, *byte), "<no error>");
}

std::unique_ptr<PackedLoader> text_loader(const std::vector<std::string>& docs,
                                          const loom::data::Tokenizer& tokenizer, uint64_t seed) {
  return std::make_unique<PackedLoader>(docs, tokenizer, PackedLoaderOptions{8, seed, true, 0, 1});
}

// A mixture of three small text datasets whose samples say where they come from: every
// document of dataset i starts with the letter 'A' + i, and documents are exactly one window.
std::unique_ptr<loom::data::MixtureSource> letter_mixture(const std::vector<double>& weights,
                                                          int64_t dp_rank, int64_t dp_world,
                                                          uint64_t seed = 5) {
  static loom::data::ByteTokenizer tokenizer;
  std::vector<loom::data::MixtureComponent> components;
  std::vector<std::unique_ptr<PackedLoader>> loaders;
  for (size_t i = 0; i < weights.size(); ++i) {
    std::vector<std::string> docs;
    for (int d = 0; d < 5 + static_cast<int>(i) * 7; ++d) {  // 5, 12, 19 windows
      docs.push_back(std::string(1, static_cast<char>('A' + i)) + std::to_string(d % 10) +
                     "xxxx");  // BOS + 6 bytes + EOS: 8 tokens
    }
    components.push_back({"set" + std::to_string(i), weights[i]});
    loaders.push_back(text_loader(docs, tokenizer, seed + i));
  }
  return std::make_unique<loom::data::MixtureSource>(
      components, std::move(loaders), PackedLoaderOptions{8, seed, true, dp_rank, dp_world});
}

TEST(Mixture, RealizedProportionsFollowTheWeights) {
  auto mixture = letter_mixture({0.6, 0.3, 0.1}, 0, 1);
  const int64_t samples = 20000;
  for (int i = 0; i < samples / 100; ++i) mixture->next(100, 8);
  const auto& drawn = mixture->drawn();
  EXPECT_EQ(drawn[0] + drawn[1] + drawn[2], samples);
  EXPECT_NEAR(static_cast<double>(drawn[0]) / samples, 0.6, 0.015);
  EXPECT_NEAR(static_cast<double>(drawn[1]) / samples, 0.3, 0.015);
  EXPECT_NEAR(static_cast<double>(drawn[2]) / samples, 0.1, 0.01);
  // Every sample really is from the component chosen for it.
  auto check = letter_mixture({0.6, 0.3, 0.1}, 0, 1);
  auto batch = check->next(64, 8);
  std::map<int64_t, int> letters;
  for (int64_t r = 0; r < 64; ++r) {
    const auto row = batch.inputs[r];
    // A window of 9 tokens spans parts of documents; its letters all belong to one dataset.
    for (int64_t t = 0; t < 8; ++t) {
      const int64_t id = row[t].item<int64_t>();
      if (id >= 'A' && id <= 'C') {
        EXPECT_EQ(static_cast<size_t>(id - 'A'), check->component_of(r)) << "row " << r;
      }
    }
  }
}

TEST(Mixture, DeterministicFromTheSeed) {
  auto a = letter_mixture({1, 2, 3}, 0, 1, 7);
  auto b = letter_mixture({1, 2, 3}, 0, 1, 7);
  auto c = letter_mixture({1, 2, 3}, 0, 1, 8);
  bool differs = false;
  for (int i = 0; i < 10; ++i) {
    auto x = rows(a->next(16, 8));
    EXPECT_EQ(x, rows(b->next(16, 8)));
    differs = differs || x != rows(c->next(16, 8));
  }
  EXPECT_TRUE(differs);
}

TEST(Mixture, DataParallelSlicesTogetherAreTheOneRankBatch) {
  auto single = letter_mixture({0.5, 0.25, 0.25}, 0, 1);
  auto rank0 = letter_mixture({0.5, 0.25, 0.25}, 0, 2);
  auto rank1 = letter_mixture({0.5, 0.25, 0.25}, 1, 2);
  for (int step = 0; step < 25; ++step) {  // every component cycles through epochs
    auto global = rows(single->next(8, 8));
    auto both = rows(rank0->next(4, 8));
    auto second = rows(rank1->next(4, 8));
    both.insert(both.end(), second.begin(), second.end());
    ASSERT_EQ(both, global) << "step " << step;
  }
  EXPECT_EQ(rank0->state(), single->state());
  EXPECT_EQ(rank1->state(), single->state());
}

TEST(Mixture, ResumesExactlyAndReshards) {
  auto straight = letter_mixture({0.5, 0.3, 0.2}, 0, 1);
  for (int i = 0; i < 7; ++i) straight->next(8, 8);
  const nlohmann::json saved = straight->state();
  EXPECT_EQ(saved["samples_consumed"], 56);
  std::vector<std::vector<std::vector<int64_t>>> expected;
  for (int i = 0; i < 5; ++i) expected.push_back(rows(straight->next(8, 8)));

  auto resumed = letter_mixture({0.5, 0.3, 0.2}, 0, 1);
  resumed->load_state(saved);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(rows(resumed->next(8, 8)), expected[i]) << i;

  // The one-rank state continues on two ranks (and through the prefetch thread).
  loom::data::PrefetchingSource r0(letter_mixture({0.5, 0.3, 0.2}, 0, 2), 4, 8, 2);
  auto r1 = letter_mixture({0.5, 0.3, 0.2}, 1, 2);
  r0.load_state(saved);
  r1->load_state(saved);
  for (int i = 0; i < 5; ++i) {
    auto both = rows(r0.next(4, 8));
    auto second = rows(r1->next(4, 8));
    both.insert(both.end(), second.begin(), second.end());
    EXPECT_EQ(both, expected[i]) << i;
  }

  // A state of another mixture, seed or a damaged one is refused.
  EXPECT_THROW(letter_mixture({0.5, 0.5, 0.2}, 0, 1)->load_state(saved), loom::InputError);
  EXPECT_THROW(letter_mixture({0.5, 0.3, 0.2}, 0, 1, 6)->load_state(saved), loom::InputError);
  EXPECT_THROW(letter_mixture({0.5, 0.3}, 0, 1)->load_state(saved), loom::InputError);
  auto damaged = saved;
  damaged["samples_consumed"] = 57;
  EXPECT_THROW(resumed->load_state(damaged), loom::InputError);
  EXPECT_THROW(resumed->load_state(nlohmann::json{{"kind", "mixture"}}), loom::InputError);
  EXPECT_THROW(
      resumed->load_state(
          PackedLoader(varied_docs(20), loom::data::ByteTokenizer(), {8, 5, true, 0, 1}).state()),
      loom::InputError);
}

TEST(Mixture, OpensTextAndPreparedSourcesByNameOrPath) {
  auto tokenizer = loom::data::load_tokenizer("byte");
  const std::string dir = loom::testing::fresh_temp_dir("mixture_open");
  const std::string jsonl = write_jsonl(dir + "/a.jsonl", varied_docs(50));
  const std::string prepared = prepare(dir + "/b", varied_docs(50, 3), *tokenizer, 500);
  auto mixture =
      loom::data::open_mixture({{jsonl, 2}, {prepared, 1}, {"brown_validation", 1}}, *tokenizer,
                               {32, 1, true, 0, 1}, "training.dataset_mixture");
  for (int i = 0; i < 10; ++i) mixture->next(16, 32);
  const auto& drawn = mixture->drawn();
  EXPECT_GT(drawn[0], drawn[1]);
  EXPECT_GT(drawn[1], 0);
  EXPECT_GT(drawn[2], 0);
  try {
    loom::data::open_mixture({{dir + "/nope.jsonl", 1}}, *tokenizer, {32, 1, true, 0, 1},
                             "training.dataset_mixture");
    ADD_FAILURE() << "a missing source must fail";
  } catch (const loom::InputError& error) {
    EXPECT_TRUE(contains(error.message(), "training.dataset_mixture: source '" + dir +
                                              "/nope.jsonl' is neither a built-in dataset"))
        << error.message();
  }
  EXPECT_THROW(loom::data::open_mixture({{jsonl, 0}}, *tokenizer, {32, 1, true, 0, 1}, "k"),
               loom::InputError);
}

TEST(Mixture, ConfigSyntaxErrorsNameTheKeyAndEntry) {
  using loom::config::parse_dataset_mixture;
  auto ok = parse_dataset_mixture({"brown:0.7", "/data/c:d/web:3", " x : 1e-3 "}, "k");
  ASSERT_EQ(ok.size(), 3u);
  EXPECT_EQ(ok[1].source, "/data/c:d/web");  // split at the last colon
  EXPECT_EQ(ok[1].weight, 3);
  EXPECT_EQ(ok[2].source, "x");
  auto error = [](const std::vector<std::string>& entries) {
    try {
      parse_dataset_mixture(entries, "training.dataset_mixture");
    } catch (const loom::InputError& e) {
      return e.message();
    }
    return std::string("<no error>");
  };
  EXPECT_EQ(error({"brown"}),
            "training.dataset_mixture: entry \"brown\" must be SOURCE:WEIGHT (for example "
            "\"brown:0.7\")");
  EXPECT_TRUE(contains(error({":1"}), "has no source"));
  EXPECT_TRUE(contains(error({"brown:heavy"}), "weight \"heavy\" is not a number"));
  EXPECT_TRUE(contains(error({"brown:0"}), "weight must be a positive number, got 0"));
  EXPECT_TRUE(contains(error({"brown:-2"}), "weight must be a positive number, got -2"));
  EXPECT_TRUE(contains(error({"brown:inf"}), "weight must be a positive number"));
  EXPECT_TRUE(contains(error({"brown:1", "brown:2"}), "\"brown\" appears twice"));
  EXPECT_TRUE(contains(error({"synthetic:1"}), "synthetic stream cannot be mixed"));
}

}  // namespace test_data_shards
}  // namespace
