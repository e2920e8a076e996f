// Reading JSON that comes from files loom did not necessarily write (checkpoint indexes, shard
// indexes, tokenizers, safetensors headers): strict parsing (a key twice in one object is an
// error, not "last one wins"; nesting is bounded) and typed field access whose errors name the
// file and the key. Every error is a loom::InputError.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace loom::json {

// Whether `object` holds `key` with a value other than null (transformers, and the configs it
// writes, treat a null value as an unset key).
inline bool is_set(const nlohmann::json& object, const std::string& key) {
  auto it = object.find(key);
  return it != object.end() && !it->is_null();
}

// Parses `text`; `source` (a path, "path: header", ...) starts every error message.
nlohmann::json parse_strict(std::string_view text, const std::string& source);

// Parses `text` with nesting bounded as parse_strict (a value nested deeper is refused before it
// is built: deep values overflow the stack of code that copies or walks them), a key twice
// keeping the last value as JSON parsers commonly do. Errors start with `source`.
nlohmann::json parse_bounded(std::string_view text, const std::string& source);

// parse_bounded for readers that skip what they cannot use (a metrics row being written): an
// invalid or too deeply nested text gives a discarded value (is_discarded()), no exception.
nlohmann::json parse_or_discard(std::string_view text);

// Each non-blank line of a JSON-lines file, parsed strictly, handed to `visit` with its
// "path:line" (for the visitor's own errors) and line number. `role` names the file where it cannot
// be read
// ("--prompts", "task file"). Returns the number of lines visited.
int64_t for_each_json_line(
    const std::string& path, const std::string& role,
    const std::function<void(const nlohmann::json& value, const std::string& where, int64_t line)>&
        visit);

// files::read_file (regular files only) + parse_strict.
nlohmann::json read_file_strict(const std::string& path, const std::string& role,
                                uint64_t max_bytes = uint64_t{1} << 32);

// `object[key]`, which must exist (and be an object/array/string when asked below). `where`
// names the file (and the object inside it) in the error.
const nlohmann::json& field(const nlohmann::json& object, const std::string& key,
                            const std::string& where);
const nlohmann::json& object_field(const nlohmann::json& object, const std::string& key,
                                   const std::string& where);
const nlohmann::json& array_field(const nlohmann::json& object, const std::string& key,
                                  const std::string& where);
std::string string_field(const nlohmann::json& object, const std::string& key,
                         const std::string& where);
bool bool_field(const nlohmann::json& object, const std::string& key, const std::string& where);

// An integer in [min, max] (JSON integers only: 1.5, "3" or 2^64 are refused, never truncated).
int64_t int_field(const nlohmann::json& object, const std::string& key, const std::string& where,
                  int64_t min = std::numeric_limits<int64_t>::min(),
                  int64_t max = std::numeric_limits<int64_t>::max());
int64_t as_int(const nlohmann::json& value, const std::string& what, int64_t min = 0,
               int64_t max = std::numeric_limits<int64_t>::max());
uint64_t as_uint(const nlohmann::json& value, const std::string& what,
                 uint64_t max = std::numeric_limits<uint64_t>::max());
// A JSON array of integers in [min, max].
std::vector<int64_t> int_array(const nlohmann::json& value, const std::string& what,
                               int64_t min = 0, int64_t max = std::numeric_limits<int64_t>::max());

// "an object", "a string", ... for messages.
const char* type_name(const nlohmann::json& value);

}  // namespace loom::json
