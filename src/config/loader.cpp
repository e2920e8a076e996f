#include "loom/config/loader.h"

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "loom/config/schema.h"
#include "loom/config/validate.h"
#include "loom/core/files.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "value_parsing.h"

namespace loom::config {
namespace {

// Keys of older torchtitan releases, and where v0.2 (and loom) moved them.
const std::map<std::string, std::string>& renamed_keys() {
  static const std::map<std::string, std::string> renamed = {
      {"training.batch_size", "training.local_batch_size"},
      {"training.compile", "compile.enable"},
      {"training.seed", "debug.seed"},
      {"training.deterministic", "debug.deterministic"},
      {"training.tensor_parallel_degree", "parallelism.tensor_parallel_degree"},
      {"training.data_parallel_shard_degree", "parallelism.data_parallel_shard_degree"},
      {"training.data_parallel_replicate_degree", "parallelism.data_parallel_replicate_degree"},
      {"checkpoint.enable_checkpoint", "checkpoint.enable"},
      {"checkpoint.model_weights_only", "checkpoint.last_save_model_only"},
      {"lr_scheduler.lr_min", "lr_scheduler.min_lr_factor"},
      {"job.print_args", "job.print_config"},
      {"float8", "quantize.linear.float8"},
      {"mx", "quantize.linear.mx"},
  };
  return renamed;
}

// Builds "did you mean" text for an unknown key inside `section` (or at the top level).
std::string suggest_key(const Schema& schema, const std::string& section, const std::string& key) {
  auto renamed = renamed_keys().find(section.empty() ? key : section + "." + key);
  if (renamed != renamed_keys().end()) {
    return " (renamed in torchtitan v0.2: use " + renamed->second + ")";
  }
  std::vector<std::string> candidates =
      section.empty() ? schema.section_names() : schema.keys_of(section);
  for (const auto& name : schema.section_names()) {
    // Sub-sections ("quantize.linear") are keys of their parent too.
    if (!section.empty() && name.rfind(section + ".", 0) == 0) {
      candidates.push_back(name.substr(section.size() + 1));
    }
  }
  if (auto match = strings::closest_match(key, candidates)) {
    return " (did you mean '" + *match + "'?)";
  }
  // The same key name in another section (torchtitan moved some, e.g. training.seed -> debug.seed).
  for (const auto& field : schema.fields()) {
    if (field.key == key) {
      return " (did you mean '" + field.name() + "'?)";
    }
  }
  return "";
}

// Applies parsed documents (TOML or JSON) to a config, one key at a time.
class DocumentApplier {
 public:
  DocumentApplier(const Schema& schema, LoadedConfig& out, Diagnostics& diagnostics)
      : schema_(schema), out_(out), diagnostics_(diagnostics) {}

  void apply_toml(const std::string& text, const std::string& source) {
    toml::table root;
    try {
      root = toml::parse(text, source);
    } catch (const toml::parse_error& error) {
      diagnostics_.add({source, static_cast<int>(error.source().begin.line),
                        static_cast<int>(error.source().begin.column)},
                       "", "TOML syntax error: " + std::string(error.description()));
      return;
    }
    walk_toml(root, "", source);
  }

  void apply_json(const std::string& text, const std::string& source) {
    nlohmann::json root;
    try {
      root = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& error) {  // parse_error, or out_of_range (1e999)
      // nlohmann's message already says "at line L, column C".
      std::string what = error.what();
      auto pos = what.find("parse error");
      diagnostics_.add(
          {source}, "",
          "JSON syntax error: " + (pos == std::string::npos ? what : what.substr(pos)));
      return;
    }
    try {
      json::parse_strict(text, source);  // a key twice, or nesting too deep
    } catch (const InputError& error) {
      diagnostics_.add({source}, "", error.message());
      return;
    }
    if (!root.is_object()) {
      diagnostics_.add({source}, "", "expected a JSON object with one object per section");
      return;
    }
    walk_json(root, "", source);
  }

 private:
  void set(const FieldSpec& field, const detail::ParseResult& parsed, const Origin& origin) {
    if (auto failure = std::get_if<detail::ParseFailure>(&parsed)) {
      diagnostics_.add(origin, field.name(), failure->message);
      return;
    }
    field.write(out_.config, std::get<Value>(parsed));
    out_.provenance[field.name()] = origin;
    if (!field.implemented &&
        std::find(out_.unimplemented_keys.begin(), out_.unimplemented_keys.end(), field.name()) ==
            out_.unimplemented_keys.end()) {
      out_.unimplemented_keys.push_back(field.name());
    }
  }

