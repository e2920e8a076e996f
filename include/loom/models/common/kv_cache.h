// Incremental decoding for the shared decoder: one key/value cache per layer and a forward that
// runs only new tokens against it (generation, `loom generate`). Kept apart from
// TransformerImpl::forward (training), which it mirrors block by block on the same parameters.
//
// A batch holds prompts of different lengths left-padded to a common length: row b's first
// pad[b] slots are padding, never attended to, and its tokens take RoPE positions 0, 1, ...
// from its first real slot on, so every row computes what it would alone.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "loom/models/common/decoder.h"

namespace loom::models {

class KVCache final : public InferenceCache {
 public:
  // Room for `capacity` slots of `batch` rows, in the parameters' dtype and device.
  KVCache(const DecoderArgs& args, int64_t batch, int64_t capacity,
          const at::TensorOptions& options, std::vector<int64_t> padding = {});

  int64_t batch() const override { return batch_; }
  int64_t capacity() const override { return capacity_; }
  int64_t length() const override { return length_; }  // slots filled so far (padding included)
  const std::vector<int64_t>& padding() const { return padding_; }
  bool padded() const { return padded_; }

  // Keeps only these rows (indices into the current batch, in order): finished sequences leave.
  void keep_rows(const std::vector<int64_t>& rows) override;

  // Grouped-query attention: per layer [batch, kv_heads, capacity, head_dim].
  std::vector<at::Tensor> keys, values;
  // Latent attention (MLA) instead: per layer the normed kv latent [batch, capacity,
  // kv_lora_rank] and the rotated shared key [batch, capacity, qk_rope_head_dim].
  std::vector<at::Tensor> latents, rope_keys;

  // Bytes the cache holds per token slot over all layers (both kinds).
  int64_t bytes_per_slot() const;

 private:
  friend at::Tensor forward_cached(TransformerImpl&, const at::Tensor&, KVCache&, bool);
  int64_t batch_, capacity_, length_ = 0;
  std::vector<int64_t> padding_;
  bool padded_ = false;
  at::Tensor padding_tensor_;  // [batch] int64 on the cache's device
};

// tokens [batch, q] fill the next q slots of every row. Returns logits float32 [batch, q, vocab]
// (or [batch, 1, vocab] for the last slot when last_only) and advances the cache by q.
// Throws InputError when the slots exceed the cache or a position the model's max_seq_len.
at::Tensor forward_cached(TransformerImpl& model, const at::Tensor& tokens, KVCache& cache,
                          bool last_only = false);

}  // namespace loom::models
