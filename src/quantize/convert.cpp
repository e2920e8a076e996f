#include "loom/quantize/convert.h"

#include "loom/distributed/comm.h"

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/quantize/float8.h"
#include "loom/quantize/float8_grouped.h"

namespace loom::quantize {

namespace {

bool is_float8(const std::string& converter) {
  return converter == "float8" || converter == "quantize.linear.float8";
}

constexpr const char* kGroupedFloat8 = "quantize.grouped_mm.float8";

}  // namespace

Float8LinearOptions float8_options(const config::JobConfig& config) {
  const auto& f8 = config.quantize.linear.float8;
  Float8LinearOptions options;
  options.recipe =
      float8_recipe(f8.recipe_name.value_or("tensorwise"), f8.round_scales_to_power_of_2);
  options.emulate = f8.emulate;
  options.fsdp_float8_all_gather = f8.enable_fsdp_float8_all_gather;
  options.precompute_scales = f8.precompute_float8_dynamic_scale_for_fsdp;
  LOOM_CHECK_AS(
      InputError, !options.fsdp_float8_all_gather || weight_cast_serves_backward(options.recipe),
      "quantize.linear.float8.enable_fsdp_float8_all_gather = true needs the tensorwise or "
      "blockwise recipe (recipe_name = '",
      options.recipe.name,
      "' casts the weight per row, differently for the backward's GEMM, so the gathered float8 "
      "weight could not serve it)");
  // As torchtitan: precomputed scales only mean something for the float8 all-gather (and only
  // tensorwise scales are agreed over the shards; blockwise needs no agreement).
  options.precompute_scales = options.precompute_scales && options.fsdp_float8_all_gather &&
                              options.recipe.weight.scaling == Scaling::kTensorwise;
  return options;
}

std::vector<std::string> converter_problems(const config::JobConfig& config) {
  std::vector<std::string> problems;
  for (const auto& name : config.model.converters) {
    if (name == kGroupedFloat8) continue;
    if (is_float8(name)) {
      try {
        float8_options(config);
      } catch (const Error& e) {
        problems.push_back(e.message());
      }
    } else {
      problems.push_back("model.converters: unknown converter '" + name +
                         "' (loom has: float8, quantize.grouped_mm.float8; mx is not "
                         "implemented yet)");
    }
  }
  return problems;
}

namespace {

// Why a linear stays in high precision, or "" to convert it.
std::string skip_reason(const std::string& fqn, const models::LinearImpl& linear,
                        const Float8LinearOptions& options,
                        const std::vector<std::string>& filter_fqns) {
  if (!linear.convertible) return "read directly by its owner";
  if (fqn == "output") return "output layer";
  for (const auto& filter : filter_fqns) {
    if (fqn.find(filter) != std::string::npos) return "filter_fqns '" + filter + "'";
  }
  // Blockwise weights are whole 128 x 128 blocks, and so are their tensor-parallel shards (either
  // dimension may be split), so each rank casts the blocks one rank would.
  const int64_t tp = options.amax_group != nullptr ? options.amax_group->size() : 1;
  const int64_t multiple = options.recipe.weight.scaling == Scaling::kBlockwise ? kBlock * tp : 16;
  if (linear.in_features() % multiple != 0 || linear.out_features() % multiple != 0) {
    return "dims " + std::to_string(linear.in_features()) + "x" +
           std::to_string(linear.out_features()) + " not multiples of " + std::to_string(multiple);
  }
  return "";
}

}  // namespace

Conversion convert_to_float8(torch::nn::Module& root, const Float8LinearOptions& options,
                             const std::vector<std::string>& filter_fqns) {
  Conversion out;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    auto* linear = dynamic_cast<models::LinearImpl*>(item.value().get());
    if (linear == nullptr) continue;
    const std::string reason = skip_reason(item.key(), *linear, options, filter_fqns);
    if (!reason.empty()) {
      out.skipped.push_back(item.key() + " (" + reason + ")");
      continue;
    }
    linear->compute = std::make_shared<Float8LinearCompute>(options);
    out.converted.push_back(item.key());
  }
  return out;
}

