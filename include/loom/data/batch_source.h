// Where the trainer gets its token batches. The real loader (tokenized corpus, packing, sharding,
// resumable state) implements this; so does the synthetic source used before it lands and in
// tests that need data with known structure.
#pragma once

#include <ATen/core/Tensor.h>

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
  // The next `batch_size` samples of `seq_len` tokens, on the CPU.
  virtual Batch next(int64_t batch_size, int64_t seq_len) = 0;
  // Samples in one pass over a finite dataset; nullopt for an endless stream.
  virtual std::optional<int64_t> samples_per_epoch() const { return std::nullopt; }
};

}  // namespace loom::data
