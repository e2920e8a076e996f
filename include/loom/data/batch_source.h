// Where the trainer gets its token batches: the packed loader over a tokenized corpus, the
// synthetic stream (tests, benchmarks), or a prefetching wrapper around either.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>

namespace loom::data {

struct Batch {
  at::Tensor inputs;  // [batch, seq_len] int64 token ids
  at::Tensor labels;  // [batch, seq_len] int64 next tokens, -100 where nothing is predicted
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // This rank's next `batch_size` samples of `seq_len` tokens, on the CPU.
  virtual Batch next(int64_t batch_size, int64_t seq_len) = 0;
  // Samples in one pass over a finite dataset; nullopt for an endless stream.
  virtual std::optional<int64_t> samples_per_epoch() const { return std::nullopt; }
  // Bad records skipped while reading the dataset (training.dataset_on_error = "skip").
  virtual int64_t records_skipped() const { return 0; }
  // Position for exact resume (what a checkpoint stores); load_state continues from it.
  // Throws loom::InputError when the state does not fit this source.
  virtual nlohmann::json state() const = 0;
  virtual void load_state(const nlohmann::json& state) = 0;
};

}  // namespace loom::data
