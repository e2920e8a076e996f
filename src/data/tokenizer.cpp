#include "loom/data/tokenizer.h"

#include "loom/core/check.h"
#include "loom/core/strings.h"
#include "loom/data/assets.h"
#include "loom/data/bpe_tokenizer.h"
#include "loom/data/hf_tokenizer.h"

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
  if (path == "brown_bpe") {  // the embedded corpus' BPE (tools/: loom prepare-data)
    return std::make_unique<HfBpeTokenizer>(assets_dir() + "/tokenizer/brown_bpe_4k.json");
  }
  if (strings::ends_with(path, ".json")) {
    return std::make_unique<HfBpeTokenizer>(path);
  }
  const bool tiktoken = strings::ends_with(path, ".tiktoken") || strings::ends_with(path, ".model");
  LOOM_CHECK_AS(InputError, tiktoken, "model.tokenizer_path = '", path,
                "': expected 'byte', a Hugging Face tokenizer.json, or a tiktoken-format BPE file "
                "(.tiktoken, or Llama 3's tokenizer.model)");
  return std::make_unique<BpeTokenizer>(path, bpe_spec_for(path));
}

}  // namespace loom::data
