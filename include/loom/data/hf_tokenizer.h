// Hugging Face tokenizer.json, byte-level BPE (GPT-2 and Llama 3 style): what torchtitan loads
// from model.hf_assets_path. Supported: model BPE (vocab, merges as "a b" or ["a", "b"],
// ignore_merges); normalizer NFC / NFKC / NFD / NFKD or a Sequence of them (through ICU:
// normalizer.h); pre-tokenizer ByteLevel (with or without its regex) or a Sequence of Split
// (regex, Isolated) and ByteLevel, which with NFC is the Qwen2 / Qwen3 pipeline; added tokens,
// matched in the text as `tokenizers` matches them (leftmost-longest; those with normalized
// false in the raw text first, the others in the normalized text; lstrip / rstrip take the
// whitespace beside them). Anything else is refused by name, never silently approximated. Ids
// equal `tokenizers`' encode(text, add_special_tokens=False).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/data/regex_split.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

class UnicodeNormalizer;

// A tokenizer.json's added tokens, found in text the way `tokenizers`' AddedVocabulary finds
// them: at the leftmost position where any matches, the longest one there.
class AddedTokenMatcher {
 public:
  struct Token {
    std::string content;
    int32_t id = 0;
    bool lstrip = false;  // the whitespace before it belongs to the match
    bool rstrip = false;  // and the whitespace after it
  };
  void add(Token token);
  bool empty() const { return count_ == 0; }
  // Cuts `text` into the pieces between matches (on_text, never empty) and the matches'
  // ids (on_token), in order.
  void split(std::string_view text, const std::function<void(std::string_view)>& on_text,
             const std::function<void(int32_t)>& on_token) const;

 private:
  // Per first byte, the tokens starting with it, longest first.
  std::array<std::vector<Token>, 256> by_first_byte_;
  size_t count_ = 0;
};

// Bytes written in GPT-2's byte-level alphabet (each byte one printable character).
std::string byte_level_text(std::string_view bytes);

class HfBpeTokenizer : public Tokenizer {
 public:
  // Throws loom::InputError naming the file and the unsupported or malformed part.
  explicit HfBpeTokenizer(const std::string& path);
  ~HfBpeTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return eos_id_; }
  std::string name() const override { return "hf:" + path_; }
  // 2: added tokens in the text are matched as `tokenizers` matches them (1 ignored them).
  std::string encoding() const override { return "hf/2"; }

 private:
  void encode_word(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_word(std::string_view piece, std::vector<int32_t>& out) const;

  std::string path_;
  std::unordered_map<std::string, int32_t> vocab_;  // byte-level-mapped token -> id
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank and result
  std::array<int32_t, 256> byte_ids_{};         // id of each single-byte token
  std::vector<std::string> id_to_token_;
  std::vector<bool> is_added_;                     // added tokens decode to their text
  std::unique_ptr<UnicodeNormalizer> normalizer_;  // null: none
  std::unique_ptr<RegexSplitter> splitter_;        // null: the whole text is one piece
  AddedTokenMatcher raw_added_;         // added tokens with normalized false: in the raw text
  AddedTokenMatcher normalized_added_;  // the others, normalized, in the normalized text
  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const;
  bool ignore_merges_ = false;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  // Text is mostly the same few thousand words: their merged ids are kept (as tiktoken and
  // `tokenizers` do), shared by the threads that encode with this tokenizer.
  mutable std::mutex word_cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> word_cache_;
};

}  // namespace loom::data
