// The qwen3 and qwen3_moe families in the model registry: the shared decoder with Qwen3's flavors
// and init, read and written as transformers' Qwen3ForCausalLM and Qwen3MoeForCausalLM.
#include "loom/models/common/decoder_family.h"
#include "loom/models/qwen3/args.h"

namespace loom::models::qwen3 {

namespace {

DecoderFamily qwen3_family(const std::string& name, const std::string& model_type,
                           const std::string& architecture) {
  DecoderFamily family;
  family.name = name;
  family.init = init_parameter;
  family.hf.family = name;
  family.hf.model_type = model_type;
  family.hf.architecture = architecture;
  family.hf.rope_layout = RopeLayout::kHalves;  // as transformers: no row permutation
  family.hf.qk_norm = true;
  family.hf.head_dim_free = true;
  family.hf.default_max_positions = 32768;  // Qwen3Config's defaults
  family.hf.default_rope_theta = 10000.0;
  family.hf.default_norm_eps = 1e-6;
  family.hf.default_head_dim = 128;
  family.hf.default_kv_heads = 32;
  family.hf.window_switch = true;
  return family;
}

}  // namespace

ModelSpec qwen3_spec() {
  DecoderFamily family = qwen3_family("qwen3", "qwen3", "Qwen3ForCausalLM");
  family.flavors = &qwen3_flavors();
  return decoder_family_spec(family);
}

ModelSpec qwen3_moe_spec() {
  DecoderFamily family = qwen3_family("qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM");
  family.flavors = &qwen3_moe_flavors();
  family.hf.moe = qwen3_moe_routing();
  return decoder_family_spec(family);
}

}  // namespace loom::models::qwen3
