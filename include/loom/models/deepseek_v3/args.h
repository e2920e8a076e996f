// DeepSeek-V3: the shared decoder with multi-head latent attention (MLA), its first
// n_dense_layers dense and the rest mixtures of routed SwiGLU experts plus shared ones, sigmoid
// (or softmax) scores with group-limited routing, a routed scaling factor and the
// auxiliary-loss-free expert bias, YaRN RoPE on the rotary part of each head. Flavors with
// torchtitan's shapes: debugmodel (CPU-sized, routed as the 671B is), 16B (DeepSeek-V2-Lite's
// shapes), 236B (DeepSeek-V2's) and 671B (DeepSeek-V3's).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "loom/models/common/decoder_args.h"

namespace loom::models::deepseek_v3 {

const std::map<std::string, DecoderArgs>& deepseek_v3_flavors();

// DeepSeek-V3's routing where a Hugging Face config.json does not say: sigmoid scores, top-2
// group scores, the balancing bias with torchtitan's coefficient 1e-3.
MoEArgs deepseek_v3_routing();

// torchtitan's DeepSeek-V3 initialization (common/init.h's init_decoder_parameter).
void init_parameter(const DecoderArgs& args, const std::string& name, at::Tensor& param,
                    uint64_t seed);

}  // namespace loom::models::deepseek_v3
