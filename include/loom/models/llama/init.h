// Llama 3 initialization, torchtitan's (common/init.h's init_decoder_parameter): embeddings
// N(0, 1); wq, wk, wv, w1 truncated normal with std 0.02; wo, w2, w3 with the depth-scaled std;
// norms 1; output truncated normal with std dim^-0.5 cut at 3 std. Layout-independent.
#pragma once

#include <cstdint>
#include <string>

#include "loom/models/common/init.h"
#include "loom/models/llama/args.h"

namespace loom::models::llama {

void init_weights(Transformer& model, uint64_t seed);

// One parameter, full shape, on its device: the draw init_weights makes for `name`. FSDP draws
// each full parameter with it and keeps its shard.
void init_parameter(const LlamaArgs& args, const std::string& name, at::Tensor& param,
                    uint64_t seed);

}  // namespace loom::models::llama
