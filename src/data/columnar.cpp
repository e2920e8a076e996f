// Parquet and Arrow IPC through Arrow's C++ libraries (columnar.h). Built as C++20, which
// Arrow's headers need; nothing outside this file sees them.
#include "loom/data/columnar.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>
#include <arrow/util/config.h>
#include <arrow/util/utf8.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>

#include <algorithm>
#include <mutex>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/strings.h"

namespace loom::data {
namespace {

// The value of an Arrow Result, or an InputError naming the file and what was being done.
template <typename T>
T value_or_throw(arrow::Result<T> result, const std::string& path, const char* doing) {
  LOOM_CHECK_AS(InputError, result.ok(), "dataset file '", path, "': cannot ", doing, ": ",
                result.status().ToString());
  return std::move(result).ValueUnsafe();
}

void check_text_type(const arrow::Schema& schema, const std::string& path,
                     const std::string& text_field) {
  const auto field = schema.GetFieldByName(text_field);
  if (field == nullptr) {
    std::vector<std::string> names;
    for (const auto& f : schema.fields()) names.push_back(f->name());
    LOOM_THROW(InputError, "dataset file '", path, "' has no column \"", text_field,
               "\" (its columns: ", strings::join(names, ", "),
               "); name the text column with training.dataset_text_field / "
               "validation.dataset_text_field, or prepare-data's --text-field");
  }
  const auto id = field->type()->id();
  LOOM_CHECK_AS(InputError, id == arrow::Type::STRING || id == arrow::Type::LARGE_STRING,
                "dataset file '", path, "': column \"", text_field, "\" is ",
                field->type()->ToString(), ", expected a string column");
}

// Arrow's UTF-8 check reads tables that InitializeUTF8 fills: without it every text passes.
void initialize_utf8_tables() {
  static std::once_flag once;
  std::call_once(once, [] { arrow::util::InitializeUTF8(); });
}

// Appends the texts of one string array, checking nulls and UTF-8 row by row.
template <typename ArrayType>
void append_texts(const ArrayType& array, int64_t first_row, const std::string& where,
                  bool skip_bad, int64_t* skipped, std::vector<std::string_view>& out) {
  initialize_utf8_tables();
  for (int64_t i = 0; i < array.length(); ++i) {
    const char* problem = nullptr;
    std::string_view text;
    if (array.IsNull(i)) {
      problem = "the text is null";
    } else {
      text = array.GetView(i);
      if (!arrow::util::ValidateUTF8(reinterpret_cast<const uint8_t*>(text.data()),
                                     static_cast<int64_t>(text.size()))) {
        problem = "the text is not valid UTF-8";
      }
    }
    if (problem == nullptr) {
      out.push_back(text);
      continue;
    }
    LOOM_CHECK_AS(InputError, skip_bad, where, ", row ", first_row + i, ": ", problem);
    if (skipped) ++*skipped;
  }
}

// A string array's buffers (sizes, and every offset inside the character data), without its
// UTF-8 (append_texts checks that per row).
template <typename ArrayType>
arrow::Status check_offsets(const ArrayType& array) {
  const auto* offsets = array.raw_value_offsets();
  const int64_t n = array.length();
  if (n == 0) return arrow::Status::OK();
  const int64_t size = array.value_data() ? array.value_data()->size() : 0;
  if (offsets[0] < 0) return arrow::Status::Invalid("negative first offset");
  for (int64_t i = 0; i < n; ++i) {
    if (offsets[i + 1] < offsets[i]) return arrow::Status::Invalid("offsets decrease at ", i);
  }
  if (offsets[n] > size) return arrow::Status::Invalid("offsets pass the end of the data");
  return arrow::Status::OK();
}

arrow::Status check_structure(const arrow::Array& array) {
  ARROW_RETURN_NOT_OK(array.Validate());
  if (array.type_id() == arrow::Type::LARGE_STRING) {
    return check_offsets(static_cast<const arrow::LargeStringArray&>(array));
  }
  return check_offsets(static_cast<const arrow::StringArray&>(array));
}

void append_column(const arrow::ChunkedArray& column, const std::string& where, bool skip_bad,
                   int64_t* skipped, std::vector<std::string_view>& out) {
  int64_t row = 0;
  for (const auto& chunk : column.chunks()) {
    if (chunk->type_id() == arrow::Type::LARGE_STRING) {
      append_texts(static_cast<const arrow::LargeStringArray&>(*chunk), row, where, skip_bad,
                   skipped, out);
    } else {
      append_texts(static_cast<const arrow::StringArray&>(*chunk), row, where, skip_bad, skipped,
                   out);
    }
    row += chunk->length();
  }
}

}  // namespace

bool is_columnar_file(const std::string& path) {
  return strings::ends_with(path, ".parquet") || strings::ends_with(path, ".arrow");
}

struct ColumnarFile::Impl {
  std::string path;
  std::string text_field;
  bool parquet = false;
  // Parquet: the reader over the open file; the text column's leaf index.
  std::unique_ptr<parquet::arrow::FileReader> reader;
  int column = -1;
  // Arrow IPC: the record batches, zero-copy views of the memory-mapped file (only the pages a
  // rank reads are ever loaded).
  std::vector<std::shared_ptr<arrow::RecordBatch>> batches;
  std::vector<int64_t> rows;  // per unit

