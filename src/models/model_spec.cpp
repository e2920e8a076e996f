#include "loom/models/model_spec.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <sstream>

#include "loom/core/check.h"
#include "loom/core/strings.h"

namespace loom::models {

namespace llama {
ModelSpec llama3_spec();
}
namespace deepseek_v3 {
ModelSpec deepseek_v3_spec();
}
namespace qwen3 {
ModelSpec qwen3_spec();
ModelSpec qwen3_moe_spec();
}  // namespace qwen3
namespace gpt_oss {
ModelSpec gpt_oss_spec();
}

namespace {

const std::vector<ModelSpec>& registry() {
  static const std::vector<ModelSpec> specs = {llama::llama3_spec(), qwen3::qwen3_spec(),
                                               qwen3::qwen3_moe_spec(),
                                               deepseek_v3::deepseek_v3_spec(),
                                               gpt_oss::gpt_oss_spec()};
  return specs;
}

std::string human_count(double value) {
  char buffer[32];
  const char* suffixes[] = {"", "K", "M", "B", "T"};
  int index = 0;
  while (value >= 1000.0 && index < 4) {
    value /= 1000.0;
    ++index;
  }
  std::snprintf(buffer, sizeof(buffer), "%.2f%s", value, suffixes[index]);
  return buffer;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& spec : registry()) names.push_back(spec.name);
  return names;
}

const ModelSpec& find_model_spec(const std::string& name) {
  for (const auto& spec : registry()) {
    if (spec.name == name) return spec;
  }
  LOOM_THROW(InputError, "model.name: unknown model '", name,
             "' (known: ", strings::join(model_names(), ", "), ")");
}

namespace {

bool has_flavor(const ModelSpec& spec, const std::string& flavor) {
  for (const auto& known : spec.flavors()) {
    if (known == flavor) return true;
  }
  return false;
}

bool answers_to(const ModelSpec& spec, const std::string& name) {
  if (spec.name == name) return true;
  for (const auto& alias : spec.also_named) {
    if (alias == name) return true;
  }
  return false;
}

// Every flavor found under `name`: its own family's first, then those of families also named so.
std::vector<std::string> flavors_under(const std::string& name) {
  std::vector<std::string> flavors;
  for (const auto& spec : registry()) {
    if (spec.name == name) flavors = spec.flavors();
  }
  for (const auto& spec : registry()) {
    if (spec.name == name || !answers_to(spec, name)) continue;
    for (const auto& flavor : spec.flavors()) flavors.push_back(flavor);
  }
  return flavors;
}

[[noreturn]] void unknown_flavor(const std::string& name, const std::string& flavor) {
  for (const auto& spec : registry()) {
    if (has_flavor(spec, flavor)) {
      LOOM_THROW(InputError, "model.flavor: '", flavor, "' is not a ", name, " flavor; it is a ",
                 spec.name, " flavor (set model.name = \"", spec.name, "\")");
    }
  }
  const auto flavors = flavors_under(name);
  auto match = strings::closest_match(flavor, flavors);
  LOOM_THROW(InputError, "model.flavor: unknown ", name, " flavor '", flavor, "'",
             match ? " (did you mean '" + *match + "'?)" : std::string(),
             "; known: ", strings::join(flavors, ", "));
}

}  // namespace

void check_flavor(const ModelSpec& spec, const std::string& flavor) {
  if (!has_flavor(spec, flavor)) unknown_flavor(spec.name, flavor);
}

const ModelSpec& find_model_spec(const std::string& name, const std::string& flavor) {
  const ModelSpec& own = find_model_spec(name);
  if (has_flavor(own, flavor)) return own;
  for (const auto& spec : registry()) {
    if (answers_to(spec, name) && has_flavor(spec, flavor)) return spec;
  }
  unknown_flavor(name, flavor);
}

const ModelSpec& job_model_spec(const config::JobConfig& config) {
  return find_model_spec(config.model.name, config.model.flavor);
}

std::unique_ptr<CausalLM> build_model(const config::JobConfig& config, int64_t vocab_size,
                                      const at::TensorOptions& options, ModelPart part) {
  const ModelSpec& spec = job_model_spec(config);
  BuildOptions build;
  build.flavor = config.model.flavor;
  build.vocab_size = vocab_size;
  build.max_seq_len = config.training.seq_len;
  build.tensor_options = options;
  build.part = part;
  build.num_mtp_layers = config.model.num_mtp_layers;
  return spec.build(build);
}

int64_t count_layers(const config::JobConfig& config) {
  auto model = build_model(config, 0, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
  int64_t layers = 0;
  for (const auto& name : model->hookable_modules()) layers += name.rfind("layers.", 0) == 0;
  // Multi-token-prediction blocks sit with the head: the pipeline splits the model's layers.
  return layers - config.model.num_mtp_layers;
}

parallel::pipeline::PipelinePlan plan_pipeline(const config::JobConfig& config,
                                               const config::Provenance& provenance) {
  const ModelSpec& spec = job_model_spec(config);
  if (spec.plan_pipeline) return spec.plan_pipeline(config, provenance);
  return parallel::pipeline::plan_pipeline(config, count_layers(config), provenance);
}

const ModelSpec& find_hf_model_spec(const nlohmann::json& config, const std::string& source) {
  std::vector<std::string> known;
  for (const auto& spec : registry()) {
    for (const auto& type : spec.hf.model_types) known.push_back("\"" + type + "\"");
  }
  LOOM_CHECK_AS(
      InputError,
      config.is_object() && config.contains("model_type") && config.at("model_type").is_string(),
      source, ": model_type is missing or not a string; loom reads ", strings::join(known, ", "));
  const std::string type = config.at("model_type").get<std::string>();
  for (const auto& spec : registry()) {
    for (const auto& t : spec.hf.model_types) {
      if (t == type) return spec;
    }
  }
  LOOM_THROW(InputError, source, ": model_type \"", type, "\" is not a family loom implements (",
             strings::join(known, ", "), ")");
}

std::string format_summary(const ModelSummary& s, bool with_shapes) {
  std::ostringstream out;
  char flops[64];
  std::snprintf(flops, sizeof(flops), "%.4g", s.flops_per_token);
  out << s.family << " " << s.flavor << ": " << s.description << "\n"
      << "  parameters: " << s.total_params << " ("
      << human_count(static_cast<double>(s.total_params)) << "), embedding " << s.embedding_params
      << ", non-embedding " << (s.total_params - s.embedding_params) << ", active per token "
      << s.active_params << " (" << human_count(static_cast<double>(s.active_params)) << "; "
      << human_count(static_cast<double>(s.active_params + s.embedding_params))
      << " counting the token table)\n"
      << "  training FLOPs per token at seq_len " << s.seq_len << ": " << flops << " ("
      << human_count(s.flops_per_token) << ")\n";
  if (with_shapes) {
    out << "  parameter shapes:\n";
    for (const auto& p : s.parameters) {
      std::vector<std::string> dims;
      for (auto d : p.shape) dims.push_back(std::to_string(d));
      out << "    " << p.name << " [" << strings::join(dims, ", ") << "]\n";
    }
  }
  return out.str();
}

}  // namespace loom::models
