// Qwen3 (dense): the shared decoder with per-head q/k RMSNorm before RoPE, head_dim 128 whatever
// the width, rotate-half RoPE with theta 1e6, norm eps 1e-6, and the token table tied to the head
// on the small sizes (0.6B-4B). Flavors and shapes as torchtitan's qwen3 and Qwen's configs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "loom/models/common/decoder_args.h"

namespace loom::models::qwen3 {

// debugmodel, 0.6B, 1.7B, 4B, 8B, 14B, 32B; vocab_size is a default the tokenizer may replace.
const std::map<std::string, DecoderArgs>& qwen3_flavors();

// Qwen3-MoE (every layer a mixture of softmax-routed experts, top-k gates renormalized): flavors
// debugmodel_moe (CPU-sized), 30B-A3B and 235B-A22B with Qwen's shapes.
const std::map<std::string, DecoderArgs>& qwen3_moe_flavors();
// The routing Qwen3-MoE trains with in loom: softmax scores, norm_topk_prob, and DeepSeek-V3's
// balancing bias with coefficient 1e-3 (torchtitan's default; Hugging Face configs carry none).
MoEArgs qwen3_moe_routing();

// Qwen3's initialization for training from scratch, torchtitan's (common/init.h's
// init_decoder_parameter): depth-scaled output projections, and on the tied flavors the table
// drawn as the head (std dim^-0.5); not Hugging Face's N(0, 0.02) everywhere, which has no depth
// scaling. Weights loaded from a checkpoint or Hugging Face replace it.
void init_parameter(const DecoderArgs& args, const std::string& name, at::Tensor& param,
                    uint64_t seed);

}  // namespace loom::models::qwen3
