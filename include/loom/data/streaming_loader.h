// Columnar datasets (Parquet, Arrow, a `save_to_disk` folder) streamed for training: documents
// are read one unit (row group / record batch) at a time, tokenized as they come, written as
// BOS ids EOS into one stream per rank and cut into windows of seq_len + 1 tokens. Nothing is
// shuffled: streamed corpora are read in order, as torchtitan's streamed datasets are (run
// `loom prepare-data` for shuffled windows over pre-tokenized shards).
//
// Data parallelism: the units of all files, in order, are dealt round-robin to the ranks (unit
// g belongs to rank g % dp_world), so a rank reads only its own row groups; together the ranks
// cover every row exactly once per epoch. A rank that reaches the end of its units starts its
// next epoch on its own.
//
// Resume: the state is this rank's position, exact to the token: epoch, the unit (and the file
// and row group it names), the row within it, and the token within that row's document. It
// loads only into a loader over the same files with the same seq_len, dp_rank and dp_world
// (another data-parallel degree is refused, naming checkpoint.exclude_from_loading).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/data/batch_source.h"
#include "loom/data/columnar.h"
#include "loom/data/packed_loader.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

class StreamingLoader : public BatchSource {
 public:
  // `tokenizer` must outlive the loader (it tokenizes in next(), on the prefetch thread).
  StreamingLoader(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                  PackedLoaderOptions options);
  ~StreamingLoader() override;

  Batch next(int64_t batch_size, int64_t seq_len) override;
  int64_t records_skipped() const override { return skipped_; }
  nlohmann::json state() const override;
  void load_state(const nlohmann::json& state) override;

  // This rank's units and rows; all files' rows.
  int64_t rank_units() const { return static_cast<int64_t>(units_.size()); }
  int64_t rank_rows() const { return rank_rows_; }
  int64_t total_rows() const { return total_rows_; }

 private:
  struct Unit {
    size_t file;
    int64_t index;  // row group / record batch within the file
  };
  // Reads unit units_[unit_pos_] and tokenizes row row_ of it.
  void load_unit();
  void load_document();
  // One token at the cursor is used: moves to the next row, unit and epoch as they run out.
  void advance_row();

  PackedLoaderOptions options_;
  const Tokenizer& tokenizer_;
  std::vector<std::unique_ptr<ColumnarFile>> files_;
  std::vector<Unit> units_;        // this rank's, in order
  std::string files_fingerprint_;  // FNV-1a of the file names, for the state
  int64_t rank_rows_ = 0;
  int64_t total_rows_ = 0;
  int64_t skipped_ = 0;
  // The cursor: the next token is document_[token_] of row row_ of units_[unit_pos_].
  int64_t epoch_ = 0;
  size_t unit_pos_ = 0;
  size_t row_ = 0;
  size_t token_ = 0;
  ColumnarUnit unit_texts_;
  std::vector<int32_t> document_;
};

// The training (or validation) source of a dataset name or path: a StreamingLoader when every
// file it names is columnar (Parquet, Arrow, a save_to_disk folder), else open_dataset's
// packed loader (text in memory, or prepared shards).
std::unique_ptr<BatchSource> open_dataset_source(const std::string& name,
                                                 const std::optional<std::string>& path,
                                                 const Tokenizer& tokenizer,
                                                 PackedLoaderOptions options,
                                                 const std::string& key);

}  // namespace loom::data