  void unknown(const std::string& section, const std::string& key, const Origin& origin) {
    if (section.empty()) {
      diagnostics_.add(origin, key,
                       "unknown section [" + key + "]" + suggest_key(schema_, "", key));
    } else {
      diagnostics_.add(
          origin, section + "." + key,
          "unknown key '" + key + "' in [" + section + "]" + suggest_key(schema_, section, key));
    }
  }

  void walk_toml(const toml::table& table, const std::string& section, const std::string& source) {
    for (auto&& [toml_key, node] : table) {
      std::string key(toml_key.str());
      Origin origin{source, static_cast<int>(toml_key.source().begin.line),
                    static_cast<int>(toml_key.source().begin.column)};
      std::string dotted = section.empty() ? key : section + "." + key;
      if (schema_.find_section(dotted)) {
        if (const toml::table* sub = node.as_table()) {
          walk_toml(*sub, dotted, source);
        } else {
          diagnostics_.add(origin, dotted, "expected a table [" + dotted + "], got a value");
        }
      } else if (const FieldSpec* field = section.empty() ? nullptr : schema_.find(section, key)) {
        set(*field, detail::from_toml(*field, node), origin);
      } else {
        unknown(section, key, origin);
      }
    }
  }

  void walk_json(const nlohmann::json& object, const std::string& section,
                 const std::string& source) {
    for (auto it = object.begin(); it != object.end(); ++it) {
      const std::string& key = it.key();
      std::string dotted = section.empty() ? key : section + "." + key;
      Origin origin{source};
      if (schema_.find_section(dotted)) {
        if (it.value().is_object()) {
          walk_json(it.value(), dotted, source);
        } else {
          diagnostics_.add(origin, dotted, "expected an object for section '" + dotted + "'");
        }
      } else if (const FieldSpec* field = section.empty() ? nullptr : schema_.find(section, key)) {
        set(*field, detail::from_json(*field, it.value()), origin);
      } else {
        unknown(section, key, origin);
      }
    }
  }

  const Schema& schema_;
  LoadedConfig& out_;
  Diagnostics& diagnostics_;

