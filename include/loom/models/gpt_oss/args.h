// gpt-oss (OpenAI's open-weight mixture of experts): the shared decoder with biases on the
// attention projections, a learned sink logit per head, sliding-window attention on the even
// layers and full attention on the odd ones, rotate-half RoPE with YaRN (factor 32 over 4096
// positions, applied at every length), and in every layer a mixture whose router has a bias and
// whose experts have biases and a clamped SwiGLU. Flavors: debugmodel (CPU-sized, window 8 so
// that short test rows see it), 20B and 120B with the published shapes.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "loom/models/common/decoder_args.h"

namespace loom::models::gpt_oss {

const std::map<std::string, DecoderArgs>& gpt_oss_flavors();

// gpt-oss's routing and experts where a Hugging Face config.json does not say: softmax over the
// chosen experts' logits, router and expert biases, the SwiGLU clamped at 7 with alpha 1.702.
MoEArgs gpt_oss_routing();
// The clamp of gpt-oss's SwiGLU: a constant in transformers' GptOssForCausalLM (it ignores
// config.json's swiglu_limit).
inline constexpr double kGptOssSwigluLimit = 7.0;

// The layer windows gpt-oss alternates: `window` on even layers, full attention on odd ones.
std::vector<int64_t> alternating_windows(int64_t n_layers, int64_t window);

// MXFP4 as gpt-oss's Hugging Face checkpoints store expert weights: `blocks` uint8 [..., G, 16]
// (two FP4 E2M1 codes a byte, the low nibble first) and `scales` uint8 [..., G] (E8M0, 2^(s-127))
// -> float32 [..., 32 G]. Throws InputError naming `name` when the pair is malformed.
at::Tensor dequantize_mxfp4(const at::Tensor& blocks, const at::Tensor& scales,
                            const std::string& name);

}  // namespace loom::models::gpt_oss
