// A tiny Llama for fast model tests.
#pragma once

#include <memory>

#include "loom/models/common/decoder_model.h"
#include "loom/models/llama/args.h"
#include "loom/models/llama/init.h"

namespace loom::testing {

inline models::llama::LlamaArgs tiny_llama_args() {
  models::llama::LlamaArgs args;
  args.dim = 64;
  args.n_layers = 2;
  args.n_heads = 4;
  args.n_kv_heads = 2;
  args.vocab_size = 97;
  args.multiple_of = 32;
  args.max_seq_len = 32;
  return args;
}

// A whole decoder as the llama3 family builds it (a CausalLM), drawn with `seed` on `options`'
// device, with its RoPE table ready.
inline std::unique_ptr<models::DecoderModel> decoder_lm(const models::DecoderArgs& args,
                                                        uint64_t seed,
                                                        const at::TensorOptions& options = {}) {
  auto model = std::make_unique<models::DecoderModel>("llama3", "test", args, options,
                                                      models::ModelPart{},
                                                      models::llama::init_parameter);
  model->init_weights(seed);
  return model;
}

}  // namespace loom::testing
