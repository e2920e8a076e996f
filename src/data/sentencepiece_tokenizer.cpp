#include "loom/data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <cctype>

#include "loom/core/check.h"
#include "loom/core/terminal_text.h"
#include "loom/core/files.h"

namespace loom::data {

namespace {

// tiktoken's format: lines of "<base64 token> <rank>", text only.
bool looks_like_tiktoken(const std::string& head) {
  const size_t end = head.find('\n');
  const std::string line = head.substr(0, end);
  const size_t space = line.find(' ');
  if (space == std::string::npos || space == 0 || space + 1 == line.size()) return false;
  for (size_t i = 0; i < space; ++i) {
    const auto c = static_cast<unsigned char>(line[i]);
    if (!std::isalnum(c) && c != '+' && c != '/' && c != '=') return false;
  }
  for (size_t i = space + 1; i < line.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(line[i])) && line[i] != '\r') return false;
  }
  return true;
}

}  // namespace

bool is_sentencepiece_model(const std::string& path) {
  const std::string content = files::read_file(path, "tokenizer file", uint64_t{1} << 30);
  return !looks_like_tiktoken(content.substr(0, 4096));
}

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& path)
    : path_(path), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const std::string content = files::read_file(path, "tokenizer file", uint64_t{1} << 30);
  const auto status = processor_->LoadFromSerializedProto(content);
  LOOM_CHECK_AS(InputError, status.ok(), "tokenizer file '", path,
                "' is neither tiktoken text (base64 token and rank per line) nor a SentencePiece "
                "model: ",
                terminal::escaped(status.ToString(), 300));
  vocab_size_ = processor_->GetPieceSize();
  LOOM_CHECK_AS(InputError, vocab_size_ > 0, "SentencePiece model '", path, "' has no pieces");
  bos_id_ = processor_->bos_id();
  eos_id_ = processor_->eos_id();
  // Models trained without BOS or EOS (bos_id = -1) cannot mark documents: loom packs them.
  LOOM_CHECK_AS(InputError, bos_id_ >= 0 && eos_id_ >= 0, "SentencePiece model '", path,
                "' has no BOS or EOS piece (bos_id ", bos_id_, ", eos_id ", eos_id_,
                "); loom marks documents with them");
  pad_id_ = processor_->pad_id() >= 0 ? processor_->pad_id() : eos_id_;
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  LOOM_CHECK_AS(InputError, status.ok(), path_, ": cannot encode a text of ", text.size(),
                " bytes: ", terminal::escaped(status.ToString(), 300));
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  for (int32_t id : ids) {
    LOOM_CHECK_AS(InputError, id >= 0 && id < vocab_size_, path_, ": id ", id,
                  " is outside the vocabulary [0, ", vocab_size_, ")");
  }
  std::string text;
  const auto status = processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  LOOM_CHECK_AS(InputError, status.ok(), path_,
                ": cannot decode: ", terminal::escaped(status.ToString(), 300));
  return text;
}

}  // namespace loom::data