  void open_parquet() {
    auto input = value_or_throw(arrow::io::ReadableFile::Open(path), path, "open it");
    parquet::arrow::FileReaderBuilder builder;
    // Pages are read through a small buffer, and nothing is pre-buffered: Arrow's pre-buffer
    // cache keeps every row group read so far until the reader closes (a 337 MB file peaked at
    // 1.4 GB of RSS with it), which defeats reading one row group at a time.
    parquet::ReaderProperties properties = parquet::default_reader_properties();
    properties.enable_buffered_stream();
    properties.set_buffer_size(1 << 20);
    parquet::ArrowReaderProperties arrow_properties;
    arrow_properties.set_pre_buffer(false);
    builder.properties(arrow_properties);
    try {
      auto status = builder.Open(input, properties);
      LOOM_CHECK_AS(InputError, status.ok(), "dataset file '", path,
                    "' is not a readable Parquet file: ", status.ToString());
    } catch (const parquet::ParquetException& e) {
      LOOM_THROW(InputError, "dataset file '", path,
                 "' is not a readable Parquet file: ", e.what());
    }
    auto status = builder.Build(&reader);
    LOOM_CHECK_AS(InputError, status.ok(), "dataset file '", path,
                  "' is not a readable Parquet file: ", status.ToString());
    std::shared_ptr<arrow::Schema> schema;
    status = reader->GetSchema(&schema);
    LOOM_CHECK_AS(InputError, status.ok(), "dataset file '", path,
                  "': cannot read its schema: ", status.ToString());
    check_text_type(*schema, path, text_field);
    column = reader->parquet_reader()->metadata()->schema()->ColumnIndex(text_field);
    LOOM_CHECK_AS(InputError, column >= 0, "dataset file '", path, "': column \"", text_field,
                  "\" is not a top-level string column");
    const auto metadata = reader->parquet_reader()->metadata();
    for (int g = 0; g < metadata->num_row_groups(); ++g) {
      rows.push_back(metadata->RowGroup(g)->num_rows());
    }
  }

