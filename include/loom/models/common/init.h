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

// torchtitan's decoder initialization, the rule of every family loom trains from scratch
// (Llama 3, Qwen3, DeepSeek-V3, their MoE layers): the token table N(0, 1); input projections
// (wq, wk, wv, latent attention's wq_a, wq_b, wkv_a, wkv_b, and w1 of the dense, shared and
// routed experts) truncated normal with std 0.02; output projections (wo, w2), w3 and the router
// with block i's std 0.02 / sqrt(2 (i + 1)) (0.02 / sqrt(2 n_layers) without depth_init); norms 1;
// the head truncated normal with std dim^-0.5 cut at 3 std. A table tied to the head is drawn as
// the head (N(0, 1) rows would start the logits at std sqrt(dim)). A parameter with no rule is an
// internal error naming `family`.
void init_decoder_parameter(const DecoderArgs& args, const std::string& name, at::Tensor& param,
                            uint64_t seed, const std::string& family);

// Fills `tensor` with a normal(mean, std) draw truncated to [low, high], from `generator`.
void trunc_normal_(at::Tensor& tensor, double mean, double std, double low, double high,
                   at::Generator generator);

// The generator seed of one parameter: a hash of the run seed and the parameter's name.
uint64_t parameter_seed(uint64_t seed, const std::string& name);

}  // namespace loom::models
