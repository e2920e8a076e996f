#include "loom/data/synthetic.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "loom/core/check.h"

namespace loom::data {

SyntheticSource::SyntheticSource(int64_t vocab_size, uint64_t seed, int64_t dp_rank,
                                 int64_t dp_world, double follow_probability)
    : vocab_size_(vocab_size),
      dp_rank_(dp_rank),
      dp_world_(dp_world),
      follow_probability_(follow_probability),
      generator_(at::make_generator<at::CPUGeneratorImpl>(seed)),
      seed_(seed) {
  LOOM_CHECK(dp_world >= 1 && dp_rank >= 0 && dp_rank < dp_world, "data-parallel rank ", dp_rank,
             " of ", dp_world);
  successor_ = at::randperm(vocab_size, generator_, at::kLong);
}

Batch SyntheticSource::next(int64_t local_batch_size, int64_t seq_len) {
  const int64_t batch_size = local_batch_size * dp_world_;
  // seq_len + 1 tokens per sample: inputs are the first seq_len, labels the last seq_len.
  // Sample by sample from the stream, so that a global batch is the same samples however ranks
  // and microbatches cut it (a resume on another layout goes on with the same data).
  at::Tensor tokens = at::empty({batch_size, seq_len + 1}, at::kLong);
  at::Tensor draws = at::empty({batch_size, seq_len});
  at::Tensor noise = at::empty({batch_size, seq_len}, at::kLong);
  for (int64_t i = 0; i < batch_size; ++i) {
    tokens[i].narrow(0, 0, 1).random_(0, vocab_size_, generator_);
    draws[i].uniform_(0, 1, generator_);
    noise[i].random_(0, vocab_size_, generator_);
  }
  const at::Tensor follow = draws.lt(follow_probability_);
  for (int64_t t = 0; t < seq_len; ++t) {
    at::Tensor likely = successor_.index_select(0, tokens.select(1, t));
    tokens.select(1, t + 1).copy_(at::where(follow.select(1, t), likely, noise.select(1, t)));
  }
  tokens = tokens.narrow(0, dp_rank_ * local_batch_size, local_batch_size);
  return {tokens.slice(1, 0, seq_len).contiguous(), tokens.slice(1, 1, seq_len + 1).contiguous()};
}

// The generator's full state (a byte tensor) as a list of numbers: resumes the exact stream.
nlohmann::json SyntheticSource::state() const {
  at::Tensor bytes = generator_.get_state();
  const auto* data = bytes.data_ptr<uint8_t>();
  return {{"kind", "synthetic"},
          {"seed", seed_},
          {"vocab_size", vocab_size_},
          {"generator", std::vector<uint8_t>(data, data + bytes.numel())}};
}

void SyntheticSource::load_state(const nlohmann::json& state) {
  try {
    LOOM_CHECK_AS(InputError,
                  state.at("kind") == "synthetic" && state.at("seed").get<uint64_t>() == seed_ &&
                      state.at("vocab_size").get<int64_t>() == vocab_size_,
                  "data-loader state is for another synthetic stream");
    auto bytes = state.at("generator").get<std::vector<uint8_t>>();
    at::Tensor tensor = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::copy(bytes.begin(), bytes.end(), tensor.data_ptr<uint8_t>());
    generator_.set_state(tensor);
  } catch (const nlohmann::json::exception& error) {
    LOOM_THROW(InputError, "malformed synthetic data state: ", error.what());
  }
}

}  // namespace loom::data
