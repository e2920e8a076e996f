// SentencePiece models (the tokenizer.model of Llama 2, Mistral, Gemma; BPE and Unigram) through
// the sentencepiece library. Ids equal the sentencepiece Python package's encode(text) (no BOS or
// EOS added: loom adds the model's own around each document).
#pragma once

#include <memory>
#include <string>

#include "loom/data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace loom::data {

// Whether `path` holds a SentencePiece model rather than tiktoken text (both are published as
// tokenizer.model: Llama 3's is base64 "token rank" lines, Llama 2's a protobuf). Decided by
// content. Throws loom::InputError when unreadable.
bool is_sentencepiece_model(const std::string& path);

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Throws loom::InputError naming the file when it is not a SentencePiece model.
  explicit SentencePieceTokenizer(const std::string& path);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  std::string name() const override { return "sentencepiece:" + path_; }
  std::string encoding() const override { return "sentencepiece/1"; }

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  int64_t vocab_size_ = 0;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t pad_id_ = -1;
};

}  // namespace loom::data
