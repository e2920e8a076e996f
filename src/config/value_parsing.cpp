#include "value_parsing.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>

#include "loom/core/strings.h"

namespace loom::config::detail {
namespace {

using StringList = std::vector<std::string>;

ParseFailure expected(const FieldSpec& field, const std::string& got) {
  return {"expected " + describe(field.kind) + (field.optional ? " (or unset)" : "") + ", got " +
          got};
}

// Uniform read access to TOML nodes and JSON values, so the list logic below is written once.
struct TomlAdapter {
  static std::string describe(const toml::node& node) {
    std::ostringstream out;
    switch (node.type()) {
      case toml::node_type::string: return "string " + strings::quote(node.as_string()->get());
      case toml::node_type::integer: return "integer " + std::to_string(node.as_integer()->get());
      case toml::node_type::floating_point:
        out << "float " << node.as_floating_point()->get();
        return out.str();
      case toml::node_type::boolean:
        return node.as_boolean()->get() ? "boolean true" : "boolean false";
      case toml::node_type::array: return "an array";
      case toml::node_type::table: return "a table";
      default: return "a date/time";
    }
  }
  static std::optional<bool> as_bool(const toml::node& n) {
    if (auto v = n.as_boolean()) return v->get();
    return std::nullopt;
  }
  static std::optional<int64_t> as_int(const toml::node& n) {
    if (auto v = n.as_integer()) return v->get();
    return std::nullopt;
  }
  // Integers are accepted where a float is expected (max_norm = 1).
  static std::optional<double> as_float(const toml::node& n) {
    if (auto v = n.as_floating_point()) return v->get();
    if (auto v = n.as_integer()) return static_cast<double>(v->get());
    return std::nullopt;
  }
  static std::optional<std::string> as_string(const toml::node& n) {
    if (auto v = n.as_string()) return v->get();
    return std::nullopt;
  }
  template <typename Fn>
  static bool for_each_element(const toml::node& n, Fn&& fn) {
    const toml::array* array = n.as_array();
    if (!array) return false;
    for (const toml::node& element : *array) fn(element);
    return true;
  }
  static bool is_null(const toml::node&) { return false; }
};

struct JsonAdapter {
  static std::string describe(const nlohmann::json& v) {
    std::string shown = v.dump();
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    return std::string(v.type_name()) + " " + shown;
  }
  static std::optional<bool> as_bool(const nlohmann::json& v) {
    if (v.is_boolean()) return v.get<bool>();
    return std::nullopt;
  }
  static std::optional<int64_t> as_int(const nlohmann::json& v) {
    if (v.is_number_integer()) return v.get<int64_t>();
    return std::nullopt;
  }
  static std::optional<double> as_float(const nlohmann::json& v) {
    if (v.is_number()) return v.get<double>();
    return std::nullopt;
  }
  static std::optional<std::string> as_string(const nlohmann::json& v) {
    if (v.is_string()) return v.get<std::string>();
    return std::nullopt;
  }
  template <typename Fn>
  static bool for_each_element(const nlohmann::json& v, Fn&& fn) {
    if (!v.is_array()) return false;
    for (const auto& element : v) fn(element);
    return true;
  }
  static bool is_null(const nlohmann::json& v) { return v.is_null(); }
};

template <typename Adapter, typename Node>
std::optional<StringList> string_list(const Node& node, std::string& bad) {
  StringList items;
  bool ok = Adapter::for_each_element(node, [&](const auto& element) {
    auto item = Adapter::as_string(element);
    if (!item && bad.empty()) bad = "an array holding " + Adapter::describe(element);
    if (item) items.push_back(*item);
  });
  if (!ok || !bad.empty()) return std::nullopt;
  return items;
}

template <typename Adapter, typename Node>
ParseResult parse_node(const FieldSpec& field, const Node& node) {
  if (field.optional && Adapter::is_null(node)) {
    return Value(std::monostate{});
  }
  std::string bad;
  switch (field.kind) {
    case ValueKind::Bool:
      if (auto v = Adapter::as_bool(node)) return Value(*v);
      break;
    case ValueKind::Int:
      if (auto v = Adapter::as_int(node)) return Value(*v);
      break;
    case ValueKind::Float:
      if (auto v = Adapter::as_float(node)) return Value(*v);
      break;
    case ValueKind::String:
      if (auto v = Adapter::as_string(node)) return Value(*v);
      break;
    case ValueKind::StringList:
      if (field.scalar_as_list) {
        if (auto v = Adapter::as_string(node)) return Value(StringList{*v});
      }
      if (auto v = string_list<Adapter>(node, bad)) return Value(std::move(*v));
      break;
    case ValueKind::IntList: {
      std::vector<int64_t> items;
      bool ok = Adapter::for_each_element(node, [&](const auto& element) {
        auto item = Adapter::as_int(element);
        if (!item && bad.empty()) bad = "an array holding " + Adapter::describe(element);
        if (item) items.push_back(*item);
      });
      if (ok && bad.empty()) return Value(std::move(items));
      break;
    }
    case ValueKind::StringListList: {
      std::vector<StringList> groups;
      bool ok = Adapter::for_each_element(node, [&](const auto& element) {
        std::string inner_bad;
        auto group = string_list<Adapter>(element, inner_bad);
        if (!group && bad.empty()) bad = "an array holding " + Adapter::describe(element);
        if (group) groups.push_back(std::move(*group));
      });
      if (ok && bad.empty()) return Value(std::move(groups));
      break;
    }
  }
  return expected(field, bad.empty() ? Adapter::describe(node) : bad);
}

}  // namespace

ParseResult from_toml(const FieldSpec& field, const toml::node& node) {
  return parse_node<TomlAdapter>(field, node);
}

ParseResult from_json(const FieldSpec& field, const nlohmann::json& value) {
  return parse_node<JsonAdapter>(field, value);
}

namespace {

bool is_list_kind(ValueKind kind) {
  return kind == ValueKind::StringList || kind == ValueKind::IntList ||
         kind == ValueKind::StringListList;
}

// A list as the command line may write it: `a,b`, or as TOML/JSON do, `[a, b]` / `["a", "b"]`;
// the items come back comma-separated with their quotes removed. "" for `[]`.
std::string unbracketed_list(const std::string& trimmed) {
  if (trimmed.size() < 2 || trimmed.front() != '[' || trimmed.back() != ']') return trimmed;
  std::vector<std::string> items;
  for (auto item : strings::split_list(trimmed.substr(1, trimmed.size() - 2))) {
    if (item.size() >= 2 && (item.front() == '"' || item.front() == '\'') &&
        item.back() == item.front()) {
      item = item.substr(1, item.size() - 2);
    }
    items.push_back(item);
  }
  return strings::join(items, ",");
}

}  // namespace

ParseResult from_cli(const FieldSpec& field, const std::string& raw) {
  std::string trimmed(strings::trim(raw));
  const bool none = trimmed == "none" || trimmed == "None" || trimmed == "null";
  if (field.optional && none) return Value(std::monostate{});
  // docs/config.md: `none` unsets a list too (an empty list).
  if (is_list_kind(field.kind) && none) trimmed = "";
  if (field.kind == ValueKind::StringList || field.kind == ValueKind::IntList) {
    trimmed = unbracketed_list(trimmed);
  }
  const std::string text = is_list_kind(field.kind) ? trimmed : raw;
  const std::string got = strings::quote(text);
  switch (field.kind) {
    case ValueKind::Bool:
      if (auto b = strings::parse_bool(text)) return Value(*b);
      break;
    case ValueKind::Int:
      if (auto i = strings::parse_int(text)) return Value(*i);
      break;
    case ValueKind::Float:
      if (auto f = strings::parse_double(text); f && std::isfinite(*f)) return Value(*f);
      break;
    case ValueKind::String: return Value(text);
    case ValueKind::StringList: return Value(strings::split_list(text));
    case ValueKind::IntList: {
      std::vector<int64_t> items;
      for (const auto& piece : strings::split_list(text)) {
        auto item = strings::parse_int(piece);
        if (!item)
          return expected(field, got + " (" + strings::quote(piece) + " is not an integer)");
        items.push_back(*item);
      }
      return Value(std::move(items));
    }
    case ValueKind::StringListList: {
      // Groups separated by ';', names within a group by ','.
      std::vector<StringList> groups;
      for (const auto& group : strings::split_list(text, ';')) {
        groups.push_back(strings::split_list(group));
      }
      return Value(std::move(groups));
    }
  }
  return expected(field, got);
}

}  // namespace loom::config::detail
