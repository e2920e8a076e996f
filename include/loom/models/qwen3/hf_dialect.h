// How Qwen3 reads and writes as transformers' Qwen3ForCausalLM (or, with `moe` set by the caller,
// Qwen3MoeForCausalLM): the family's Hugging Face dialect, shared by its ModelSpecs
// (qwen3_spec.cpp) and the config.json fuzzer.
#pragma once

#include <string>

#include "loom/models/common/decoder_hf.h"

namespace loom::models::qwen3 {

inline DecoderHfDialect qwen3_hf_dialect(const std::string& family, const std::string& model_type,
                                         const std::string& architecture) {
  DecoderHfDialect hf;
  hf.family = family;
  hf.model_type = model_type;
  hf.architecture = architecture;
  hf.rope_layout = RopeLayout::kHalves;  // as transformers: no row permutation
  hf.qk_norm = true;
  hf.head_dim_free = true;
  hf.default_max_positions = 32768;  // Qwen3Config's defaults
  hf.default_rope_theta = 10000.0;
  hf.default_norm_eps = 1e-6;
  hf.default_head_dim = 128;
  hf.default_kv_heads = 32;
  hf.window_switch = true;
  return hf;
}

}  // namespace loom::models::qwen3
