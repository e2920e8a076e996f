#include "loom/data/tokenizer.h"

#include "loom/core/check.h"

namespace loom::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char byte : text) ids.push_back(byte);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    LOOM_CHECK_AS(InputError, id >= 0 && id < vocab_size(), "byte tokenizer: id ", id,
                  " is outside the vocabulary [0, ", vocab_size(), ")");
    if (id < 256) text.push_back(static_cast<char>(id));  // special tokens decode to nothing
  }
  return text;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (path.empty() || path == "byte") {
    return std::make_unique<ByteTokenizer>();
  }
  LOOM_THROW(InputError, "model.tokenizer_path = '", path,
             "': this build has only the byte-level tokenizer ('byte'); tiktoken and Hugging Face "
             "BPE tokenizers arrive with the data pipeline");
}

}  // namespace loom::data
