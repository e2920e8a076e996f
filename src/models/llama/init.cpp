#include "loom/models/llama/init.h"

namespace loom::models::llama {

void init_parameter(const LlamaArgs& args, const std::string& name, at::Tensor& param,
                    uint64_t seed) {
  init_decoder_parameter(args, name, param, seed, "llama3");
}

void init_weights(Transformer& model, uint64_t seed) {
  models::init_weights(model, seed, init_parameter);
}

}  // namespace loom::models::llama
