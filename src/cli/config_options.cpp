#include "commands.h"

#include <cmath>
#include <sstream>
#include <string>
#include "loom/config/schema.h"

namespace loom::cli {
namespace {

const char* type_name(const config::FieldSpec& field) {
  switch (field.kind) {
    case config::ValueKind::Bool: return "[BOOL]";
    case config::ValueKind::Int: return "INT";
    case config::ValueKind::Float: return "FLOAT";
    case config::ValueKind::String: return "TEXT";
    case config::ValueKind::StringList: return "LIST";
    case config::ValueKind::IntList: return "INTS";
    case config::ValueKind::StringListList: return "LISTS";
  }
  return "VALUE";
}

}  // namespace

void add_config_options(CLI::App& command, ConfigArgs& args) {
  command.add_option("-c,--config", args.config_path,
                     "Job config file (.toml or .json); same as --job.config_file");
  const config::Schema& schema = config::job_config_schema();
  for (const auto& section : schema.sections()) {
    if (schema.keys_of(section.name).empty()) continue;
    CLI::Option_group* group = command.add_option_group("[" + section.name + "]", section.doc);
    for (const auto& field : schema.fields()) {
      if (field.section != section.name) continue;
      const std::string key = field.name();
      const bool is_bool = field.kind == config::ValueKind::Bool;
      CLI::Option* option = group->add_option(
          "--" + key,
          [&args, key, is_bool](const CLI::results_t& results) {
            std::optional<std::string> value;
            if (!results.empty() && !(is_bool && results.back().empty())) {
              value = results.back();
            }
            args.overrides.push_back({key, value});
            return true;
          },
          field.implemented ? field.doc
                            : field.doc + " [not implemented yet: accepted, no effect]");
      option->type_name(type_name(field));
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      if (is_bool) {
        option->expected(0, 1);  // --key, --key=false, --key false
      }
    }
  }
  command.allow_extras();
}

void add_config_file_option(CLI::App& command, ConfigArgs& args) {
  command.add_option("-c,--config", args.config_path,
                     "Job config file (.toml or .json); same as --job.config_file");
  command.footer(
      "Config keys: any --section.key VALUE overrides the config (`loom train --help` lists "
      "them, docs/config.md describes them).");
  command.allow_extras();
}

void collect_unrecognized(const CLI::App& command, ConfigArgs& args) {
  std::vector<std::string> rest = command.remaining();
  for (size_t i = 0; i < rest.size(); ++i) {
    const std::string& token = rest[i];
    if (token.rfind("--", 0) != 0 || token.size() == 2) {
      throw CLI::ExtrasError({token});
    }
    std::string name = token.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < rest.size() && rest[i + 1].rfind("--", 0) != 0) {
      value = rest[++i];
    }
    args.overrides.push_back({name, value});
  }
}

config::LoadedConfig load_config(const CLI::App& command, ConfigArgs& args) {
  collect_unrecognized(command, args);
  return config::load_job_config(args.config_path, args.overrides);
}

// (A NaN interval made `metrics watch` spin.)
CLI::Validator finite_range(double low, double high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        double value = 0;
        try {
          size_t used = 0;
          value = std::stod(text, &used);
          if (used != text.size()) return "'" + text + "' is not a number";
        } catch (const std::exception&) {
          return "'" + text + "' is not a number";
        }
        if (!std::isfinite(value) || value < low || value > high) {
          std::ostringstream range;
          range << "'" << text << "' is outside " << low << " to " << high;
          return range.str();
        }
        return "";
      },
      "");
}

}  // namespace loom::cli
