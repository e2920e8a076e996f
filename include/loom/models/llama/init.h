// Llama 3 initialization (as torchtitan): embeddings N(0, 1); wq, wk, wv, w1 truncated normal
// with std 0.02; wo, w2, w3 with the depth-scaled std; norms 1; output truncated normal with std
// dim^-0.5 cut at 3 std.
//
// Layout-independent: every parameter is drawn from its own generator seeded by (seed, name),
// in full, on the parameter's device. The same seed gives the same weights however the model is
// split, and a rank that holds a shard keeps its slice of the full draw.
#pragma once

#include <cstdint>
#include <string>

#include "loom/models/llama/transformer.h"

namespace loom::models::llama {

void init_weights(Transformer& model, uint64_t seed);

// One parameter, full shape, on its device: the draw init_weights makes for `name`. FSDP draws
// each full parameter with it and keeps its shard.
void init_parameter(const LlamaArgs& args, const std::string& name, at::Tensor& param,
                    uint64_t seed);

// Fills `tensor` with a normal(mean, std) draw truncated to [low, high], from `generator`.
void trunc_normal_(at::Tensor& tensor, double mean, double std, double low, double high,
                   at::Generator generator);

// The std of block `layer_id`'s output projections.
double output_projection_std(const LlamaArgs& args, int64_t layer_id);

// The generator seed of one parameter: a hash of the run seed and the parameter's name.
uint64_t parameter_seed(uint64_t seed, const std::string& name);

}  // namespace loom::models::llama
