#include "loom/models/llama/init.h"

namespace loom::models::llama {

double output_projection_std(const LlamaArgs& args, int64_t layer_id) {
  return models::output_projection_std(args, layer_id);
}

void init_parameter(const LlamaArgs& args, const std::string& name, at::Tensor& param,
                    uint64_t seed) {
  init_decoder_parameter(args, name, param, seed, "llama3");
}

void init_weights(Transformer& model, uint64_t seed) {
  models::init_weights(model, seed, init_parameter);
}

}  // namespace loom::models::llama
