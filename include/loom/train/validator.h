// The validation loss: one pass over the validation set (validation.steps = -1) or the first
// `steps` global batches of it, from the start of the set at every evaluation.
//
// Layout independence: a whole-set pass takes ceil(windows / (dp x local_batch_size)) global
// batches, so every rank runs the same number of forwards (FSDP's all-gathers stay matched), and
// the samples past the end of the set (the last batch's remainder) are read but masked: their
// labels become the ignore index. The loss is the sum of token losses over the set divided by its
// token count, both summed over the loss group, so 1, 2 or 3 ranks give the same value.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>

#include "loom/data/batch_source.h"
#include "loom/distributed/comm.h"

namespace loom::train {

struct ValidationOptions {
  int64_t steps = -1;  // global batches per evaluation; -1: the whole (finite) set
  int64_t local_batch_size = 1;
  int64_t seq_len = 1;
  int64_t dp_rank = 0;  // this rank's slice of each global batch (as the source slices it)
  int64_t dp_size = 1;
};

class Validator {
 public:
  // Sum of token losses of a batch (on the CPU), as a device tensor.
  using LossSum = std::function<at::Tensor(const data::Batch& batch)>;

  // Throws InputError when steps = -1 and the source has no end.
  Validator(std::unique_ptr<data::BatchSource> source, ValidationOptions options);

  // Global batches one evaluation reads.
  int64_t batches() const { return batches_; }
  // Samples of the whole set (nullopt for an endless source).
  std::optional<int64_t> set_samples() const { return source_->samples_per_epoch(); }

  // The mean token loss over the evaluation's samples, equal on every rank of `loss_group`.
  // `token_copies`: ranks of the group reading the same rows (context parallelism's cp ranks
  // each score a share of every row, and count all of its tokens).
  double run(const LossSum& loss_sum, distributed::Comm& loss_group, int64_t token_copies = 1);

  // Rows of this rank's slice of global batch `batch` that lie past the end of the set.
  static int64_t masked_rows(int64_t batch, const ValidationOptions& options, int64_t set_samples);

 private:
  std::unique_ptr<data::BatchSource> source_;
  ValidationOptions options_;
  nlohmann::json start_state_;  // the source before its first sample: every run starts here
  int64_t batches_ = 0;
};

}  // namespace loom::train
