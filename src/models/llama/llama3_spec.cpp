// The llama3 family in the model registry: the shared decoder with Llama 3's flavors and init,
// read and written as transformers' LlamaForCausalLM.
#include "loom/models/common/decoder_family.h"
#include "loom/models/llama/args.h"
#include "loom/models/llama/hf_dialect.h"
#include "loom/models/llama/init.h"

namespace loom::models::llama {

ModelSpec llama3_spec() {
  DecoderFamily family;
  family.name = "llama3";
  family.flavors = &llama3_flavors();
  family.init = init_parameter;
  family.hf = llama3_hf_dialect();
  return decoder_family_spec(family);
}

}  // namespace loom::models::llama
