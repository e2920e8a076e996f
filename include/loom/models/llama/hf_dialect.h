// How Llama 3 reads and writes as transformers' LlamaForCausalLM: the family's Hugging Face
// dialect, shared by its ModelSpec (llama3_spec.cpp) and the config.json fuzzer.
#pragma once

#include "loom/models/common/decoder_hf.h"

namespace loom::models::llama {

inline DecoderHfDialect llama3_hf_dialect() {
  DecoderHfDialect hf;
  hf.family = "llama3";
  hf.model_type = "llama";
  hf.architecture = "LlamaForCausalLM";
  // loom rotates interleaved pairs, transformers halves: the adapter permutes q/k rows.
  hf.rope_layout = RopeLayout::kInterleaved;
  hf.default_max_positions = 2048;  // LlamaConfig's defaults
  hf.default_rope_theta = 10000.0;
  hf.default_norm_eps = 1e-6;
  return hf;
}

}  // namespace loom::models::llama
