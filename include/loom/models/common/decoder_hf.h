// The shared decoder's families and Hugging Face folders: config.json both ways and the state
// dict adapter (names, the RoPE row permutation, tied heads). A family states its dialect
// (model_type, architecture, what transformers' class computes) and gets its HfFormat.
//
// The reader accepts what transformers 4.x and 5.x write and refuses whatever would make loom
// compute something other than transformers' class for the same folder: every key that class
// reads is understood or refused with the value loom needs, and keys of other families that
// change attention or activations (sliding windows, soft-capping, quantization, custom code) are
// refused as well. Keys nobody reads (metadata, generation defaults) are ignored; unfamiliar ones
// are named in one warning.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "loom/models/common/decoder_args.h"
#include "loom/models/model_spec.h"

namespace loom::models {

struct DecoderHfDialect {
  std::string family;        // loom's model.name ("llama3")
  std::string model_type;    // config.json's ("llama")
  std::string architecture;  // config.json's architectures[0] ("LlamaForCausalLM")
  RopeLayout rope_layout = RopeLayout::kInterleaved;  // loom's; transformers rotates halves
  bool qk_norm = false;                               // q_norm / k_norm per head (Qwen3)
  bool head_dim_free = false;  // head_dim may differ from hidden_size / num_attention_heads
  // The config class's defaults for keys a file leaves out (transformers does the same).
  int64_t default_max_positions = 2048;
  double default_rope_theta = 10000.0;
  // The class's rope_scaling when config.json has neither rope_scaling nor rope_parameters
  // (GptOssConfig's YaRN); null: plain RoPE. An explicit null in the file still means none.
  nlohmann::json default_rope_scaling;
  double default_norm_eps = 1e-6;
  std::optional<int64_t> default_head_dim;  // unset: hidden_size / num_attention_heads
  // For a num_key_value_heads left out (null means num_attention_heads in every class); unset:
  // num_attention_heads.
  std::optional<int64_t> default_kv_heads;
  bool default_tie = false;
  // The class reads use_sliding_window, default false (Qwen's): sliding_window is switched off
  // unless use_sliding_window is true. Otherwise only an explicit false switches it off.
  bool window_switch = false;
  // A mixture-of-experts class (Qwen3MoeForCausalLM): the routing settings config.json does not
  // carry (the balancing bias, capacity) come from here, the shapes and top-k from the file.
  std::optional<MoEArgs> moe;
  // A family whose config.json says more than the shared keys (DeepSeek-V3's latent attention
  // and routing): the keys it reads, its reader (after the shared keys, refusing what loom would
  // compute differently) and its writer (after the shared keys; it owns the MoE keys then).
  std::set<std::string> extra_keys;
  // Keys loom's shared reader would refuse (attention_bias, sliding_window, layer_types,
  // quantization_config) that this family's read_extra reads and checks itself (gpt-oss).
  std::set<std::string> own_keys;
  std::function<void(const nlohmann::json&, const std::string&, DecoderArgs&)> read_extra;
  std::function<void(const DecoderArgs&, nlohmann::json&)> write_extra;
  // The tensor under mlp.gate holding the balancing bias ("e_score_correction_bias"); empty:
  // the class has none (an export leaves loom's bias out, with a warning when it is not zero).
  std::string expert_bias_name;
  // The config.json key counting multi-token-prediction layers, stored after the model's layers
  // (DeepSeek-V3's "num_nextn_predict_layers"); empty: the family has none, and loom trains
  // none for it.
  std::string mtp_layers_key;
};

// The decoder arguments of a config.json (`source` names it in errors), in the layout of
// transformers 4 (top-level rope_theta, rope_scaling) or 5 (rope_parameters {rope_type,
// rope_theta, ...}). Throws InputError naming the key and the value loom needs for anything
// loom would compute differently from `dialect`'s transformers class: a rope_type other than
// default and llama3, biases, an activation other than silu, a head_dim loom cannot represent,
// sliding windows, soft-capping, quantization, custom code, or two RoPE descriptions that
// disagree. Other unfamiliar keys get one warning.
DecoderArgs decoder_args_from_hf_config(const nlohmann::json& config, const std::string& source,
                                        const DecoderHfDialect& dialect);

// A key transformers spells more than one way (Qwen3-MoE's num_experts, which transformers 5
// saves as num_local_experts; its attribute_map reads either): the value under whichever
// spelling is set (null counts as unset), or nullptr. Spellings set to different values are an
// InputError naming both, since the two releases would read different models.
const nlohmann::json* hf_spelled(const nlohmann::json& config,
                                 const std::vector<std::string>& spellings,
                                 const std::string& source);

// An integer that changes the arithmetic and has no default loom would guess: the value under
// one of `spellings` in [low, high], or an InputError naming every spelling and
// `class_default` (what transformers' class would assume instead).
int64_t hf_required_int(const nlohmann::json& config, const std::vector<std::string>& spellings,
                        const std::string& source, int64_t low, int64_t high,
                        const std::string& class_default);

// The config.json of an export: `dialect`'s class with the RoPE in both layouts (top-level
// rope_theta and rope_scaling for transformers 4, rope_parameters for 5), saying the same.
nlohmann::json decoder_hf_config(const DecoderArgs& args, const std::string& dtype,
                                 const DecoderHfDialect& dialect);

// loom parameter name (layers.0.attention.wq.weight) <-> HF name (model.layers.0.self_attn.
// q_proj.weight); InputError for a name with no counterpart.
std::string decoder_hf_name(const std::string& loom_name);
std::string decoder_loom_name(const std::string& hf_name);

// The row permutation of a q/k projection [heads * head_dim, dim] from interleaved pairs to
// halves (to_hf = true) or back.
at::Tensor permute_rotary_rows(const at::Tensor& weight, int64_t heads, bool to_hf);

// The HfFormat of a decoder family: `build` makes its model from arguments read off a
// config.json (with the BuildOptions' device, dtype, part, vocab and context overrides).
HfFormat decoder_hf_format(
    const DecoderHfDialect& dialect,
    std::function<std::unique_ptr<CausalLM>(const DecoderArgs&, const BuildOptions&)> build);

}  // namespace loom::models
