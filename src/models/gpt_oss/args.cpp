#include "loom/models/gpt_oss/args.h"

#include <ATen/ATen.h>

#include "loom/core/check.h"

namespace loom::models::gpt_oss {
namespace {

struct Shape {
  int64_t dim, n_layers, n_heads, n_kv_heads, head_dim, experts, top_k, expert_hidden, vocab;
  int64_t window;
};

DecoderArgs args_of(const Shape& s) {
  DecoderArgs args;
  args.dim = s.dim;
  args.n_layers = s.n_layers;
  args.n_heads = s.n_heads;
  args.n_kv_heads = s.n_kv_heads;
  args.head_dim_override = s.head_dim;
  args.vocab_size = s.vocab;
  args.hidden_dim = s.expert_hidden;  // unused: every layer is a mixture
  args.max_seq_len = 131072;
  args.norm_eps = 1e-5;
  args.rope_theta = 150000.0;
  args.use_scaled_rope = false;
  args.rope_layout = RopeLayout::kHalves;
  args.depth_init = true;
  // YaRN as gpt-oss ships it: factor 32 over 4096 positions, ramp ends not rounded, rotations
  // of magnitude 0.1 ln 32 + 1; applied at every length, as transformers does.
  YarnScaling yarn;
  yarn.factor = 32.0;
  yarn.original_max_position_embeddings = 4096;
  yarn.beta_fast = 32.0;
  yarn.beta_slow = 1.0;
  yarn.truncate = false;
  args.yarn = yarn;
  args.attention_bias = true;
  args.attention_sinks = true;
  args.layer_windows = alternating_windows(s.n_layers, s.window);
  MoEArgs moe = gpt_oss_routing();
  moe.num_experts = s.experts;
  moe.top_k = s.top_k;
  moe.hidden_dim = s.expert_hidden;
  args.moe = moe;
  return args;
}

}  // namespace

MoEArgs gpt_oss_routing() {
  MoEArgs moe;
  // Softmax over every expert renormalized over the chosen k: the softmax of their logits.
  moe.score_function = ScoreFunction::kSoftmax;
  moe.route_norm = true;
  moe.router_bias = true;
  moe.expert_biases = true;
  moe.swiglu_limit = kGptOssSwigluLimit;
  moe.swiglu_alpha = 1.702;
  return moe;
}

std::vector<int64_t> alternating_windows(int64_t n_layers, int64_t window) {
  std::vector<int64_t> windows;
  for (int64_t i = 0; i < n_layers; ++i) windows.push_back(i % 2 == 0 ? window : 0);
  return windows;
}

const std::map<std::string, DecoderArgs>& gpt_oss_flavors() {
  static const std::map<std::string, DecoderArgs> flavors = {
      // CPU-sized; the window of 8 keys reaches short rows.
      {"debugmodel", args_of({256, 4, 8, 2, 32, 8, 2, 256, 2048, 8})},
      // The published shapes (openai/gpt-oss-20b, -120b): o200k_harmony's 201088 ids.
      {"20B", args_of({2880, 24, 64, 8, 64, 32, 4, 2880, 201088, 128})},
      {"120B", args_of({2880, 36, 64, 8, 64, 128, 4, 2880, 201088, 128})},
  };
  return flavors;
}

at::Tensor dequantize_mxfp4(const at::Tensor& blocks, const at::Tensor& scales,
                            const std::string& name) {
  LOOM_CHECK_AS(InputError, blocks.scalar_type() == at::kByte && scales.scalar_type() == at::kByte,
                name, ": MXFP4 blocks and scales are uint8, found ", blocks.scalar_type(), " and ",
                scales.scalar_type());
  LOOM_CHECK_AS(InputError,
                blocks.dim() >= 2 && blocks.size(-1) == 16 &&
                    scales.sizes() == blocks.sizes().slice(0, blocks.dim() - 1),
                name, ": MXFP4 blocks must be [..., G, 16] with scales [..., G], found blocks ",
                blocks.sizes(), " and scales ", scales.sizes());
  // FP4 E2M1: sign, two exponent bits, one mantissa bit.
  static const float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const at::Tensor table = at::from_blob(const_cast<float*>(kValues), {16}, at::kFloat).clone();
  const at::Tensor bytes = blocks.to(at::kLong);
  const at::Tensor low = table.index_select(0, at::bitwise_and(bytes, 15).flatten());
  const at::Tensor high = table.index_select(0, at::bitwise_right_shift(bytes, 4).flatten());
  std::vector<int64_t> shape = blocks.sizes().vec();
  shape.back() = 32;
  const at::Tensor values = at::stack({low, high}, -1).view(shape);  // low nibble first
  const at::Tensor scale = at::exp2(scales.to(at::kFloat) - 127.0).unsqueeze(-1);
  std::vector<int64_t> flat(shape.begin(), shape.end() - 2);
  flat.push_back(shape[shape.size() - 2] * 32);
  return (values * scale).reshape(flat);
}

}  // namespace loom::models::gpt_oss
