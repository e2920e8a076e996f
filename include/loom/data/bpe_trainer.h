// Learning a byte-level BPE from a corpus: split the text with a regex (Llama 3's by default),
// start from the 256 bytes, and repeatedly merge the most frequent adjacent pair (ties broken by
// the smaller pair of token ids, so training is deterministic). Writes a Hugging Face
// tokenizer.json (Split + ByteLevel pre-tokenizer, BPE model, <|begin_of_text|>,
// <|end_of_text|>, <|pad|> added tokens) that HfBpeTokenizer and the tokenizers package load.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::data {

struct BpeTrainingOptions {
  int64_t vocab_size = 4096;  // bytes + merges + 3 special tokens
  std::string pattern;        // empty: Llama 3's split regex
  int64_t min_frequency = 2;  // a pair seen fewer times is never merged
};

struct BpeTrainingResult {
  std::string tokenizer_json;
  int64_t merges = 0;
  int64_t words = 0;  // distinct pre-tokenized pieces
};

// `progress(done, total)` is called every few hundred merges (may be empty).
BpeTrainingResult train_bpe(const std::vector<std::string>& documents,
                            const BpeTrainingOptions& options,
                            const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace loom::data
