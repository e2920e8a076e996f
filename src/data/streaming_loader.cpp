#include "loom/data/streaming_loader.h"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/data/columnar.h"
#include "loom/data/documents.h"
#include "loom/data/shards.h"
#include "loom/data/token_stream.h"

namespace loom::data {

StreamingLoader::StreamingLoader(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                                 PackedLoaderOptions options)
    : options_(options), tokenizer_(tokenizer) {
  LOOM_CHECK_AS(InputError, options_.seq_len >= 1, "seq_len must be at least 1, got ",
                options_.seq_len);
  LOOM_CHECK(
      options_.dp_world >= 1 && options_.dp_rank >= 0 && options_.dp_rank < options_.dp_world,
      "bad data-parallel rank ", options_.dp_rank, " of ", options_.dp_world);
  // The files' names, in order, hashed once: the state (taken after every batch) stays small.
  uint64_t hash = 1469598103934665603ull;
  for (const auto& name : files) {
    for (unsigned char c : name + '\n') hash = (hash ^ c) * 1099511628211ull;
  }
  files_fingerprint_ = fmt::format("{:016x}", hash);
  int64_t global = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    files_.push_back(std::make_unique<ColumnarFile>(files[f], options_.text_field));
    const auto& file = *files_.back();
    for (int64_t u = 0; u < file.units(); ++u, ++global) {
      total_rows_ += file.unit_rows(u);
      if (global % options_.dp_world != options_.dp_rank) continue;
      if (file.unit_rows(u) == 0) continue;  // nothing to read
      units_.push_back({f, u});
      rank_rows_ += file.unit_rows(u);
    }
  }
  LOOM_CHECK_AS(InputError, !units_.empty(), "data-parallel rank ", options_.dp_rank, " of ",
                options_.dp_world, " has no rows to read: the dataset has ", global,
                " row groups / record batches (", total_rows_,
                " rows), which are dealt to the ranks whole; write it with more, smaller row "
                "groups, or pre-tokenize it with `loom prepare-data`");
  load_unit();
}

StreamingLoader::~StreamingLoader() = default;

void StreamingLoader::load_unit() {
  const Unit& unit = units_[unit_pos_];
  unit_texts_ = ColumnarUnit();  // one unit in memory at a time
  unit_texts_ = files_[unit.file]->read_unit(unit.index, options_.skip_bad_records, &skipped_);
  // A unit whose every row was skipped as bad: move on (the count says so).
  if (unit_texts_.empty()) {
    log::get("data")->warn("{}, {} {}: no readable row", files_[unit.file]->path(),
                           files_[unit.file]->unit_name(), unit.index);
  }
  load_document();
}

void StreamingLoader::load_document() {
  document_.clear();
  if (row_ < unit_texts_.size()) append_document(tokenizer_, unit_texts_.text(row_), document_);
}

void StreamingLoader::advance_row() {
  token_ = 0;
  ++row_;
  size_t empty_units = 0;
  while (row_ >= unit_texts_.size()) {
    LOOM_CHECK_AS(InputError, empty_units++ <= units_.size(), "data-parallel rank ",
                  options_.dp_rank, ": no readable row in any of its ", units_.size(),
                  " row groups / record batches (all skipped as bad records)");
    row_ = 0;
    if (++unit_pos_ == units_.size()) {
      unit_pos_ = 0;
      ++epoch_;
      log::get("data")->info("data-parallel rank {}: epoch {} of the streamed dataset begins",
                             options_.dp_rank, epoch_);
    }
    const Unit& unit = units_[unit_pos_];
    unit_texts_ = ColumnarUnit();
    unit_texts_ = files_[unit.file]->read_unit(unit.index, options_.skip_bad_records, &skipped_);
  }
  load_document();
}

Batch StreamingLoader::next(int64_t batch_size, int64_t seq_len) {
  LOOM_CHECK(seq_len == options_.seq_len, "loader built for seq_len ", options_.seq_len,
             ", asked for ", seq_len);
  at::Tensor samples = at::empty({batch_size, seq_len + 1}, at::kLong);
  int64_t* out = samples.data_ptr<int64_t>();
  const int64_t total = batch_size * (seq_len + 1);
  for (int64_t filled = 0; filled < total;) {
    if (token_ >= document_.size()) {
      advance_row();
      continue;
    }
    const int64_t take =
        std::min<int64_t>(total - filled, static_cast<int64_t>(document_.size() - token_));
    for (int64_t i = 0; i < take; ++i) out[filled + i] = document_[token_ + i];
    filled += take;
    token_ += static_cast<size_t>(take);
  }
  Batch batch{samples.slice(1, 0, seq_len).contiguous(),
              samples.slice(1, 1, seq_len + 1).contiguous()};
  if (options_.bos_id >= 0) mark_documents(batch, options_.bos_id);
  return batch;
}

nlohmann::json StreamingLoader::state() const {
  const Unit& unit = units_[unit_pos_];
  return {{"kind", "stream"},
          {"files", files_.size()},
          {"files_fnv1a", files_fingerprint_},
          {"seq_len", options_.seq_len},
          {"dp_rank", options_.dp_rank},
          {"dp_world", options_.dp_world},
          {"epoch", epoch_},
          {"unit", unit_pos_},
          {"file", files_[unit.file]->path()},
          {"row_group", unit.index},
          {"row", row_},
          {"token", token_},
          {"records_skipped", skipped_},
          {"tokenizer", tokenizer_.identity().hash},
          {"tokenizer_encoding", tokenizer_.encoding()}};
}

