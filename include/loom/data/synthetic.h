// A deterministic synthetic token stream with learnable structure: each next token follows a
// fixed random successor table with probability `follow_probability`, else is uniform. A model
// that learns the table drives the loss from ln(vocab) towards the stream's entropy.
#pragma once

#include <ATen/core/Generator.h>

#include "loom/data/batch_source.h"

namespace loom::data {

class SyntheticSource : public BatchSource {
 public:
  // Data parallelism: each call draws the global batch (batch_size x dp_world rows, sample by
  // sample) and keeps rows [dp_rank x batch_size, (dp_rank + 1) x batch_size), so every layout
  // (ranks, microbatches) sees one stream of samples, and its state resumes on any other.
  SyntheticSource(int64_t vocab_size, uint64_t seed, int64_t dp_rank = 0, int64_t dp_world = 1,
                  double follow_probability = 0.9);
  Batch next(int64_t batch_size, int64_t seq_len) override;
  nlohmann::json state() const override;
  void load_state(const nlohmann::json& state) override;

 private:
  int64_t vocab_size_;
  int64_t dp_rank_;
  int64_t dp_world_;
  double follow_probability_;
  at::Tensor successor_;  // [vocab] the likely next token of each token
  at::Generator generator_;
  uint64_t seed_;
};

}  // namespace loom::data
