// A tiny Llama for fast model tests.
#pragma once

#include "loom/models/llama/args.h"

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

}  // namespace loom::testing
