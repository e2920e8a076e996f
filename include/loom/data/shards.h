// Prepared datasets: token ids written once by `loom prepare-data` and memory-mapped by the
// loader, so training never re-tokenizes and never reads a dataset whole into memory.
//
// A prepared dataset is a folder: index.json, and per shard a token file (little-endian uint16
// or uint32 ids, each document stored as BOS ids EOS, documents back to back) and an offsets
// file (little-endian uint64 document starts, documents + 1 values, the last = the token count).
// The byte layout and every index key are in docs/data.md. Shards hold whole documents; the
// loader reads them as one stream, exactly the stream the text path builds, so both give the
// same batches.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/data/token_stream.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

inline constexpr const char* kShardFormat = "loom.token_shards";
inline constexpr int kShardFormatVersion = 1;

// Whether `path` is a prepared dataset (a folder holding index.json, or that index.json).
bool is_prepared_dataset(const std::string& path);

// Writes a prepared dataset into a temporary folder beside `output` (output.tmp-<pid>-XXXXXX) and
// renames it into place in finish(), so an interrupted run never leaves a folder that looks
// complete. The destructor removes the temporary folder when finish() was not reached.
class ShardWriter {
 public:
  // Throws loom::InputError when `output` exists (unless overwrite) or shard_tokens < 1.
  ShardWriter(std::string output, const Tokenizer& tokenizer, int64_t shard_tokens,
              bool overwrite = false);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Tokenizes one document and appends BOS ids EOS; a shard closes once it holds shard_tokens.
  void add_document(const std::string& text);
  // Extra index.json keys describing where the data came from (sources, text_field, ...).
  void set_provenance(nlohmann::json provenance) { provenance_ = std::move(provenance); }
  // Closes the last shard, writes index.json, syncs and renames the folder into place.
  void finish();

  int64_t documents() const { return documents_; }
  int64_t tokens() const { return tokens_; }
  const std::string& dtype() const { return dtype_; }

 private:
  class File;
  void open_shard();
  void close_shard();

  std::string output_;
  std::string temp_;
  const Tokenizer& tokenizer_;
  int64_t shard_tokens_;
  bool overwrite_;
  std::string dtype_;
  int64_t documents_ = 0;
  int64_t tokens_ = 0;
  bool finished_ = false;
  nlohmann::json provenance_ = nlohmann::json::object();
  nlohmann::json shards_ = nlohmann::json::array();
  std::unique_ptr<File> token_file_;
  std::unique_ptr<File> offset_file_;
  int64_t shard_documents_ = 0;
  int64_t shard_tokens_written_ = 0;
  std::vector<int32_t> scratch_;
};

// A prepared dataset opened for reading: the index is validated at open (files present, sizes,
// document offsets, dtype, vocabulary and tokenizer); each shard's checksum and id range are
// checked the first time the loader reads from it (or all at once by verify_all()).
class ShardedTokenStream : public TokenStream {
 public:
  // Throws loom::InputError naming the file and what is wrong. `tokenizer` is the training
  // tokenizer: its identity must match the one the shards were prepared with.
  ShardedTokenStream(const std::string& path, const Tokenizer& tokenizer);
  ~ShardedTokenStream() override;

  int64_t size() const override { return total_tokens_; }
  void read(int64_t start, int64_t count, int64_t* out) const override;

  int64_t documents() const { return documents_; }
  size_t shard_count() const { return shards_.size(); }
  const std::string& folder() const { return folder_; }
  const std::string& dtype() const { return dtype_; }
  void verify_all() const;

 private:
  struct Shard {
    std::string tokens_path;
    int64_t tokens = 0;
    int64_t documents = 0;
    int64_t first = 0;  // position of its first token in the stream
    uint32_t crc32 = 0;
    const unsigned char* data = nullptr;
    size_t bytes = 0;
  };
  void open_shard(const nlohmann::json& entry, int64_t first, const std::string& where,
                  std::set<std::string>& names);
  void verify(size_t shard) const;

  std::string folder_;
  std::string dtype_;
  size_t width_ = 2;
  int64_t vocab_size_ = 0;
  int64_t total_tokens_ = 0;
  int64_t documents_ = 0;
  std::vector<Shard> shards_;
  mutable std::mutex verify_mutex_;
  std::unique_ptr<std::atomic<bool>[]> verified_;
};

}  // namespace loom::data
