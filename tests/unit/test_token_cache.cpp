// The token cache (data/token_cache.h): a text dataset opened a second time reads the ids the
// first opening stored, equal to tokenizing again; a changed file, another tokenizer or a
// damaged entry is a miss; LOOM_CACHE_DIR=off turns it off; a run that skipped bad records stores
// nothing (the next run must log them again).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "loom/data/packed_loader.h"
#include "loom/data/token_cache.h"
#include "loom/data/tokenizer.h"
#include "support/process.h"

namespace {

namespace fs = std::filesystem;
using loom::data::ByteTokenizer;
using loom::data::PackedLoaderOptions;

// Sets LOOM_CACHE_DIR for one test, restoring the suite's value after.
class CacheDir {
 public:
  explicit CacheDir(const std::string& value) {
    if (const char* old = std::getenv("LOOM_CACHE_DIR")) old_ = old;
    ::setenv("LOOM_CACHE_DIR", value.c_str(), 1);
  }
  ~CacheDir() {
    if (old_.empty()) {
      ::unsetenv("LOOM_CACHE_DIR");
    } else {
      ::setenv("LOOM_CACHE_DIR", old_.c_str(), 1);
    }
  }

 private:
  std::string old_;
};

std::vector<fs::path> entries(const std::string& cache) {
  std::vector<fs::path> found;
  if (!fs::exists(cache + "/tokens")) return found;
  for (const auto& entry : fs::directory_iterator(cache + "/tokens")) found.push_back(entry.path());
  return found;
}

// Every token of the loader's stream, read in order (no shuffle, one window per token + 1).
std::vector<int64_t> all_samples(const std::string& dataset, const loom::data::Tokenizer& tok,
                                 bool skip_bad = false) {
  PackedLoaderOptions options;
  options.seq_len = 3;
  options.shuffle = false;
  options.skip_bad_records = skip_bad;
  auto loader = loom::data::open_dataset("mine", dataset, tok, options, "training.dataset");
  std::vector<int64_t> out;
  std::vector<int64_t> sample(4);
  for (int64_t i = 0; i < *loader->samples_per_epoch(); ++i) {
    loader->read_sample(i, sample.data());
    out.insert(out.end(), sample.begin(), sample.end());
  }
  return out;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(TokenCache, SecondOpeningReadsTheStoredIdsAndAChangedFileMisses) {
  const std::string dir = loom::testing::fresh_temp_dir("token_cache_hits");
  const std::string cache = dir + "/cache";
  const CacheDir guard(cache);
  const std::string data = dir + "/data.jsonl";
  write(data, "{\"text\": \"the first document\"}\n{\"text\": \"and a second one\"}\n");
  const ByteTokenizer tok;

  const auto tokenized = all_samples(data, tok);
  auto stored = entries(cache);
  ASSERT_EQ(stored.size(), 1u) << "the first opening stores the ids";
  const auto first_write = fs::last_write_time(stored[0]);
  EXPECT_EQ(all_samples(data, tok), tokenized);
  EXPECT_EQ(fs::last_write_time(stored[0]), first_write) << "a hit rewrites nothing";

  // The entry is what the second opening read: ids altered inside it (checksum included, so
  // that only a reader of the entry can see them) come back altered.
  auto entry = loom::data::TokenCache::for_dataset({data}, "text", int64_t{256} << 20, tok);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->path(), stored[0].string());
  auto held = entry->read();
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->documents, 2);
  held->tokens[1] = 'X';
  entry->write(*held);
  const auto altered = all_samples(data, tok);
  ASSERT_EQ(altered.size(), tokenized.size());
  EXPECT_EQ(altered[1], 'X');
  EXPECT_NE(tokenized[1], 'X');

  // One byte changed in the file: another entry, tokenized afresh.
  write(data, "{\"text\": \"the first document\"}\n{\"text\": \"and a second One\"}\n");
  const auto changed = all_samples(data, tok);
  EXPECT_EQ(entries(cache).size(), 2u);
  EXPECT_NE(changed, tokenized);
  EXPECT_EQ(changed.size(), tokenized.size());
}

TEST(TokenCache, ADamagedEntryIsTokenizedAgainAndReplaced) {
  const std::string dir = loom::testing::fresh_temp_dir("token_cache_damage");
  const std::string cache = dir + "/cache";
  const CacheDir guard(cache);
  const std::string data = dir + "/data.txt";
  write(data, "plain text, one document per file");
  const ByteTokenizer tok;
  const auto tokenized = all_samples(data, tok);
  const auto stored = entries(cache);
  ASSERT_EQ(stored.size(), 1u);
  {
    std::fstream file(stored[0], std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(40);  // inside the ids: the checksum no longer matches
    file.put('\x7f');
  }
  EXPECT_EQ(all_samples(data, tok), tokenized);
  auto entry = loom::data::TokenCache::for_dataset({data}, "text", int64_t{256} << 20, tok);
  ASSERT_TRUE(entry->read().has_value()) << "the damaged entry is replaced";
  fs::resize_file(stored[0], 20);  // truncated: a miss, never a crash
  EXPECT_FALSE(entry->read().has_value());
  EXPECT_EQ(all_samples(data, tok), tokenized);
}

TEST(TokenCache, OffSkippedRecordsAndAnotherTextFieldStoreOrFindNothing) {
  const std::string dir = loom::testing::fresh_temp_dir("token_cache_off");
  const std::string cache = dir + "/cache";
  const std::string data = dir + "/data.jsonl";
  write(data, "{\"text\": \"good\"}\nnot json\n{\"text\": \"also good\"}\n");
  const ByteTokenizer tok;
  {
    const CacheDir guard("off");
    EXPECT_FALSE(loom::data::cache_folder().has_value());
    EXPECT_FALSE(loom::data::TokenCache::for_dataset({data}, "text", 1 << 20, tok).has_value());
  }
  const CacheDir guard(cache);
  all_samples(data, tok, /*skip_bad=*/true);
  EXPECT_TRUE(entries(cache).empty()) << "a run that skipped a record stores nothing";
  const auto a = loom::data::TokenCache::for_dataset({data}, "text", 1 << 20, tok);
  const auto b = loom::data::TokenCache::for_dataset({data}, "body", 1 << 20, tok);
  const auto c = loom::data::TokenCache::for_dataset({data}, "text", 1 << 10, tok);
  ASSERT_TRUE(a && b && c);
  EXPECT_NE(a->path(), b->path());
  EXPECT_NE(a->path(), c->path());
}

}  // namespace
