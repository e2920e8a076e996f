#include "loom/generate/sampling.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <limits>

#include "loom/core/check.h"

namespace loom::generate {

void SamplingOptions::validate() const {
  LOOM_CHECK_AS(InputError, temperature >= 0, "--temperature must be >= 0 (0: greedy), got ",
                temperature);
  LOOM_CHECK_AS(InputError, top_k >= 0, "--top-k must be >= 0 (0: off), got ", top_k);
  LOOM_CHECK_AS(InputError, top_p > 0 && top_p <= 1, "--top-p must be in (0, 1], got ", top_p);
  LOOM_CHECK_AS(InputError, repetition_penalty > 0, "--repetition-penalty must be > 0, got ",
                repetition_penalty);
}

at::Tensor process_logits(const at::Tensor& logits, const std::vector<int32_t>& sequence,
                          const SamplingOptions& options) {
  at::Tensor out = logits.to(at::kFloat).clone();
  if (options.repetition_penalty != 1.0 && !sequence.empty()) {
    // As transformers: divide positive logits of seen tokens by the penalty, multiply negative.
    std::vector<int64_t> ids(sequence.begin(), sequence.end());
    at::Tensor seen = at::tensor(ids, at::kLong).to(out.device());
    at::Tensor scores = out.index_select(0, seen);
    scores = at::where(scores < 0, scores * options.repetition_penalty,
                       scores / options.repetition_penalty);
    out.index_put_({seen}, scores);
  }
  if (options.greedy()) return out;
  // Shifted by the maximum first (softmax does not change): the largest logit becomes 0 and the
  // rest negative, so a tiny temperature drives them to -inf instead of overflowing to inf - inf.
  out.sub_(out.max()).div_(options.temperature);
  const double inf = std::numeric_limits<double>::infinity();
  if (options.top_k > 0 && options.top_k < out.size(0)) {
    at::Tensor kth = std::get<0>(at::topk(out, options.top_k)).select(0, options.top_k - 1);
    out.masked_fill_(out < kth, -inf);
  }
  if (options.top_p < 1.0) {
    // Keep the smallest set of most likely tokens whose probability reaches top_p (at least one).
    auto [sorted, order] = at::sort(out, /*dim=*/0, /*descending=*/true);
    at::Tensor probs = at::softmax(sorted, 0);
    at::Tensor before = at::cumsum(probs, 0) - probs;  // mass of the strictly more likely tokens
    at::Tensor drop_sorted = before >= options.top_p;
    at::Tensor drop = at::zeros_like(drop_sorted).scatter_(0, order, drop_sorted);
    out.masked_fill_(drop, -inf);
  }
  return out;
}

int32_t sample_token(const at::Tensor& logits, const std::vector<int32_t>& sequence,
                     const SamplingOptions& options, at::Generator& generator) {
  at::Tensor processed = process_logits(logits, sequence, options);
  if (options.greedy()) return static_cast<int32_t>(processed.argmax().item<int64_t>());
  at::Tensor probs = at::softmax(processed.cpu().to(at::kDouble), 0);
  return static_cast<int32_t>(at::multinomial(probs, 1, false, generator).item<int64_t>());
}

at::Generator sequence_generator(uint64_t seed, uint64_t index) {
  // splitmix64 of (seed, index): neighbouring seeds and rows give unrelated streams.
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return at::make_generator<at::CPUGeneratorImpl>(z ^ (z >> 31));
}

}  // namespace loom::generate