 public:
  void set_from_cli(const FieldSpec& field, const detail::ParseResult& parsed) {
    set(field, parsed, Origin{"command line"});
  }
};

void apply_overrides(const Schema& schema, const std::vector<Override>& overrides,
                     LoadedConfig& out, Diagnostics& diagnostics) {
  DocumentApplier applier(schema, out, diagnostics);
  std::vector<std::string> all_names;
  for (const auto& field : schema.fields()) {
    all_names.push_back(field.name());
  }
  for (const auto& override_ : overrides) {
    const FieldSpec* field = schema.find(override_.key);
    if (!field) {
      std::string hint;
      if (auto match = strings::closest_match(override_.key, all_names)) {
        hint = " (did you mean --" + *match + "?)";
      }
      diagnostics.add({"command line"}, override_.key, "unknown option --" + override_.key + hint);
      continue;
    }
    if (!override_.value) {
      if (field->kind != ValueKind::Bool) {
        diagnostics.add({"command line"}, field->name(),
                        "--" + field->name() + " needs a value (" + describe(field->kind) + ")");
        continue;
      }
      applier.set_from_cli(*field, Value(true));
      continue;
    }
    applier.set_from_cli(*field, detail::from_cli(*field, *override_.value));
  }
}

std::string read_file(const std::string& path) {
  // A folder, FIFO or device is refused before it is opened (a FIFO would block forever).
  return files::read_file(path, "config file", 64u << 20);
}

// Keys the user set to something other than their default that the job's other values leave
// without effect (a value the user set and loom then ignores silently would look like it changed
// the arithmetic). Not the sections torchtitan's configs carry switched off as a matter of course
// ([checkpoint] with enable = false, selective_ac_option beside mode = "full"): that would be a
// warning on every such file.
std::vector<std::string> inert_keys(const JobConfig& c, const Provenance& provenance) {
  static const JobConfig defaults;
  std::vector<std::string> out;
  auto inert_unless = [&](bool applies, std::initializer_list<const char*> keys, const char* why) {
    if (applies) return;
    for (const char* key : keys) {
      const FieldSpec* field = job_config_schema().find(key);
      const bool changed = field == nullptr || field->read(c) != field->read(defaults);
      if (provenance.count(key) && changed) out.push_back(std::string(key) + " (" + why + ")");
    }
  };
  inert_unless(c.model.num_mtp_layers > 0,
               {"model.mtp_scale", "model.mtp_scale_switch_step", "model.mtp_scale_after_switch"},
               "model.num_mtp_layers = 0: no multi-token prediction module");
  inert_unless(c.optimizer.name == "Muon",
               {"optimizer.muon_momentum", "optimizer.muon_nesterov", "optimizer.muon_ns_steps",
                "optimizer.muon_ns_dtype", "optimizer.muon_eps", "optimizer.muon_adjust_lr_fn"},
               "optimizer.name is not Muon");
  inert_unless(c.optimizer.qk_clip_threshold > 0, {"optimizer.qk_clip_alpha"},
               "optimizer.qk_clip_threshold = 0: no QK-clip");
  auto converts = [&](std::initializer_list<const char*> names) {
    for (const auto& converter : c.model.converters) {
      for (const char* name : names) {
        if (converter == name) return true;
      }
    }
    return false;
  };
  inert_unless(
      converts({"float8", "quantize.linear.float8"}),
      {"quantize.linear.float8.recipe_name", "quantize.linear.float8.filter_fqns",
       "quantize.linear.float8.emulate", "quantize.linear.float8.round_scales_to_power_of_2",
       "quantize.linear.float8.enable_fsdp_float8_all_gather",
       "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp"},
      "model.converters does not name float8: no linear is converted");
  inert_unless(converts({"quantize.grouped_mm.float8"}), {"quantize.grouped_mm.float8.fqns"},
               "model.converters does not name quantize.grouped_mm.float8");
  inert_unless(!c.lr_scheduler.decay_ratio || *c.lr_scheduler.decay_ratio > 0,
               {"lr_scheduler.decay_type", "lr_scheduler.min_lr_factor"},
               "lr_scheduler.decay_ratio = 0: the rate never decays");
  return out;
}

LoadedConfig load(const std::optional<std::string>& text, const std::string& source,
                  const std::vector<Override>& overrides) {
  const Schema& schema = job_config_schema();
  LoadedConfig out;
  Diagnostics diagnostics;
  if (text) {
    DocumentApplier applier(schema, out, diagnostics);
    if (strings::ends_with(source, ".json")) {
      applier.apply_json(*text, source);
    } else {
      applier.apply_toml(*text, source);
    }
  }
  apply_overrides(schema, overrides, out, diagnostics);
  if (text) {
    out.config.job.config_file = source;
  }
  validate(out.config, out.provenance, diagnostics);
  diagnostics.throw_if_any();
  std::sort(out.unimplemented_keys.begin(), out.unimplemented_keys.end());
  out.inert_keys = inert_keys(out.config, out.provenance);
  return out;
}

}  // namespace

LoadedConfig load_job_config(const std::optional<std::string>& path,
                             const std::vector<Override>& overrides) {
  std::optional<std::string> file = path;
  if (!file) {
    // torchtitan's launch scripts name the file with --job.config_file.
    for (const auto& override_ : overrides) {
      if (override_.key == "job.config_file" && override_.value && !override_.value->empty()) {
        file = *override_.value;
      }
    }
  }
  if (!file) {
    return load(std::nullopt, "defaults", overrides);
  }
  const bool known_format =
      strings::ends_with(*file, ".toml") || strings::ends_with(*file, ".json");
  if (!known_format) {
    Diagnostics diagnostics;
    diagnostics.add({*file}, "job.config_file",
                    "unsupported config format: expected a .toml or .json file");
    diagnostics.throw_if_any();
  }
  return load(read_file(*file), *file, overrides);
}

LoadedConfig load_job_config_text(const std::string& text, const std::string& source_name,
                                  const std::vector<Override>& overrides) {
  return load(text, source_name, overrides);
}

void warn_unimplemented(const LoadedConfig& loaded) {
  if (!loaded.inert_keys.empty()) {
    log::get("config")->warn("set but without effect in this job: {}",
                             strings::join(loaded.inert_keys, "; "));
  }
  if (loaded.unimplemented_keys.empty()) {
    return;
  }
  log::get("config")->warn(
      "accepted for torchtitan compatibility but not implemented by loom yet, so they have no "
      "effect: {}",
      strings::join(loaded.unimplemented_keys, ", "));
}

}  // namespace loom::config