namespace {

int64_t apply_float8_linears(const std::vector<std::unique_ptr<models::CausalLM>>& parts,
                             const config::JobConfig& config, bool emulated,
                             distributed::Comm* tp_group, bool weights_resharded,
                             models::ConverterHookList& hooks) {
  Float8LinearOptions options = float8_options(config);
  options.amax_group = tp_group;
  options.cache_weight_casts = !weights_resharded;
  Conversion total;
  for (const auto& part : parts) {
    Conversion c =
        convert_to_float8(part->module(), options, config.quantize.linear.float8.filter_fqns);
    total.converted.insert(total.converted.end(), c.converted.begin(), c.converted.end());
    total.skipped.insert(total.skipped.end(), c.skipped.begin(), c.skipped.end());
  }
  std::vector<std::shared_ptr<models::GatherCodec>> codecs;
  for (const auto& part : parts) {
    for (const auto& [name, codec] : models::linear_gather_codecs(part->module())) {
      codecs.push_back(codec);
    }
  }
  if (auto refresh = float8_scale_refresh(codecs)) hooks.push_back(std::move(refresh));
  auto log = log::get("float8");
  std::string how = Float8LinearCompute(options).describe();
  how += options.cache_weight_casts ? ", weights cast once per optimizer step"
                                    : ", weights cast at each use (FSDP reshards them)";
  if (emulated && !options.emulate) how += ", emulated: this device has no float8 GEMMs";
  log->info("{} linear layers in {} (of {}); high precision: {}", total.converted.size(), how,
            total.converted.size() + total.skipped.size(),
            total.skipped.empty() ? "none" : strings::join(total.skipped, ", "));
  if (total.converted.empty()) {
    log->warn(
        "model.converters = [\"float8\"]: no linear layer here can be converted (all "
        "filtered or not multiples of 16)");
  }
  return static_cast<int64_t>(total.converted.size());
}

int64_t apply_float8_grouped(const std::vector<std::unique_ptr<models::CausalLM>>& parts,
                             const config::JobConfig& config) {
  std::vector<std::string> converted;
  for (const auto& part : parts) {
    auto c = convert_grouped_to_float8(part->module(), config.quantize.grouped_mm.float8.fqns);
    converted.insert(converted.end(), c.begin(), c.end());
  }
  auto log = log::get("float8");
  if (converted.empty()) {
    log->warn(
        "model.converters = [\"{}\"]: no routed experts here match "
        "quantize.grouped_mm.float8.fqns",
        kGroupedFloat8);
    return 0;
  }
  log->info("{} routed-expert modules in {}: {}", converted.size(),
            Float8GroupedCompute().describe(), strings::join(converted, ", "));
  return static_cast<int64_t>(converted.size());
}

}  // namespace

ConverterReport apply_converters(const std::vector<std::unique_ptr<models::CausalLM>>& parts,
                                 const config::JobConfig& config, const at::Device& device,
                                 distributed::Comm* tp_group, bool weights_resharded) {
  ConverterReport report;
  for (const auto& name : config.model.converters) {
    if (name == kGroupedFloat8) {
      report.float8_grouped += apply_float8_grouped(parts, config);
      // Hopper's grouped kernel takes bf16 activations (checked against the definition here,
      // once per device); anywhere else the grouped GEMMs are emulated.
      report.emulated = report.emulated || config.training.mixed_precision_param != "bfloat16" ||
                        !float8_grouped_kernel_trusted(device);
      continue;
    }
    LOOM_CHECK_AS(InputError, is_float8(name), "model.converters: unknown converter '", name, "'");
    const bool emulated = config.quantize.linear.float8.emulate || !hardware_float8(device);
    report.float8_linears +=
        apply_float8_linears(parts, config, emulated, tp_group, weights_resharded, report.hooks);
    report.emulated = report.emulated || emulated;
  }
  if (report.emulated && report.float8_linears + report.float8_grouped > 0) {
    log::get("float8")->warn(
        "float8 is emulated here ({}): the GEMMs dequantize and run in high precision, so the "
        "numerics are float8's but the run is slower than without it; float8 pays only on a "
        "GPU with float8 tensor cores (sm_89 or newer)",
        device.str());
  }
  return report;
}

}  // namespace loom::quantize
