// Byte-level BPE in tiktoken's format: the format of Llama 3's tokenizer.model and of OpenAI's
// cl100k_base / gpt2 / o200k_base. A file of "base64(token bytes) rank" lines, a split regex
// (Unicode classes and lookahead, run by PCRE2 with JIT) and special tokens. Encoding gives
// exactly the ids of the tiktoken package's encode_ordinary.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "loom/data/regex_split.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

struct BpeSpec {
  std::string name;
  std::string pattern;                      // the pre-tokenizer split regex
  std::map<std::string, int32_t> specials;  // special token text -> id
  std::string bos;                          // which special token marks a document's start/end
  std::string eos;
};

class BpeTokenizer : public Tokenizer {
 public:
  // `ranks_path`: a .tiktoken file. Throws loom::InputError naming the file and line.
  BpeTokenizer(const std::string& ranks_path, BpeSpec spec);
  ~BpeTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return eos_id_; }
  std::string name() const override { return spec_.name; }
  std::string encoding() const override { return "tiktoken/1"; }

  // The ids of one regex piece after byte-pair merging (exposed for tests).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  BpeSpec spec_;
  std::string arena_;  // all token bytes, back to back; ranks_ keys point into it
  std::unordered_map<std::string_view, int32_t> ranks_;
  std::vector<std::string_view> id_to_bytes_;
  std::unique_ptr<RegexSplitter> splitter_;
  int64_t vocab_size_ = 0;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
};

// The spec of a known encoding by name (cl100k_base, gpt2, o200k_base, o200k_harmony: gpt-oss's,
// o200k_base's ranks with the harmony special tokens; llama3), or nullopt.
std::optional<BpeSpec> builtin_bpe_spec(const std::string& name);

// Pattern and special tokens for X.tiktoken: the sibling X.json ({"pat_str", "special_tokens"}),
// else a built-in spec for a known file name; throws loom::InputError otherwise.
BpeSpec bpe_spec_for(const std::string& ranks_path);

}  // namespace loom::data
