// Pre-tokenization: cut text into pieces with a split regex (PCRE2 with Unicode properties and
// JIT), as tiktoken and Hugging Face tokenizers do before byte-pair merging.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace loom::data {

// GPT-2's pre-tokenizer split: tiktoken's gpt2 encoding and tokenizer.json's ByteLevel regex.
inline constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class RegexSplitter {
 public:
  // Throws loom::InputError naming `source` when the pattern does not compile.
  RegexSplitter(const std::string& pattern, const std::string& source);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Calls `piece` for each match in order; text between matches (which the tokenizer patterns
  // never leave) is passed as a piece too, so no byte is dropped. `text` must be valid UTF-8.
  void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace loom::data
