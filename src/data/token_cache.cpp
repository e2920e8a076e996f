#include "loom/data/token_cache.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "crc32.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"

namespace loom::data {
namespace {

// Bumped whenever the ids a dataset tokenizes to could change for the same files and tokenizer
// (append_document's layout, the readers' rules; the tokenizers' own rules are in the key as
// Tokenizer::encoding): old entries then simply miss.
constexpr const char* kKeyVersion = "loom-token-cache-3";
constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'T', 'O', 'K', '1'};

struct Header {
  char magic[8];
  uint64_t documents;
  uint64_t tokens;
  uint32_t crc32;  // of the ids' bytes
  uint32_t reserved;
};

class Sha256 {
 public:
  Sha256() : context_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    LOOM_CHECK(context_ && EVP_DigestInit_ex(context_.get(), EVP_sha256(), nullptr) == 1,
               "SHA-256 is not available from OpenSSL");
  }
  void add(const void* data, size_t size) {
    LOOM_CHECK(EVP_DigestUpdate(context_.get(), data, size) == 1, "SHA-256 update failed");
  }
  void add(const std::string& text) {
    const uint64_t size = text.size();  // length-prefixed: ("ab","c") differs from ("a","bc")
    add(&size, sizeof size);
    add(text.data(), text.size());
  }
  std::string hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    LOOM_CHECK(EVP_DigestFinal_ex(context_.get(), digest, &size) == 1, "SHA-256 final failed");
    std::string out;
    for (unsigned int i = 0; i < size; ++i) out += fmt::format("{:02x}", digest[i]);
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context_;
};

void add_file(Sha256& hash, const std::string& path) {
  files::require_regular_file(path, "dataset file");
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK_AS(InputError, in.good(), "dataset file '", path, "' cannot be read");
  std::vector<char> buffer(size_t{1} << 20);
  uint64_t total = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<size_t>(in.gcount());
    hash.add(buffer.data(), got);
    total += got;
  }
  hash.add(&total, sizeof total);
}

uint32_t tokens_crc32(const std::vector<int32_t>& tokens) {
  return data::crc32_of(reinterpret_cast<const unsigned char*>(tokens.data()),
                        tokens.size() * sizeof(int32_t));
}

}  // namespace

std::optional<std::string> cache_folder() {
  if (const char* set = std::getenv("LOOM_CACHE_DIR"); set && *set) {
    if (std::string(set) == "off") return std::nullopt;
    return std::string(set);
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    return std::string(xdg) + "/loom";
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return std::string(home) + "/.cache/loom";
  }
  return std::nullopt;
}

std::optional<TokenCache> TokenCache::for_dataset(const std::vector<std::string>& files,
                                                  const std::string& text_field,
                                                  int64_t max_document_bytes,
                                                  const Tokenizer& tokenizer) {
  const auto folder = cache_folder();
  if (!folder) return std::nullopt;
  Sha256 hash;
  hash.add(kKeyVersion);
  hash.add(text_field);
  hash.add(std::to_string(max_document_bytes));
  const TokenizerIdentity identity = tokenizer.identity();
  hash.add(identity.hash);
  hash.add(tokenizer.name());
  hash.add(tokenizer.encoding());
  hash.add(fmt::format("{} {} {}", tokenizer.vocab_size(), tokenizer.bos_id(), tokenizer.eos_id()));
  for (const auto& file : files) add_file(hash, file);
  return TokenCache(*folder + "/tokens/" + hash.hex() + ".tokens");
}

std::optional<TokenizedDataset> TokenCache::read() const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) return std::nullopt;
  auto damaged = [&](const std::string& why) -> std::optional<TokenizedDataset> {
    log::get("data")->warn("token cache entry {} is damaged ({}): tokenizing again", path_, why);
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
    return std::nullopt;
  };
  Header header{};
  if (!in.read(reinterpret_cast<char*>(&header), sizeof header)) return damaged("short header");
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0) return damaged("not a token cache");
  std::error_code error;
  const auto size = std::filesystem::file_size(path_, error);
  if (error || size != sizeof header + header.tokens * sizeof(int32_t)) {
    return damaged("size does not match its header");
  }
  TokenizedDataset dataset;
  dataset.documents = static_cast<int64_t>(header.documents);
  dataset.tokens.resize(header.tokens);
  if (!in.read(reinterpret_cast<char*>(dataset.tokens.data()),
               static_cast<std::streamsize>(header.tokens * sizeof(int32_t)))) {
    return damaged("short read");
  }
  if (tokens_crc32(dataset.tokens) != header.crc32) return damaged("checksum mismatch");
  return dataset;
}

void TokenCache::write(const TokenizedDataset& dataset) const {
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.documents = static_cast<uint64_t>(dataset.documents);
  header.tokens = dataset.tokens.size();
  header.crc32 = tokens_crc32(dataset.tokens);
  std::string content(reinterpret_cast<const char*>(&header), sizeof header);
  content.append(reinterpret_cast<const char*>(dataset.tokens.data()),
                 dataset.tokens.size() * sizeof(int32_t));
  try {
    files::create_directories(std::filesystem::path(path_).parent_path().string());
    files::write_atomic(path_, content);
  } catch (const std::exception& error) {
    log::get("data")->warn(
        "token cache: could not store {} ({}); set LOOM_CACHE_DIR to a "
        "writable folder, or LOOM_CACHE_DIR=off",
        path_, error.what());
  }
}

}  // namespace loom::data
