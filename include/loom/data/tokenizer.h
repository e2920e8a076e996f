// Tokenizers behind one interface: byte-level (the zero-asset fallback), tiktoken-format BPE
// (bpe_tokenizer.h), Hugging Face tokenizer.json byte-level BPE (hf_tokenizer.h) and
// SentencePiece models (sentencepiece_tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

// Which tokenizer made a set of token ids: the path it was loaded from (or a built-in name) and
// a hash of its file content. Prepared token shards record it so that training with another
// tokenizer is refused instead of silently training on wrong ids.
struct TokenizerIdentity {
  std::string path;
  std::string hash;  // "crc32:<8 hex>:<bytes>" of the file, or "builtin:<name>"
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;
  virtual std::string name() const = 0;
  // The implementation's encoding rules and their version ("hf/2"): bumped whenever encode()
  // could give other ids for the same file and text, so that ids made before (prepared shards,
  // a streamed dataset's position) are not read as this encoding's.
  virtual std::string encoding() const = 0;

  // Set by load_tokenizer; a tokenizer built directly is identified by its name and vocabulary.
  TokenizerIdentity identity() const;
  void set_identity(TokenizerIdentity identity) { identity_ = std::move(identity); }

 private:
  TokenizerIdentity identity_;
};

// Bytes 0-255 are ids 0-255; then <|begin_of_text|> 256, <|end_of_text|> 257, <|pad|> 258.
class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 259; }
  int32_t bos_id() const override { return 256; }
  int32_t eos_id() const override { return 257; }
  int32_t pad_id() const override { return 258; }
  std::string name() const override { return "byte"; }
  std::string encoding() const override { return "byte/1"; }
};

// The encoding that ids made before loom recorded encodings were made with: version 1 of this
// tokenizer's kind ("hf/2" -> "hf/1").
std::string unrecorded_encoding(const Tokenizer& tokenizer);

// model.tokenizer_path: "byte" (or unset): byte-level; "brown_bpe": the BPE trained on the
// embedded corpus; a path: tokenizer.json (Hugging Face), .tiktoken, or tokenizer.model (tiktoken
// text like Llama 3's, or a SentencePiece model like Llama 2's: told apart by content).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// The file a model.tokenizer_path names ("brown_bpe": the embedded one; "byte": none, empty).
std::string tokenizer_file(const std::string& path);

// Which tokenizer a job uses (torchtitan's rule): model.tokenizer_path when set; else the
// tokenizer.json in model.hf_assets_path; else, when hf_assets_path is still its default and
// that folder does not exist, "byte". An hf_assets_path that was set but holds no
// tokenizer.json is an error (never a silent fall back to the byte tokenizer).
std::string tokenizer_location(const std::optional<std::string>& tokenizer_path,
                               const std::string& hf_assets_path);

// "crc32:<8 hex digits>:<size>" of a file's bytes; throws loom::InputError when unreadable.
std::string file_content_hash(const std::string& path);

}  // namespace loom::data
