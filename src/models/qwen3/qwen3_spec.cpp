// The qwen3 family in the model registry: the shared decoder with Qwen3's flavors and init, read
// and written as transformers' Qwen3ForCausalLM.
#include "loom/models/common/decoder_family.h"
#include "loom/models/qwen3/args.h"

namespace loom::models::qwen3 {

ModelSpec qwen3_spec() {
  DecoderFamily family;
  family.name = "qwen3";
  family.flavors = &qwen3_flavors();
  family.init = init_parameter;
  family.hf.family = "qwen3";
  family.hf.model_type = "qwen3";
  family.hf.architecture = "Qwen3ForCausalLM";
  family.hf.rope_layout = RopeLayout::kHalves;  // as transformers: no row permutation
  family.hf.qk_norm = true;
  family.hf.head_dim_free = true;
  family.hf.default_max_positions = 32768;  // Qwen3Config's defaults
  family.hf.default_rope_theta = 10000.0;
  family.hf.default_norm_eps = 1e-6;
  family.hf.default_head_dim = 128;
  family.hf.default_kv_heads = 32;
  family.hf.window_switch = true;
  return decoder_family_spec(family);
}

}  // namespace loom::models::qwen3
