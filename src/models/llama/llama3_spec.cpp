// The llama3 family in the model registry: the shared decoder with Llama 3's flavors and init.
#include "loom/core/check.h"
#include "loom/models/common/decoder_hf.h"
#include "loom/models/common/decoder_model.h"
#include "loom/models/common/decoder_parallelize.h"
#include "loom/models/llama/args.h"
#include "loom/models/llama/init.h"
#include "loom/models/model_spec.h"

namespace loom::models::llama {
namespace {

std::unique_ptr<CausalLM> build(const LlamaArgs& flavor_args, const BuildOptions& options) {
  LlamaArgs args = flavor_args;
  if (options.vocab_size > 0) args.vocab_size = options.vocab_size;
  if (options.max_seq_len > 0) args.max_seq_len = options.max_seq_len;
  return std::make_unique<DecoderModel>("llama3", options.flavor, args, options.tensor_options,
                                        options.part, init_parameter);
}

const LlamaArgs& flavor_args(const std::string& flavor) {
  const auto& flavors = llama3_flavors();
  auto it = flavors.find(flavor);
  LOOM_CHECK(it != flavors.end(), "unchecked llama3 flavor ", flavor);
  return it->second;
}

// What transformers' LlamaForCausalLM computes: interleaved RoPE in loom, so q/k rows are
// permuted to the halves layout on the way out.
const DecoderHfDialect& dialect() {
  static const DecoderHfDialect d = [] {
    DecoderHfDialect out;
    out.family = "llama3";
    out.model_type = "llama";
    out.architecture = "LlamaForCausalLM";
    out.rope_layout = RopeLayout::kInterleaved;
    out.qk_norm = false;
    out.head_dim_free = false;
    out.default_max_positions = 2048;
    return out;
  }();
  return d;
}

}  // namespace

ModelSpec llama3_spec() {
  ModelSpec spec;
  spec.name = "llama3";
  spec.flavors = [] {
    std::vector<std::string> names;
    for (const auto& [name, args] : llama3_flavors()) names.push_back(name);
    return names;
  };
  spec.build = [](const BuildOptions& options) { return build(flavor_args(options.flavor), options); };
  spec.parallelize = parallelize_decoder;
  spec.check_parallelism = [](const config::JobConfig& config) {
    const auto& flavors = llama3_flavors();
    auto it = flavors.find(config.model.flavor);
    if (it != flavors.end()) check_decoder_parallelism(it->second, config);
  };
  spec.hf = decoder_hf_format(dialect(), [](const DecoderArgs& args, const BuildOptions& options) {
    return build(args, options);
  });
  return spec;
}

}  // namespace loom::models::llama
