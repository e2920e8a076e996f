#include "loom/data/documents.h"

#include <glob.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/data/columnar.h"
#include "loom/data/compressed_input.h"
#include "loom/data/document_reader.h"
#include "loom/data/hf_dataset_folder.h"

namespace loom::data {
namespace {

bool is_text_file(const std::string& name) {
  const std::string plain = without_compression_suffix(name);
  return strings::ends_with(plain, ".jsonl") || strings::ends_with(plain, ".json") ||
         strings::ends_with(plain, ".txt");
}

bool is_dataset_file(const std::string& name) {
  return is_text_file(name) || is_columnar_file(name);
}

}  // namespace

std::vector<std::string> expand_dataset_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  if (path.find_first_of("*?[") != std::string::npos) {
    // As a folder's files: the dataset files among the matches (a README.md is no document).
    glob_t matches{};
    std::vector<std::string> left_out;
    if (::glob(path.c_str(), 0, nullptr, &matches) == 0) {
      for (size_t i = 0; i < matches.gl_pathc; ++i) {
        const fs::path match(matches.gl_pathv[i]);
        const bool dataset =
            fs::is_regular_file(match) && is_dataset_file(match.filename().string());
        (dataset ? files : left_out).push_back(match.string());
      }
    }
    ::globfree(&matches);
    if (!left_out.empty()) {
      log::get("data")->warn(
          "dataset path '{}': {} match(es) left out, not dataset files (.jsonl, .json, .txt, "
          ".parquet, .arrow): {}",
          path, left_out.size(), left_out.front() + (left_out.size() > 1 ? ", ..." : ""));
    }
  } else if (fs::is_directory(path)) {
    if (is_hf_dataset_folder(path)) return hf_dataset_folder_files(path);
    for (const auto& entry : fs::directory_iterator(path)) {
      if (entry.is_regular_file() && is_dataset_file(entry.path().filename().string())) {
        files.push_back(entry.path().string());
      }
    }
  } else {
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  LOOM_CHECK_AS(InputError, !files.empty(), "dataset path '", path,
                "' matches no dataset file (.jsonl, .json or .txt, optionally .gz or .zst; "
                ".parquet; .arrow)");
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
  LOOM_CHECK_AS(InputError, record.is_object(), path, ":", line_number,
                ": expected one JSON object per line (JSON Lines), found ",
                record.is_array() ? "an array (a JSON file that is one array of records: write "
                                    "one record per line)"
                                  : std::string("a ") + record.type_name());
  LOOM_CHECK_AS(InputError, record.contains(text_field), path, ":", line_number, ": no \"",
                text_field,
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

DocumentReader::DocumentReader(const std::string& path, const std::string& text_field,
                               bool skip_bad_records, int64_t max_document_bytes)
    : path_(path),
      text_field_(text_field),
      skip_bad_(skip_bad_records),
      max_document_bytes_(max_document_bytes) {
  if (is_columnar_file(path)) {
    columnar_ = std::make_unique<ColumnarFile>(path, text_field);
    return;
  }
  const std::string plain = without_compression_suffix(path);
  jsonl_ = strings::ends_with(plain, ".jsonl") || strings::ends_with(plain, ".json");
  input_ = open_compressed_input(path);
  buffer_.resize(1 << 16);
}

DocumentReader::~DocumentReader() = default;

bool DocumentReader::next(std::string& text) {
  const bool found = columnar_ ? next_row(text) : jsonl_ ? next_record(text) : next_line(text);
  if (found) {
    ++documents_;
    return true;
  }
  if (finished_) return false;
  finished_ = true;
  LOOM_CHECK_AS(InputError, columnar_ || bytes_ > 0, "dataset file '", path_, "' is empty");
  LOOM_CHECK_AS(InputError, documents_ > 0, "dataset file '", path_, "' holds no document");
  if (skipped_ > 0) log::get("data")->warn("{}: skipped {} bad records", path_, skipped_);
  return false;
}

// The next line of the decompressed stream (without its newline); for plain text the whole
// file, once. The window grows for a line longer than it.
bool DocumentReader::next_line(std::string& line) {
  while (true) {
    if (jsonl_) {
      const char* begin = buffer_.data() + buffer_start_;
      const void* newline = std::memchr(begin, '\n', buffer_end_ - buffer_start_);
      if (newline != nullptr) {
        const size_t length = static_cast<const char*>(newline) - begin;
        line.assign(begin, length);
        buffer_start_ += length + 1;
        return true;
      }
    }
    if (input_done_) {
      if (buffer_start_ == buffer_end_) return false;
      line.assign(buffer_.data() + buffer_start_, buffer_end_ - buffer_start_);
      buffer_start_ = buffer_end_;
      if (!jsonl_) LOOM_CHECK_AS(InputError, is_valid_utf8(line), path_, ": not valid UTF-8 text");
      return true;
    }
    // Keep the unread part at the front; grow when it fills the window.
    if (buffer_start_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + buffer_start_, buffer_end_ - buffer_start_);
      buffer_end_ -= buffer_start_;
      buffer_start_ = 0;
    }
    if (buffer_end_ == buffer_.size()) {
      // A full window without the line's end: the line is longer than the window (the cap let
      // lines of up to twice itself through when it compared with <=).
      LOOM_CHECK_AS(InputError, static_cast<int64_t>(buffer_end_) < max_document_bytes_,
                    "dataset file '", path_, "': one ", jsonl_ ? "line" : "document",
                    " is longer than ", max_document_bytes_ >> 20,
                    " MiB (training.dataset_max_document_mib); split it, or raise the key if "
                    "documents this long are meant");
      try {
        buffer_.resize(buffer_.size() * 2);
      } catch (const std::bad_alloc&) {
        LOOM_THROW(InputError, "dataset file '", path_, "': out of memory after ", buffer_end_,
                   " bytes of one ", jsonl_ ? "line" : "document", "; split it into smaller files");
      }
    }
    const size_t n = input_->read(buffer_.data() + buffer_end_, buffer_.size() - buffer_end_);
    buffer_end_ += n;
    bytes_ += static_cast<int64_t>(n);
    if (n == 0) input_done_ = true;
  }
}

bool DocumentReader::next_record(std::string& text) {
  std::string line;
  while (next_line(line)) {
    ++line_number_;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      text = record_text(line, path_, line_number_, text_field_);
      return true;
    } catch (const InputError& error) {
      if (!skip_bad_) throw;
      if (skipped_++ == 0) {
        log::get("data")->warn("skipping bad records (dataset_on_error = skip); first: {}",
                               error.message());
      }
    }
  }
  return false;
}

bool DocumentReader::next_row(std::string& text) {
  while (unit_row_ >= unit_texts_.size()) {
    if (unit_ + 1 >= columnar_->units()) return false;
    unit_texts_ = ColumnarUnit();  // one unit in memory at a time
    unit_texts_ = columnar_->read_unit(++unit_, skip_bad_, &skipped_);
    unit_row_ = 0;
  }
  text.assign(unit_texts_.text(unit_row_++));
  return true;
}

std::vector<std::string> read_documents(const std::string& path, const std::string& text_field,
                                        bool skip_bad_records, int64_t* records_skipped,
                                        int64_t max_document_bytes) {
  DocumentReader reader(path, text_field, skip_bad_records, max_document_bytes);
  std::vector<std::string> documents;
  std::string text;
  while (reader.next(text)) documents.push_back(std::move(text));
  if (records_skipped) *records_skipped += reader.records_skipped();
  return documents;
}

}  // namespace loom::data
