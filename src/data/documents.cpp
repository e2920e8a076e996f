#include "loom/data/documents.h"

#include <glob.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"

namespace loom::data {
namespace {

// The whole file, decompressed when gzip (zlib reads plain files through the same call).
std::string read_maybe_gzip(const std::string& path) {
  files::require_regular_file(path, "dataset file");
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  LOOM_CHECK_AS(InputError, file != nullptr, "cannot open dataset file '", path,
                "': ", std::strerror(errno));
  std::string content;
  char buffer[1 << 16];
  while (true) {
    int n = gzread(file.get(), buffer, sizeof(buffer));
    if (n < 0) {
      int code = 0;
      const char* message = gzerror(file.get(), &code);
      LOOM_THROW(InputError, "cannot read dataset file '", path, "': ", message);
    }
    if (n == 0) break;
    try {
      content.append(buffer, static_cast<size_t>(n));
    } catch (const std::bad_alloc&) {
      LOOM_THROW(InputError, "dataset file '", path, "': out of memory after ", content.size(),
                 " bytes (decompressed); split it into smaller files");
    }
  }
  // At the end of the input zlib says Z_BUF_ERROR when a gzip stream stopped in the middle (no
  // trailer, or cut at a block boundary): what was read is only part of the file.
  int code = Z_OK;
  const char* message = gzerror(file.get(), &code);
  LOOM_CHECK_AS(InputError, code == Z_OK, "dataset file '", path, "' is truncated or corrupt (",
                message,
                "): the gzip stream ends before its trailer; refusing to train on part of it");
  return content;
}

bool is_text_file(const std::string& name) {
  const std::string plain =
      strings::ends_with(name, ".gz") ? name.substr(0, name.size() - 3) : name;
  return strings::ends_with(plain, ".jsonl") || strings::ends_with(plain, ".json") ||
         strings::ends_with(plain, ".txt");
}

}  // namespace

std::vector<std::string> expand_dataset_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  if (path.find_first_of("*?[") != std::string::npos) {
    glob_t matches{};
    if (::glob(path.c_str(), 0, nullptr, &matches) == 0) {
      for (size_t i = 0; i < matches.gl_pathc; ++i) files.emplace_back(matches.gl_pathv[i]);
    }
    ::globfree(&matches);
  } else if (fs::is_directory(path)) {
    for (const auto& entry : fs::directory_iterator(path)) {
      if (entry.is_regular_file() && is_text_file(entry.path().filename().string())) {
        files.push_back(entry.path().string());
      }
    }
  } else {
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  LOOM_CHECK_AS(InputError, !files.empty(), "dataset path '", path,
                "' matches no .jsonl, .json or .txt file (optionally .gz)");
  return files;
}

bool is_valid_utf8(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    size_t length = c < 0x80           ? 1
                    : (c >> 5) == 0x6  ? 2
                    : (c >> 4) == 0xe  ? 3
                    : (c >> 3) == 0x1e ? 4
                                       : 0;
    if (length == 0 || i + length > n) return false;
    uint32_t cp = length == 1   ? c
                  : length == 2 ? (c & 0x1f)
                  : length == 3 ? (c & 0x0f)
                                : (c & 0x07);
    for (size_t k = 1; k < length; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    const bool overlong =
        (length == 2 && cp < 0x80) || (length == 3 && cp < 0x800) || (length == 4 && cp < 0x10000);
    if (overlong || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += length;
  }
  return true;
}

namespace {

// The text of one JSONL record; throws loom::InputError naming file:line and what is wrong.
std::string record_text(const std::string& line, const std::string& path, int64_t line_number,
                        const std::string& text_field) {
  // Nesting is bounded: a record nested a million deep is refused, not followed.
  const nlohmann::json record =
      json::parse_bounded(line, path + ":" + std::to_string(line_number) + ": invalid JSON");
  LOOM_CHECK_AS(InputError, record.is_object() && record.contains(text_field), path, ":",
                line_number, ": no \"", text_field,
                "\" field (name the field holding the text with training.dataset_text_field / "
                "validation.dataset_text_field, or prepare-data's --text-field)");
  LOOM_CHECK_AS(InputError, record[text_field].is_string(), path, ":", line_number, ": \"",
                text_field, "\" is not a string");
  std::string text = record[text_field].get<std::string>();
  LOOM_CHECK_AS(InputError, is_valid_utf8(text), path, ":", line_number,
                ": text is not valid UTF-8");
  return text;
}

}  // namespace

std::vector<std::string> read_documents(const std::string& path, const std::string& text_field,
                                        bool skip_bad_records, int64_t* records_skipped) {
  const std::string content = read_maybe_gzip(path);
  LOOM_CHECK_AS(InputError, !content.empty(), "dataset file '", path, "' is empty");
  const std::string plain =
      strings::ends_with(path, ".gz") ? path.substr(0, path.size() - 3) : path;
  std::vector<std::string> documents;
  if (!strings::ends_with(plain, ".jsonl") && !strings::ends_with(plain, ".json")) {
    LOOM_CHECK_AS(InputError, is_valid_utf8(content), path, ": not valid UTF-8 text");
    documents.push_back(content);
    return documents;
  }
  size_t start = 0;
  int64_t line_number = 0;
  int64_t skipped = 0;
  while (start < content.size()) {
    size_t end = content.find('\n', start);
    if (end == std::string::npos) end = content.size();
    ++line_number;
    std::string line = content.substr(start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      try {
        documents.push_back(record_text(line, path, line_number, text_field));
      } catch (const std::bad_alloc&) {
        LOOM_THROW(InputError, path, ":", line_number, ": out of memory reading a record of ",
                   line.size(), " bytes");
      }
    } catch (const InputError& error) {
      if (!skip_bad_records) throw;
      if (skipped++ == 0) {
        log::get("data")->warn("skipping bad records (dataset_on_error = skip); first: {}",
                               error.message());
      }
    }
  }
  if (skipped > 0) log::get("data")->warn("{}: skipped {} bad records", path, skipped);
  if (records_skipped) *records_skipped += skipped;
  LOOM_CHECK_AS(InputError, !documents.empty(), "dataset file '", path, "' holds no document");
  return documents;
}

}  // namespace loom::data
