// The token stream a packed loader cuts into windows: every document as BOS tokens EOS, one
// after the other. It lives in memory (tokenized at start) or in memory-mapped prepared shards
// (shards.h); the loader reads windows from either through this interface, so packing,
// shuffling, data-parallel slicing and resume are the same code for both.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/data/tokenizer.h"

namespace loom::data {

class TokenStream {
 public:
  virtual ~TokenStream() = default;
  virtual int64_t size() const = 0;
  // Copies tokens [start, start + count) into `out`. Called from the prefetch thread.
  virtual void read(int64_t start, int64_t count, int64_t* out) const = 0;
};

class InMemoryTokenStream : public TokenStream {
 public:
  explicit InMemoryTokenStream(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  void read(int64_t start, int64_t count, int64_t* out) const override;

 private:
  std::vector<int32_t> tokens_;
};

// Appends one document to `stream` the way every loom dataset stores it: BOS, its ids, EOS.
void append_document(const Tokenizer& tokenizer, std::string_view text,
                     std::vector<int32_t>& stream);

}  // namespace loom::data
