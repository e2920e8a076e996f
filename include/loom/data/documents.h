// Reading documents: JSONL (one JSON object per line, text in a configurable field) or plain
// text (one document per file), either optionally gzip (.gz) or zstd (.zst) compressed; Parquet
// and Arrow files (the text column). Errors name the file and line (or row group and row):
// invalid JSON, a missing or non-string text field, invalid UTF-8, an empty file.
// document_reader.h reads the same files one document at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

// skip_bad_records: a bad JSONL record is skipped (logged, added to *records_skipped) instead of
// failing; empty or unreadable files still fail.
// `max_document_bytes`: see DocumentReader (document_reader.h).
std::vector<std::string> read_documents(const std::string& path,
                                        const std::string& text_field = "text",
                                        bool skip_bad_records = false,
                                        int64_t* records_skipped = nullptr,
                                        int64_t max_document_bytes = int64_t{256} << 20);

// The files a dataset path names: a file; a Hugging Face save_to_disk folder (its .arrow files,
// in the order of its state.json); a directory (its .jsonl/.json/.txt files, optionally .gz or
// .zst, and .parquet/.arrow files, sorted); or a glob pattern (sorted matches). Throws
// loom::InputError when nothing matches.
std::vector<std::string> expand_dataset_path(const std::string& path);

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points > U+10FFFF).
bool is_valid_utf8(const std::string& text);

}  // namespace loom::data
