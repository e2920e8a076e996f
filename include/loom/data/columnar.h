// Columnar dataset files through Apache Arrow's C++ libraries: Parquet (FineWeb, DCLM mirrors)
// and Arrow IPC files (the data-XXXXX-of-YYYYY.arrow of a Hugging Face `save_to_disk` folder,
// stream or file format). A file is read one unit at a time: a Parquet row group, an Arrow
// record batch. Only the text column of that unit is decoded, so a 10 GB file is never held in
// memory, and a data-parallel rank reads only the units it owns.
//
// Arrow's headers need C++20; this header includes none of them (columnar.cpp alone does).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

// Whether `path` names a columnar file by its extension (.parquet, .arrow).
bool is_columnar_file(const std::string& path);

// The texts of one unit, as views of Arrow's decoded column (no copy per row): valid while the
// unit (or a copy of it) lives. Rows that were bad and skipped are left out.
class ColumnarUnit {
 public:
  ColumnarUnit();
  ~ColumnarUnit();
  ColumnarUnit(const ColumnarUnit&);
  ColumnarUnit& operator=(const ColumnarUnit&);
  size_t size() const { return texts_.size(); }
  bool empty() const { return texts_.empty(); }
  std::string_view text(size_t row) const { return texts_[row]; }

 private:
  friend class ColumnarFile;
  std::shared_ptr<const void> owner_;  // keeps the Arrow column alive
  std::vector<std::string_view> texts_;
};

class ColumnarFile {
 public:
  // Opens the file and checks its schema: `text_field` must be a string column. Throws
  // loom::InputError naming the file and what was expected (corrupt file, missing column,
  // non-string column).
  ColumnarFile(const std::string& path, const std::string& text_field);
  ~ColumnarFile();
  ColumnarFile(const ColumnarFile&) = delete;
  ColumnarFile& operator=(const ColumnarFile&) = delete;

  const std::string& path() const;
  const char* unit_name() const;  // "row group" or "record batch", for messages
  int64_t units() const;
  int64_t unit_rows(int64_t unit) const;
  int64_t rows() const;

  // The texts of `unit`'s rows, in order. A null or non-UTF-8 text throws loom::InputError
  // naming file, unit and row, or with skip_bad_records is left out and counted in *skipped.
  ColumnarUnit read_unit(int64_t unit, bool skip_bad_records = false,
                         int64_t* skipped = nullptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::data