void StreamingLoader::load_state(const nlohmann::json& state) {
  try {
    LOOM_CHECK_AS(InputError, state.at("kind") == "stream",
                  "not a streamed-dataset loader state (saved: ", state.dump(), ")");
    const nlohmann::json mine = this->state();
    LOOM_CHECK_AS(
        InputError,
        state.at("files") == mine.at("files") && state.at("files_fnv1a") == mine.at("files_fnv1a"),
        "data-loader state is for other files (saved: ", state.at("files").dump(),
        " files, fingerprint ", state.at("files_fnv1a").dump(), "; now ", files_.size(), ", ",
        files_fingerprint_, ")");
    LOOM_CHECK_AS(InputError,
                  state.at("dp_world") == mine.at("dp_world") &&
                      state.at("dp_rank") == mine.at("dp_rank") &&
                      state.at("seq_len") == mine.at("seq_len"),
                  "streamed-dataset state of data-parallel rank ", state.at("dp_rank").dump(),
                  " of ", state.at("dp_world").dump(), " with seq_len ", state.at("seq_len").dump(),
                  " does not fit rank ", options_.dp_rank, " of ", options_.dp_world,
                  " with seq_len ", options_.seq_len,
                  ": a streamed dataset resumes on the same data-parallel degree (or set "
                  "checkpoint.exclude_from_loading = [\"dataloader\"] to start it over)");
    // The position is a token inside a document: another tokenizer's tokens there are others.
    LOOM_CHECK_AS(
        InputError,
        !state.contains("tokenizer") || state.at("tokenizer") == tokenizer_.identity().hash,
        "streamed-dataset state was made with another tokenizer (saved ",
        state.at("tokenizer").dump(), ", now \"", tokenizer_.identity().hash,
        "\"): its position inside a document means nothing to this one (set "
        "checkpoint.exclude_from_loading = [\"dataloader\"] to start the data over)");
    const std::string encoding = state.contains("tokenizer_encoding")
                                     ? state.at("tokenizer_encoding").get<std::string>()
                                     : unrecorded_encoding(tokenizer_);
    LOOM_CHECK_AS(InputError, encoding == tokenizer_.encoding(),
                  "streamed-dataset state was made by a loom that encoded this tokenizer as '",
                  encoding, "', this one encodes it as '", tokenizer_.encoding(),
                  "' (docs/data.md says what changed): its position inside a document may "
                  "point elsewhere (set checkpoint.exclude_from_loading = [\"dataloader\"] to "
                  "start the data over)");
    const auto unit = state.at("unit").get<size_t>();
    LOOM_CHECK_AS(InputError, unit < units_.size(), "data-loader state names unit ", unit, " of ",
                  units_.size());
    LOOM_CHECK_AS(InputError,
                  state.at("row_group").get<int64_t>() == units_[unit].index &&
                      state.at("file").get<std::string>() == files_[units_[unit].file]->path(),
                  "data-loader state's file and row group do not match this dataset's");
    epoch_ = state.at("epoch").get<int64_t>();
    unit_pos_ = unit;
    row_ = state.at("row").get<size_t>();
    load_unit();
    skipped_ = state.at("records_skipped").get<int64_t>();
    token_ = state.at("token").get<size_t>();
    // Row 0 of a unit with no readable row is where a loader stands before its first batch
    // when its first unit is such (next() moves past it).
    const bool before_empty_unit = unit_texts_.empty() && row_ == 0 && token_ == 0;
    LOOM_CHECK_AS(InputError,
                  before_empty_unit || (row_ < unit_texts_.size() && token_ <= document_.size()),
                  "data-loader state's row ", row_, " / token ", token_,
                  " is outside its row group (", unit_texts_.size(), " rows)");
  } catch (const nlohmann::json::exception& error) {
    LOOM_THROW(InputError, "malformed data-loader state: ", error.what());
  }
}

}  // namespace loom::data

namespace loom::data {

std::unique_ptr<BatchSource> open_dataset_source(const std::string& name,
                                                 const std::optional<std::string>& path,
                                                 const Tokenizer& tokenizer,
                                                 PackedLoaderOptions options,
                                                 const std::string& key) {
  const std::string location = dataset_location(name, path, key);
  if (!is_prepared_dataset(location)) {
    const auto files = expand_dataset_path(location);
    const bool columnar = std::all_of(files.begin(), files.end(), is_columnar_file);
    if (columnar) {
      auto loader = std::make_unique<StreamingLoader>(files, tokenizer, options);
      log::get("data")->info(
          "{}: {} columnar files, {} rows, streamed ({} tokenizer); data-parallel rank {} reads "
          "{} row groups / record batches ({} rows), in order",
          location, files.size(), loader->total_rows(), tokenizer.name(), options.dp_rank,
          loader->rank_units(), loader->rank_rows());
      return loader;
    }
  }
  return open_dataset(name, path, tokenizer, options, key);
}

}  // namespace loom::data
