// Choosing the next token from a row of logits, in the order transformers applies its logits
// processors: repetition penalty, temperature, top-k, top-p, then a draw (or argmax when the
// temperature is 0: greedy, deterministic).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace loom::generate {

struct SamplingOptions {
  double temperature = 0.0;         // 0: greedy (argmax)
  int64_t top_k = 0;                // 0: off
  double top_p = 1.0;               // 1: off
  double repetition_penalty = 1.0;  // 1: off; > 1 discourages tokens already in the sequence
  uint64_t seed = 0;
  bool greedy() const { return temperature == 0.0; }
  // Throws InputError naming the flag of an out-of-range value.
  void validate() const;
};

// logits [vocab] float32 (any device), the sequence so far (prompt + generated) for the
// repetition penalty -> the processed logits (float32, same device); -inf where filtered out.
at::Tensor process_logits(const at::Tensor& logits, const std::vector<int32_t>& sequence,
                          const SamplingOptions& options);

// The next token of one sequence; `generator` is that sequence's own CPU generator, so a
// sequence draws the same tokens alone or in any batch.
int32_t sample_token(const at::Tensor& logits, const std::vector<int32_t>& sequence,
                     const SamplingOptions& options, at::Generator& generator);

// The CPU generator of sequence `index` of a run with `seed`.
at::Generator sequence_generator(uint64_t seed, uint64_t index);

}  // namespace loom::generate
