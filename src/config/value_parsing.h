// Conversion of raw TOML nodes, JSON values and command-line strings into typed config values.
// Each returns the value, or an error text such as "expected an integer, got string \"abc\"".
#pragma once

#include <toml++/toml.h>
#include <nlohmann/json_fwd.hpp>

#include <string>
#include <variant>

#include "loom/config/schema.h"

namespace loom::config::detail {

struct ParseFailure {
  std::string message;
};
using ParseResult = std::variant<Value, ParseFailure>;

ParseResult from_toml(const FieldSpec& field, const toml::node& node);
ParseResult from_json(const FieldSpec& field, const nlohmann::json& value);
// A command-line value; lists are comma-separated, "none" unsets an optional key.
ParseResult from_cli(const FieldSpec& field, const std::string& text);

}  // namespace loom::config::detail
