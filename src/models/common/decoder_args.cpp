#include "loom/models/common/decoder_args.h"

#include <cmath>

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

namespace {

// YaRN's attention temperature: 0.1 * m * ln(scale) + 1 beyond the original context.
double yarn_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

void validate_attention_options(const DecoderArgs& args, const std::string& family) {
  if (args.layer_windows.empty() && !args.attention_sinks) return;
  LOOM_CHECK_AS(InputError,
                args.layer_windows.empty() ||
                    static_cast<int64_t>(args.layer_windows.size()) == args.n_layers,
                family, ": layer_windows has ", args.layer_windows.size(), " entries for ",
                args.n_layers, " layers");
  for (int64_t window : args.layer_windows) {
    LOOM_CHECK_AS(InputError, window >= 0, family, ": a sliding window of ", window,
                  " keys (0 means full attention)");
  }
  LOOM_CHECK_AS(InputError, !args.mla, family,
                ": sliding windows and attention sinks are not implemented for latent attention");
}

}  // namespace

double YarnScaling::rotation_scale() const {
  if (attention_factor) return *attention_factor;
  if (mscale > 0 && mscale_all_dim > 0) {
    return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
  }
  return yarn_mscale(factor, 1.0);
}

double YarnScaling::softmax_scale_factor() const {
  if (mscale_all_dim <= 0) return 1.0;
  const double m = yarn_mscale(factor, mscale_all_dim);
  return m * m;
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
  LOOM_CHECK_AS(InputError, num_mtp_layers >= 0 && num_mtp_layers <= 64, family,
                ": num_mtp_layers is ", num_mtp_layers, "; it counts prediction depths, 0 to 64");
  LOOM_CHECK_AS(InputError, num_mtp_layers == 0 || !tie_embeddings, family,
                ": multi-token prediction (num_mtp_layers ", num_mtp_layers,
                ") shares the embedding and the head, which must be two tables (untied) as in "
                "DeepSeek-V3");
  if (mla) {
    LOOM_CHECK_AS(InputError,
                  mla->q_lora_rank >= 0 && mla->kv_lora_rank > 0 && mla->qk_nope_head_dim >= 0 &&
                      mla->v_head_dim > 0 && mla->norm_eps > 0,
                  family,
                  ": MLA kv_lora_rank, v_head_dim and norm_eps must be positive, "
                  "q_lora_rank and qk_nope_head_dim at least 0");
    LOOM_CHECK_AS(InputError, mla->qk_rope_head_dim > 0 && mla->qk_rope_head_dim % 2 == 0, family,
                  ": MLA qk_rope_head_dim (", mla->qk_rope_head_dim,
                  ") must be even and positive for rotary embeddings");
    LOOM_CHECK_AS(InputError, kv_heads() == n_heads && !qk_norm, family,
                  ": latent attention has one key and value per head and no q/k head norms");
  }
  if (yarn) {
    LOOM_CHECK_AS(InputError, !use_scaled_rope, family,
                  ": YaRN and Llama 3.1 RoPE scaling exclude each other");
    LOOM_CHECK_AS(InputError,
                  yarn->factor >= 1.0 && yarn->original_max_position_embeddings > 0 &&
                      yarn->beta_fast > 0 && yarn->beta_slow > 0 && yarn->mscale >= 0 &&
                      yarn->mscale_all_dim >= 0 && yarn->attention_factor.value_or(1.0) > 0,
                  family, ": YaRN factor must be >= 1, its betas and original context positive");
  }
  if (moe) moe->validate(family, n_layers);
  validate_attention_options(*this, family);
}

}  // namespace loom::models
