// Documents -> tokens with BOS/EOS -> one stream -> windows of seq_len + 1 tokens (inputs and
// labels shifted by one) -> a deterministic shuffle per epoch (from the seed) -> batches.
// The samples of the whole run are one sequence; the global batch of a step is the next
// global_batch samples of it, whatever the number of data-parallel ranks (each rank takes its
// slice), so runs on different layouts are comparable sample for sample.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/data/batch_source.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

struct PackedLoaderOptions {
  int64_t seq_len = 2048;
  uint64_t seed = 0;
  bool shuffle = true;  // validation reads in order
};

class PackedLoader : public BatchSource {
 public:
  PackedLoader(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
               PackedLoaderOptions options);

  Batch next(int64_t batch_size, int64_t seq_len) override;
  std::optional<int64_t> samples_per_epoch() const override { return windows_; }

  int64_t total_tokens() const { return static_cast<int64_t>(stream_.size()); }
  int64_t epoch() const { return epoch_; }

 private:
  void start_epoch();

  PackedLoaderOptions options_;
  std::vector<int32_t> stream_;
  int64_t windows_ = 0;
  std::vector<int64_t> order_;
  int64_t position_ = 0;
  int64_t epoch_ = -1;
};

// A dataset by name: "brown" / "brown_validation" (the embedded corpus in assets/), or the
// file at `path`. Returns the loader over its documents.
std::unique_ptr<PackedLoader> open_dataset(const std::string& name,
                                           const std::optional<std::string>& path,
                                           const Tokenizer& tokenizer, PackedLoaderOptions options,
                                           const std::string& key);

// The folder of loom's embedded assets: $LOOM_ASSETS_DIR, else the source tree's assets/.
std::string assets_dir();

}  // namespace loom::data
