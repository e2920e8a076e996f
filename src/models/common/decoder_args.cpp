#include "loom/models/common/decoder_args.h"

#include "loom/core/check.h"

namespace loom::models {

int64_t ffn_hidden_dim(int64_t dim, int64_t multiple_of, std::optional<double> multiplier) {
  int64_t hidden = 2 * (4 * dim) / 3;
  if (multiplier) {
    hidden = static_cast<int64_t>(*multiplier * static_cast<double>(hidden));
  }
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

int64_t DecoderArgs::ffn_hidden_dim() const {
  return hidden_dim ? *hidden_dim : models::ffn_hidden_dim(dim, multiple_of, ffn_dim_multiplier);
}

void DecoderArgs::validate(const std::string& family) const {
  LOOM_CHECK_AS(InputError, dim > 0 && n_layers > 0 && n_heads > 0 && vocab_size > 0, family,
                ": dim, n_layers, n_heads and vocab_size must be positive");
  LOOM_CHECK_AS(InputError, head_dim_override || dim % n_heads == 0, family, ": dim (", dim,
                ") must be divisible by n_heads (", n_heads, ")");
  LOOM_CHECK_AS(InputError, head_dim() > 0 && head_dim() % 2 == 0, family, ": head_dim (",
                head_dim(), ") must be even for rotary embeddings");
  LOOM_CHECK_AS(InputError, kv_heads() > 0 && n_heads % kv_heads() == 0, family, ": n_heads (",
                n_heads, ") must be a multiple of n_kv_heads (", kv_heads(), ")");
  LOOM_CHECK_AS(InputError, hidden_dim ? *hidden_dim > 0 : multiple_of > 0, family,
                ": the feed-forward size (hidden_dim, or multiple_of) must be positive");
  LOOM_CHECK_AS(InputError, norm_eps > 0 && rope_theta > 0 && max_seq_len > 0, family,
                ": norm_eps, rope_theta and max_seq_len must be positive");
  if (moe) moe->validate(family, n_layers);
}

}  // namespace loom::models
