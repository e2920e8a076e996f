#include "loom/core/json.h"

#include <fstream>

#include <set>

#include "loom/core/check.h"
#include "loom/core/files.h"

namespace loom::json {
namespace {

// Deeper nesting than any file loom reads has; bounds the parser's stack and the destructor's.
constexpr int kMaxDepth = 256;

}  // namespace

int64_t for_each_json_line(
    const std::string& path, const std::string& role,
    const std::function<void(const nlohmann::json& value, const std::string& where, int64_t line)>&
        visit) {
  files::require_regular_file(path, role);  // a FIFO would block the read
  std::ifstream in(path);
  LOOM_CHECK_AS(InputError, in.good(), role, ": cannot read '", path, "'");
  std::string text;
  int64_t line = 0, visited = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line);
    visit(parse_strict(text, where), where, line);
    ++visited;
  }
  return visited;
}

nlohmann::json parse_strict(std::string_view text, const std::string& source) {
  // The parser callback sees every key before it is stored: one set of keys per open object.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxDepth) {
      LOOM_THROW(InputError, source, ": JSON nested deeper than ", kMaxDepth, " levels");
    }
    if (event == Event::object_start) open_objects.emplace_back();
    if (event == Event::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == Event::key && !open_objects.empty() &&
        !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& error) {
    LOOM_THROW(InputError, source, ": not valid JSON: ", error.what());
  }
  LOOM_CHECK_AS(InputError, duplicate.empty(), source, ": key '", duplicate,
                "' appears twice in one object (which one is meant is ambiguous)");
  return root;
}

namespace {

// Refuses nesting deeper than kMaxDepth before the parser builds it.
bool within_depth(int depth, nlohmann::json::parse_event_t event) {
  using Event = nlohmann::json::parse_event_t;
  return !((event == Event::object_start || event == Event::array_start) && depth >= kMaxDepth);
}

}  // namespace

nlohmann::json parse_bounded(std::string_view text, const std::string& source) {
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if (!within_depth(depth, event)) {
      LOOM_THROW(InputError, source, ": JSON nested deeper than ", kMaxDepth, " levels");
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& error) {  // parse_error, or out_of_range (1e999)
    LOOM_THROW(InputError, source, ": not valid JSON: ", error.what());
  }
}

nlohmann::json parse_or_discard(std::string_view text) {
  try {
    return parse_bounded(text, "");
  } catch (const InputError&) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

nlohmann::json read_file_strict(const std::string& path, const std::string& role,
                                uint64_t max_bytes) {
  return parse_strict(files::read_file(path, role, max_bytes), path);
}

const char* type_name(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    case nlohmann::json::value_t::number_float: return "a number with a fraction";
    case nlohmann::json::value_t::null: return "null";
    default: return "a binary value";
  }
}

const nlohmann::json& field(const nlohmann::json& object, const std::string& key,
                            const std::string& where) {
  LOOM_CHECK_AS(InputError, object.is_object(), where, ": expected an object, found ",
                type_name(object));
  auto it = object.find(key);
  LOOM_CHECK_AS(InputError, it != object.end(), where, ": key '", key, "' is missing");
  return *it;
}

namespace {

const nlohmann::json& typed(const nlohmann::json& object, const std::string& key,
                            const std::string& where, nlohmann::json::value_t type,
                            const char* expected) {
  const auto& value = field(object, key, where);
  LOOM_CHECK_AS(InputError, value.type() == type, where, ": key '", key, "' must be ", expected,
                ", found ", type_name(value));
  return value;
}

}  // namespace

const nlohmann::json& object_field(const nlohmann::json& object, const std::string& key,
                                   const std::string& where) {
  return typed(object, key, where, nlohmann::json::value_t::object, "an object");
}

const nlohmann::json& array_field(const nlohmann::json& object, const std::string& key,
                                  const std::string& where) {
  return typed(object, key, where, nlohmann::json::value_t::array, "an array");
}

std::string string_field(const nlohmann::json& object, const std::string& key,
                         const std::string& where) {
  return typed(object, key, where, nlohmann::json::value_t::string, "a string").get<std::string>();
}

bool bool_field(const nlohmann::json& object, const std::string& key, const std::string& where) {
  return typed(object, key, where, nlohmann::json::value_t::boolean, "a boolean").get<bool>();
}

int64_t as_int(const nlohmann::json& value, const std::string& what, int64_t min, int64_t max) {
  bool ok = false;
  int64_t result = 0;
  if (value.is_number_unsigned()) {
    const auto u = value.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    result = static_cast<int64_t>(u);
  } else if (value.is_number_integer()) {
    ok = true;
    result = value.get<int64_t>();
  }
  LOOM_CHECK_AS(InputError, ok, what, " must be an integer, found ",
                value.is_number() ? value.dump() : type_name(value));
  LOOM_CHECK_AS(InputError, result >= min && result <= max, what, " is ", result, ", outside [",
                min, ", ", max, "]");
  return result;
}

uint64_t as_uint(const nlohmann::json& value, const std::string& what, uint64_t max) {
  LOOM_CHECK_AS(InputError, value.is_number_unsigned() || value.is_number_integer(), what,
                " must be an integer, found ", value.is_number() ? value.dump() : type_name(value));
  LOOM_CHECK_AS(InputError, value.is_number_unsigned() || value.get<int64_t>() >= 0, what, " is ",
                value.dump(), ", must not be negative");
  const auto result = value.get<uint64_t>();
  LOOM_CHECK_AS(InputError, result <= max, what, " is ", result, ", more than ", max);
  return result;
}

int64_t int_field(const nlohmann::json& object, const std::string& key, const std::string& where,
                  int64_t min, int64_t max) {
  return as_int(field(object, key, where), where + ": key '" + key + "'", min, max);
}

std::vector<int64_t> int_array(const nlohmann::json& value, const std::string& what, int64_t min,
                               int64_t max) {
  LOOM_CHECK_AS(InputError, value.is_array(), what, " must be an array of integers, found ",
                type_name(value));
  std::vector<int64_t> out;
  out.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    out.push_back(as_int(value[i], what + "[" + std::to_string(i) + "]", min, max));
  }
  return out;
}

}  // namespace loom::json
