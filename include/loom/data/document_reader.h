// One dataset file's documents, one at a time, whatever its format: JSONL (a record per line,
// the text in a named field) or plain text (the whole file is one document), each plain, gzip
// (.gz) or zstd (.zst); Parquet; Arrow IPC (columnar.h). Memory holds one line (or one Parquet
// row group / Arrow record batch) at a time, except plain text, whose one document is the file.
// Errors name the file and the line, row group or row.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/data/columnar.h"

namespace loom::data {

class CompressedInput;

// training.dataset_max_document_mib's default: 256 MiB in one document (line or text file).
constexpr int64_t kMaxDocumentBytes = int64_t{256} << 20;

class DocumentReader {
 public:
  // skip_bad_records: a bad record (invalid JSON, missing or non-string text, invalid UTF-8,
  // a null text) is skipped and counted instead of failing; empty or unreadable files still
  // fail.
  // `max_document_bytes`: a longer line (JSONL) or text file is refused naming the file and the
  // training.dataset_max_document_mib key, so a compressed file holding one huge line (a zstd
  // bomb: 393 KB expanding to one 12 GB line) cannot grow the buffer without bound.
  DocumentReader(const std::string& path, const std::string& text_field = "text",
                 bool skip_bad_records = false, int64_t max_document_bytes = kMaxDocumentBytes);
  ~DocumentReader();

  // The next document into `text`; false after the last one. Throws loom::InputError.
  bool next(std::string& text);
  int64_t records_skipped() const { return skipped_; }
  const std::string& path() const { return path_; }

 private:
  bool next_line(std::string& line);
  bool next_record(std::string& text);
  bool next_row(std::string& text);

  std::string path_;
  std::string text_field_;
  bool skip_bad_ = false;
  int64_t max_document_bytes_ = kMaxDocumentBytes;
  bool jsonl_ = false;
  int64_t skipped_ = 0;
  int64_t documents_ = 0;
  bool finished_ = false;
  // Text formats: the decompressed stream, a window of it, the current line number.
  std::unique_ptr<CompressedInput> input_;
  std::vector<char> buffer_;
  size_t buffer_start_ = 0;
  size_t buffer_end_ = 0;
  bool input_done_ = false;
  int64_t bytes_ = 0;
  int64_t line_number_ = 0;
  // Columnar formats: the file, the unit being read and its texts.
  std::unique_ptr<ColumnarFile> columnar_;
  int64_t unit_ = -1;
  ColumnarUnit unit_texts_;
  size_t unit_row_ = 0;
};

}  // namespace loom::data
