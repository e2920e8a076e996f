// Layout-independent initialization, shared by the families: every parameter is drawn from its
// own generator seeded by (seed, name), in full, on the parameter's device. The same seed gives
// the same weights however the model is split, and a rank that holds a shard keeps its slice of
// the full draw. Each family states its own rule per parameter name (llama/init.h, qwen3/init.h).
#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>
#include <functional>
#include <string>

#include "loom/models/common/decoder.h"

namespace loom::models {

// A family's draw for one parameter, full shape, on its device (no grad mode).
using ParameterInit = std::function<void(const DecoderArgs& args, const std::string& name,
                                         at::Tensor& param, uint64_t seed)>;

// Draws every parameter of `model` in place with `init`, then its RoPE table.
void init_weights(Transformer& model, uint64_t seed, const ParameterInit& init);

// The generator of parameter `name` on `device` for the run seed `seed`.
at::Generator parameter_generator(const at::Device& device, uint64_t seed, const std::string& name);

// Fills `tensor` with a normal(mean, std) draw truncated to [low, high], from `generator`.
void trunc_normal_(at::Tensor& tensor, double mean, double std, double low, double high,
                   at::Generator generator);

// The generator seed of one parameter: a hash of the run seed and the parameter's name.
uint64_t parameter_seed(uint64_t seed, const std::string& name);

}  // namespace loom::models