  void open_arrow() {
    auto file = value_or_throw(arrow::io::MemoryMappedFile::Open(path, arrow::io::FileMode::READ),
                               path, "map it");
    // The IPC file format starts with "ARROW1"; `datasets` writes the stream format.
    const auto magic = value_or_throw(file->ReadAt(0, 6), path, "read its header");
    std::shared_ptr<arrow::Schema> schema;
    if (magic->ToString() == "ARROW1") {
      auto reader = value_or_throw(arrow::ipc::RecordBatchFileReader::Open(file), path,
                                   "read it as an Arrow IPC file");
      schema = reader->schema();
      check_text_type(*schema, path, text_field);
      for (int i = 0; i < reader->num_record_batches(); ++i) {
        batches.push_back(value_or_throw(reader->ReadRecordBatch(i), path, "read a record batch"));
      }
    } else {
      auto reader = value_or_throw(arrow::ipc::RecordBatchStreamReader::Open(file), path,
                                   "read it as an Arrow IPC stream");
      schema = reader->schema();
      check_text_type(*schema, path, text_field);
      while (true) {
        auto batch = value_or_throw(reader->Next(), path, "read a record batch");
        if (batch == nullptr) break;
        batches.push_back(std::move(batch));
      }
    }
    column = schema->GetFieldIndex(text_field);
    for (const auto& batch : batches) rows.push_back(batch->num_rows());
  }
};

ColumnarFile::ColumnarFile(const std::string& path, const std::string& text_field)
    : impl_(std::make_unique<Impl>()) {
  files::require_regular_file(path, "dataset file");
  impl_->path = path;
  impl_->text_field = text_field;
  impl_->parquet = strings::ends_with(path, ".parquet");
  if (impl_->parquet) {
    impl_->open_parquet();
  } else {
    impl_->open_arrow();
  }
}

ColumnarFile::~ColumnarFile() = default;

const std::string& ColumnarFile::path() const {
  return impl_->path;
}
const char* ColumnarFile::unit_name() const {
  return impl_->parquet ? "row group" : "record batch";
}
int64_t ColumnarFile::units() const {
  return static_cast<int64_t>(impl_->rows.size());
}
int64_t ColumnarFile::unit_rows(int64_t unit) const {
  LOOM_CHECK(unit >= 0 && unit < units(), "unit ", unit, " of ", units());
  return impl_->rows[static_cast<size_t>(unit)];
}
int64_t ColumnarFile::rows() const {
  int64_t total = 0;
  for (int64_t r : impl_->rows) total += r;
  return total;
}

ColumnarUnit::ColumnarUnit() = default;
ColumnarUnit::~ColumnarUnit() = default;
ColumnarUnit::ColumnarUnit(const ColumnarUnit&) = default;
ColumnarUnit& ColumnarUnit::operator=(const ColumnarUnit&) = default;

ColumnarUnit ColumnarFile::read_unit(int64_t unit, bool skip_bad_records, int64_t* skipped) const {
  LOOM_CHECK(unit >= 0 && unit < units(), "unit ", unit, " of ", units());
  const std::string where =
      "dataset file '" + impl_->path + "', " + unit_name() + " " + std::to_string(unit);
  ColumnarUnit result;
  auto& texts = result.texts_;
  texts.reserve(static_cast<size_t>(unit_rows(unit)));
  if (impl_->parquet) {
    std::shared_ptr<arrow::Table> table;
    try {
#if ARROW_VERSION_MAJOR >= 24
      auto read = impl_->reader->ReadRowGroup(static_cast<int>(unit), {impl_->column});
      LOOM_CHECK_AS(InputError, read.ok(), where, ": cannot read it: ", read.status().ToString());
      table = *read;
#else
      auto status = impl_->reader->ReadRowGroup(static_cast<int>(unit), {impl_->column}, &table);
      LOOM_CHECK_AS(InputError, status.ok(), where, ": cannot read it: ", status.ToString());
#endif
    } catch (const parquet::ParquetException& e) {
      LOOM_THROW(InputError, where, ": cannot read it: ", e.what());
    }
    append_column(*table->column(0), where, skip_bad_records, skipped, texts);
    result.owner_ = table;
  } else {
    const auto& batch = impl_->batches[static_cast<size_t>(unit)];
    // The batch's buffers are views of the mapped file: check offsets and lengths before
    // trusting them (a corrupt file must fail here, not read out of bounds). ValidateFull would
    // also refuse the whole batch for one text that is not UTF-8, which skip_bad_records checks
    // row by row.
    const auto valid = check_structure(*batch->column(impl_->column));
    LOOM_CHECK_AS(InputError, valid.ok(), where, " is corrupt: ", valid.ToString());
    auto column = std::make_shared<arrow::ChunkedArray>(batch->column(impl_->column));
    append_column(*column, where, skip_bad_records, skipped, texts);
    result.owner_ = column;
  }
  return result;
}

}  // namespace loom::data
