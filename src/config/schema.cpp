#include "loom/config/schema.h"

#include <charconv>
#include <cmath>

#include "loom/core/strings.h"

namespace loom::config {

const FieldSpec* Schema::find(const std::string& section, const std::string& key) const {
  for (const auto& field : fields_) {
    if (field.section == section && field.key == key) {
      return &field;
    }
  }
  return nullptr;
}

const FieldSpec* Schema::find(const std::string& dotted_name) const {
  for (const auto& field : fields_) {
    if (field.name() == dotted_name) {
      return &field;
    }
  }
  return nullptr;
}

const SectionSpec* Schema::find_section(const std::string& name) const {
  for (const auto& section : sections_) {
    if (section.name == name) {
      return &section;
    }
  }
  return nullptr;
}

std::vector<std::string> Schema::keys_of(const std::string& section) const {
  std::vector<std::string> keys;
  for (const auto& field : fields_) {
    if (field.section == section) {
      keys.push_back(field.key);
    }
  }
  return keys;
}

std::vector<std::string> Schema::section_names() const {
  std::vector<std::string> names;
  for (const auto& section : sections_) {
    names.push_back(section.name);
  }
  return names;
}

std::string describe(ValueKind kind) {
  switch (kind) {
    case ValueKind::Bool: return "a boolean";
    case ValueKind::Int: return "an integer";
    case ValueKind::Float: return "a number";
    case ValueKind::String: return "a string";
    case ValueKind::StringList: return "a list of strings";
    case ValueKind::IntList: return "a list of integers";
    case ValueKind::StringListList: return "a list of lists of strings";
  }
  return "a value";
}

namespace {

// Shortest text that reads back as the same double, always with a '.' or exponent so that TOML
// keeps it a float.
std::string float_literal(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string text(buffer, end);
  if (text.find_first_of(".eEn") == std::string::npos) {
    text += ".0";
  }
  return text;
}

}  // namespace

std::string to_toml_literal(const Value& value) {
  struct Visitor {
    std::string operator()(std::monostate) const { return "unset"; }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return float_literal(d); }
    std::string operator()(const std::string& s) const { return strings::quote(s); }
    std::string operator()(const std::vector<std::string>& items) const {
      std::vector<std::string> quoted;
      for (const auto& item : items) quoted.push_back(strings::quote(item));
      return "[" + strings::join(quoted, ", ") + "]";
    }
    std::string operator()(const std::vector<int64_t>& items) const {
      std::vector<std::string> parts;
      for (auto item : items) parts.push_back(std::to_string(item));
      return "[" + strings::join(parts, ", ") + "]";
    }
    std::string operator()(const std::vector<std::vector<std::string>>& groups) const {
      std::vector<std::string> parts;
      for (const auto& group : groups) parts.push_back((*this)(group));
      return "[" + strings::join(parts, ", ") + "]";
    }
  };
  return std::visit(Visitor{}, value);
}

}  // namespace loom::config
