#include "loom/models/common/decoder_family.h"

#include "loom/core/check.h"
#include "loom/models/common/decoder_model.h"
#include "loom/models/common/decoder_parallelize.h"

namespace loom::models {

namespace {

void check_mtp_family(const DecoderFamily& family, int64_t depths) {
  LOOM_CHECK_AS(InputError, depths == 0 || !family.hf.mtp_layers_key.empty(),
                "model.num_mtp_layers = ", depths,
                ": multi-token prediction is DeepSeek-V3's (model.name = \"deepseek_v3\"); ",
                family.name, " has no such modules, set it to 0");
}

}  // namespace

ModelSpec decoder_family_spec(const DecoderFamily& family) {
  LOOM_CHECK(family.flavors != nullptr && family.init, "decoder family ", family.name,
             " needs flavors and an init rule");
  // Arguments with the build's vocabulary and context overrides, as a DecoderModel.
  auto build = [family](DecoderArgs args, const BuildOptions& options) {
    if (options.vocab_size > 0) args.vocab_size = options.vocab_size;
    const int64_t trained = options.trained_seq_len > 0 ? options.trained_seq_len
                            : options.max_seq_len > 0   ? options.max_seq_len
                                                        : args.max_seq_len;
    if (options.max_seq_len > 0) args.max_seq_len = options.max_seq_len;
    if (options.num_mtp_layers >= 0) args.num_mtp_layers = options.num_mtp_layers;
    check_mtp_family(family, args.num_mtp_layers);
    // A flavor's YaRN is on when the model trains beyond the original context; resolved here,
    // from the training context, so that a different inference window cannot switch it.
    if (args.yarn && args.yarn->only_beyond_original) {
      if (trained > args.yarn->original_max_position_embeddings) {
        args.yarn->only_beyond_original = false;
      } else {
        args.yarn.reset();
      }
    }
    return std::unique_ptr<CausalLM>(std::make_unique<DecoderModel>(
        family.name, options.flavor, args, options.tensor_options, options.part, family.init));
  };
  auto flavor_args = [family](const std::string& flavor) -> const DecoderArgs* {
    auto it = family.flavors->find(flavor);
    return it == family.flavors->end() ? nullptr : &it->second;
  };
  ModelSpec spec;
  spec.name = family.name;
  spec.flavors = [family] {
    std::vector<std::string> names;
    for (const auto& [name, args] : *family.flavors) names.push_back(name);
    return names;
  };
  spec.build = [build, flavor_args, family](const BuildOptions& options) {
    const DecoderArgs* args = flavor_args(options.flavor);
    LOOM_CHECK(args != nullptr, "unchecked ", family.name, " flavor ", options.flavor);
    return build(*args, options);
  };
  spec.parallelize = parallelize_decoder;
  spec.check_parallelism = [flavor_args, family](const config::JobConfig& config) {
    // An unknown flavor is reported by the model lookup, naming the flavors.
    if (const DecoderArgs* args = flavor_args(config.model.flavor)) {
      // Multi-token prediction's settings, as the trainer's build will check them.
      check_mtp_family(family, config.model.num_mtp_layers);
      DecoderArgs with_depths = *args;
      with_depths.num_mtp_layers = config.model.num_mtp_layers;
      with_depths.validate(family.name);
      check_decoder_parallelism(*args, config);
    }
  };
  spec.after_optimizer_step = [](parallel::ParallelModel& model, const parallel::AfterStep& step) {
    return model.after_optimizer_step ? model.after_optimizer_step(step) : parallel::ModelMetrics{};
  };
  spec.hf = decoder_hf_format(family.hf, build);
  return spec;
}

}  // namespace loom::models
