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
  // Packed rows' documents (sources that know the tokenizer's BOS): the document index of each
  // input token within its row and its position in that document, both [batch, seq_len] int64.
  // Undefined: each row is one document.
  at::Tensor documents;
  at::Tensor positions;
};

// Fills batch.documents and batch.positions: a document starts at each `bos` token and at the
// row's first token (a window may begin inside a document); positions count from 0 at a start.
void mark_documents(Batch& batch, int64_t bos);

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

// Reads `count` batches from `source` and drops them (a healed replica group's loader catching
// up with the quorum's step). Interruptible: a stop signal (signals.h) ends it within a batch.
// Returns the batches skipped: `count`, or fewer when a signal stopped it.
int64_t skip_batches(BatchSource& source, int64_t count, int64_t batch_size, int64_t seq_len);

}  // namespace loom::data
