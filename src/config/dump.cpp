#include "loom/config/dump.h"

#include <nlohmann/json.hpp>

#include <sstream>

#include "loom/config/schema.h"
#include "loom/core/strings.h"

namespace loom::config {
namespace {

nlohmann::json to_json_value(const Value& value) {
  struct Visitor {
    nlohmann::json operator()(std::monostate) const { return nullptr; }
    nlohmann::json operator()(bool b) const { return b; }
    nlohmann::json operator()(int64_t i) const { return i; }
    nlohmann::json operator()(double d) const { return d; }
    nlohmann::json operator()(const std::string& s) const { return s; }
    nlohmann::json operator()(const std::vector<std::string>& v) const { return v; }
    nlohmann::json operator()(const std::vector<int64_t>& v) const { return v; }
    nlohmann::json operator()(const std::vector<std::vector<std::string>>& v) const { return v; }
  };
  return std::visit(Visitor{}, value);
}

std::string type_name(const FieldSpec& field) {
  static const char* names[] = {"bool",
                                "int",
                                "float",
                                "string",
                                "list of strings",
                                "list of ints",
                                "list of lists of strings"};
  std::string name = names[static_cast<int>(field.kind)];
  return field.optional ? name + " (optional)" : name;
}

std::string escape_markdown_cell(std::string text) {
  std::string out;
  for (char c : text) {
    if (c == '|')
      out += "\\|";
    else
      out += c;
  }
  return out;
}

bool has_fields(const Schema& schema, const std::string& section) {
  return !schema.keys_of(section).empty();
}

}  // namespace

std::string to_toml(const JobConfig& config) {
  const Schema& schema = job_config_schema();
  std::ostringstream out;
  out << "# Effective loom job config (defaults < file < command line).\n";
  for (const auto& section : schema.sections()) {
    if (!has_fields(schema, section.name)) continue;
    out << "\n[" << section.name << "]\n";
    for (const auto& field : schema.fields()) {
      if (field.section != section.name) continue;
      Value value = field.read(config);
      if (std::holds_alternative<std::monostate>(value)) {
        out << "# " << field.key << " = (unset)\n";
      } else {
        out << field.key << " = " << to_toml_literal(value) << "\n";
      }
    }
  }
  return out.str();
}

std::string to_json(const JobConfig& config, int indent) {
  const Schema& schema = job_config_schema();
  nlohmann::json root = nlohmann::json::object();
  for (const auto& field : schema.fields()) {
    nlohmann::json* node = &root;
    for (const auto& part : strings::split_list(field.section, '.')) {
      node = &(*node)[part];
    }
    (*node)[field.key] = to_json_value(field.read(config));
  }
  return root.dump(indent);
}

std::string reference_markdown() {
  const Schema& schema = job_config_schema();
  const JobConfig defaults;
  std::ostringstream out;
  for (const auto& section : schema.sections()) {
    if (!has_fields(schema, section.name)) continue;
    out << "\n### [" << section.name << "]\n\n" << section.doc << "\n\n";
    out << "| key | type | default | meaning |\n|---|---|---|---|\n";
    for (const auto& field : schema.fields()) {
      if (field.section != section.name) continue;
      std::string meaning = field.doc;
      if (!field.choices.empty()) {
        meaning += " One of: " + strings::join(field.choices, ", ") + ".";
      }
      if (!field.implemented) {
        meaning += " *Accepted, not implemented yet.*";
      }
      out << "| `" << field.key << "` | " << type_name(field) << " | `"
          << escape_markdown_cell(to_toml_literal(field.read(defaults))) << "` | "
          << escape_markdown_cell(meaning) << " |\n";
    }
  }
  return out.str();
}

}  // namespace loom::config
