// The qwen3 and qwen3_moe families in the model registry: the shared decoder with Qwen3's flavors
// and init, read and written as transformers' Qwen3ForCausalLM and Qwen3MoeForCausalLM.
#include "loom/models/common/decoder_family.h"
#include "loom/models/qwen3/args.h"
#include "loom/models/qwen3/hf_dialect.h"

namespace loom::models::qwen3 {

namespace {

DecoderFamily qwen3_family(const std::string& name, const std::string& model_type,
                           const std::string& architecture) {
  DecoderFamily family;
  family.name = name;
  family.init = init_parameter;
  family.hf = qwen3_hf_dialect(name, model_type, architecture);
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
  ModelSpec spec = decoder_family_spec(family);
  spec.also_named = {"qwen3"};  // torchtitan's name for these flavors
  return spec;
}

}  // namespace loom::models::qwen3
