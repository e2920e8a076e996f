#include "loom/data/tokenizer.h"

#include <fmt/format.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "loom/config/job_config.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/strings.h"
#include "loom/data/assets.h"
#include "loom/data/bpe_tokenizer.h"
#include "loom/data/hf_tokenizer.h"
#include "loom/data/sentencepiece_tokenizer.h"

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

TokenizerIdentity Tokenizer::identity() const {
  if (!identity_.path.empty()) return identity_;
  return {name(), "builtin:" + name() + ":" + std::to_string(vocab_size())};
}

std::string unrecorded_encoding(const Tokenizer& tokenizer) {
  const std::string current = tokenizer.encoding();
  return current.substr(0, current.rfind('/')) + "/1";
}

std::string file_content_hash(const std::string& path) {
  files::require_regular_file(path, "tokenizer file");
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK_AS(InputError, in.good(), "cannot read '", path, "': ", std::strerror(errno));
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t size = 0;
  char buffer[1 << 16];
  while (in) {
    in.read(buffer, sizeof(buffer));
    const auto n = static_cast<uInt>(in.gcount());
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buffer), n);
    size += n;
  }
  return fmt::format("crc32:{:08x}:{}", static_cast<uint32_t>(crc), size);
}

namespace {

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& path, std::string* file) {
  if (path.empty() || path == "byte") {
    return std::make_unique<ByteTokenizer>();
  }
  *file = tokenizer_file(path);
  if (path == "brown_bpe") return std::make_unique<HfBpeTokenizer>(*file);
  if (strings::ends_with(path, ".json")) {
    return std::make_unique<HfBpeTokenizer>(path);
  }
  const bool model = strings::ends_with(path, ".model");
  LOOM_CHECK_AS(InputError, model || strings::ends_with(path, ".tiktoken"),
                "model.tokenizer_path = '", path,
                "': expected 'byte', a Hugging Face tokenizer.json, a tiktoken-format BPE file "
                "(.tiktoken, or Llama 3's tokenizer.model) or a SentencePiece tokenizer.model "
                "(Llama 2, Mistral, Gemma)");
  // Both are published as tokenizer.model: told apart by content.
  if (model && is_sentencepiece_model(path)) {
    return std::make_unique<SentencePieceTokenizer>(path);
  }
  return std::make_unique<BpeTokenizer>(path, bpe_spec_for(path));
}

}  // namespace

std::string tokenizer_file(const std::string& path) {
  if (path.empty() || path == "byte") return "";
  // The embedded corpus' BPE (tools/: loom prepare-data).
  if (path == "brown_bpe") return assets_dir() + "/tokenizer/brown_bpe_4k.json";
  return path;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::string file;
  auto tokenizer = make_tokenizer(path, &file);
  if (!file.empty()) tokenizer->set_identity({path, file_content_hash(file)});
  return tokenizer;
}

std::string tokenizer_location(const std::optional<std::string>& tokenizer_path,
                               const std::string& hf_assets_path) {
  namespace fs = std::filesystem;
  if (tokenizer_path) return *tokenizer_path;
  const std::string candidate = (fs::path(hf_assets_path) / "tokenizer.json").string();
  std::error_code error;
  if (fs::exists(candidate, error)) return candidate;
  const bool is_default = hf_assets_path == config::ModelSection{}.hf_assets_path;
  LOOM_CHECK_AS(InputError,
                hf_assets_path.empty() || (is_default && !fs::exists(hf_assets_path, error)),
                "model.hf_assets_path = '", hf_assets_path,
                "' holds no tokenizer.json; set model.tokenizer_path to the tokenizer to use "
                "('byte' for the byte-level one)");
  return "byte";
}

}  // namespace loom::data
