// The llama3 family in the model registry: the shared decoder with Llama 3's flavors and init,
// read and written as transformers' LlamaForCausalLM.
#include "loom/models/common/decoder_family.h"
#include "loom/models/llama/args.h"
#include "loom/models/llama/init.h"

namespace loom::models::llama {

ModelSpec llama3_spec() {
  DecoderFamily family;
  family.name = "llama3";
  family.flavors = &llama3_flavors();
  family.init = init_parameter;
  // loom rotates interleaved pairs, transformers halves: the adapter permutes q/k rows.
  family.hf.family = "llama3";
  family.hf.model_type = "llama";
  family.hf.architecture = "LlamaForCausalLM";
  family.hf.rope_layout = RopeLayout::kInterleaved;
  family.hf.default_max_positions = 2048;  // LlamaConfig's defaults
  family.hf.default_rope_theta = 10000.0;
  family.hf.default_norm_eps = 1e-6;
  return decoder_family_spec(family);
}

}  // namespace loom::models::llama
