// The token cache: a text dataset (JSONL, text, Parquet, Arrow files) tokenized once is kept as a
// file of token ids, so that a restarted job, the other ranks of a node and the next run on the
// same files skip reading and tokenizing them (the Brown corpus: 0.4 s of CPU per process; a
// 10 GB JSONL: minutes). Hugging Face datasets caches its map() results the same way.
//
// An entry is named by the SHA-256 of everything the ids depend on: each file's bytes, the text
// field, the longest document read, the tokenizer's identity (its file's hash), name, vocabulary
// and BOS/EOS ids. A changed file or tokenizer is a miss, never a stale hit. Entries carry a
// CRC-32 of their ids: a damaged one is a miss (and rewritten). Writing is atomic (a temporary
// file renamed) and best effort: a cache that cannot be written is a warning, never an error.
//
// Folder: LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, else ~/.cache/loom; entries in tokens/.
// LOOM_CACHE_DIR=off turns the cache off. Any entry or the whole folder may be deleted at any
// time. loom prepare-data (shards.h) remains the way to pre-tokenize a corpus for many jobs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/data/tokenizer.h"

namespace loom::data {

struct TokenizedDataset {
  std::vector<int32_t> tokens;  // every document as BOS ids EOS (append_document)
  int64_t documents = 0;
};

class TokenCache {
 public:
  // The cache entry of `files` read with these options and `tokenizer`; nullopt when the cache
  // is off (LOOM_CACHE_DIR=off) or no folder is known (no HOME). Reads every file once to hash it.
  static std::optional<TokenCache> for_dataset(const std::vector<std::string>& files,
                                               const std::string& text_field,
                                               int64_t max_document_bytes,
                                               const Tokenizer& tokenizer);

  // The entry's tokens, or nullopt on a miss (absent, or damaged: then logged and removed).
  std::optional<TokenizedDataset> read() const;
  // Stores `dataset`; a failure is logged as a warning.
  void write(const TokenizedDataset& dataset) const;

  const std::string& path() const { return path_; }

 private:
  explicit TokenCache(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// The cache folder (LOOM_CACHE_DIR, $XDG_CACHE_HOME/loom, ~/.cache/loom); nullopt when off.
std::optional<std::string> cache_folder();

}  // namespace loom::data
