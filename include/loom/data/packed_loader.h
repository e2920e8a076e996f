// Documents -> tokens with BOS/EOS -> one stream (in memory, or memory-mapped prepared shards:
// token_stream.h, shards.h) -> windows of seq_len + 1 tokens (inputs and
// labels shifted by one) -> a deterministic shuffle per epoch (from the seed) -> batches.
//
// The samples of the whole run are one global sequence (epoch after epoch). Each call takes the
// next dp_world * batch_size samples of it (one global batch) and returns this rank's slice,
// samples [dp_rank * batch_size, (dp_rank + 1) * batch_size). So every layout sees the same
// global batches, ranks never overlap, and together they cover the sequence.
//
// Resume and resharding rule: the state is the number of samples of the global sequence
// consumed so far. Loading it into a loader with any number of data-parallel ranks continues at
// exactly that sample: nothing is seen twice and nothing skipped.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/data/batch_source.h"
#include "loom/data/token_stream.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

struct PackedLoaderOptions {
  int64_t seq_len = 2048;
  uint64_t seed = 0;
  bool shuffle = true;  // validation reads in order
  int64_t dp_rank = 0;
  int64_t dp_world = 1;
  bool skip_bad_records = false;    // training.dataset_on_error = "skip"
  std::string text_field = "text";  // the JSON field of a record's text (dataset_text_field)
  // training.dataset_max_document_mib: the longest document (line or text file) read.
  int64_t max_document_bytes = int64_t{256} << 20;
  int64_t bos_id = -1;  // the tokenizer's BOS: batches carry document boundaries; -1: none
};

class PackedLoader : public BatchSource {
 public:
  PackedLoader(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
               PackedLoaderOptions options);
  // Over an existing stream (prepared shards, or a stream shared by several loaders).
  PackedLoader(std::shared_ptr<const TokenStream> stream, PackedLoaderOptions options);

  Batch next(int64_t batch_size, int64_t seq_len) override;
  std::optional<int64_t> samples_per_epoch() const override { return windows_; }
  nlohmann::json state() const override;
  void load_state(const nlohmann::json& state) override;

  int64_t total_tokens() const { return stream_->size(); }
  int64_t records_skipped() const override { return records_skipped_; }
  void set_records_skipped(int64_t count) { records_skipped_ = count; }
  // Epoch of the next sample of the global sequence.
  int64_t epoch() const { return consumed_ / windows_; }
  int64_t samples_consumed() const { return consumed_; }
  // The seq_len + 1 tokens of sample `index` of the global sequence (any position, any epoch;
  // the mixture source draws from its components this way). Does not move the position.
  void read_sample(int64_t index, int64_t* out);

 private:
  void init();
  // Window index of global sample `index` (epoch index / windows, shuffled within the epoch).
  int64_t window_of(int64_t index);

  PackedLoaderOptions options_;
  std::shared_ptr<const TokenStream> stream_;
  int64_t windows_ = 0;
  int64_t consumed_ = 0;  // samples of the global sequence taken so far (all ranks)
  int64_t records_skipped_ = 0;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;  // window order of cached_epoch_
};

// A dataset by name: "brown" / "brown_validation" (the embedded corpus in assets/), or the
// files at `path` (file, folder or glob of text), or a folder prepared by `loom prepare-data`
// (its index.json; read through mmap and checked against `tokenizer`). Returns the loader.
std::unique_ptr<PackedLoader> open_dataset(const std::string& name,
                                           const std::optional<std::string>& path,
                                           const Tokenizer& tokenizer, PackedLoaderOptions options,
                                           const std::string& key);

// The files of a built-in dataset name, or `path` when set; throws InputError naming `key`.
std::string dataset_location(const std::string& name, const std::optional<std::string>& path,
                             const std::string& key);

}  // namespace loom::data
