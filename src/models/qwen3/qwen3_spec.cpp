// The qwen3 family in the model registry: the shared decoder with Qwen3's flavors, init and
// Hugging Face dialect (Qwen3ForCausalLM).
#include "loom/core/check.h"
#include "loom/models/common/decoder_hf.h"
#include "loom/models/common/decoder_model.h"
#include "loom/models/common/decoder_parallelize.h"
#include "loom/models/model_spec.h"
#include "loom/models/qwen3/args.h"

namespace loom::models::qwen3 {
namespace {

std::unique_ptr<CausalLM> build(const DecoderArgs& flavor_args, const BuildOptions& options) {
  DecoderArgs args = flavor_args;
  if (options.vocab_size > 0) args.vocab_size = options.vocab_size;
  if (options.max_seq_len > 0) args.max_seq_len = options.max_seq_len;
  return std::make_unique<DecoderModel>("qwen3", options.flavor, args, options.tensor_options,
                                        options.part, init_parameter);
}

const DecoderArgs& flavor_args(const std::string& flavor) {
  const auto& flavors = qwen3_flavors();
  auto it = flavors.find(flavor);
  LOOM_CHECK(it != flavors.end(), "unchecked qwen3 flavor ", flavor);
  return it->second;
}

// transformers' Qwen3ForCausalLM (Qwen3Config's defaults for keys a file leaves out).
const DecoderHfDialect& dialect() {
  static const DecoderHfDialect d = [] {
    DecoderHfDialect out;
    out.family = "qwen3";
    out.model_type = "qwen3";
    out.architecture = "Qwen3ForCausalLM";
    out.rope_layout = RopeLayout::kHalves;
    out.qk_norm = true;
    out.head_dim_free = true;
    out.default_max_positions = 32768;
    out.default_rope_theta = 10000.0;
    out.default_norm_eps = 1e-6;
    out.default_head_dim = 128;
    return out;
  }();
  return d;
}

}  // namespace

ModelSpec qwen3_spec() {
  ModelSpec spec;
  spec.name = "qwen3";
  spec.flavors = [] {
    std::vector<std::string> names;
    for (const auto& [name, args] : qwen3_flavors()) names.push_back(name);
    return names;
  };
  spec.build = [](const BuildOptions& options) { return build(flavor_args(options.flavor), options); };
  spec.parallelize = parallelize_decoder;
  spec.check_parallelism = [](const config::JobConfig& config) {
    const auto& flavors = qwen3_flavors();
    auto it = flavors.find(config.model.flavor);
    if (it != flavors.end()) check_decoder_parallelism(it->second, config);
  };
  spec.hf = decoder_hf_format(dialect(), [](const DecoderArgs& args, const BuildOptions& options) {
    return build(args, options);
  });
  return spec;
}

}  // namespace loom::models::qwen3
