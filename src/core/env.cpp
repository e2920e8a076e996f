#include "loom/core/env.h"

#include <cstdlib>

#include "loom/core/check.h"
#include "loom/core/strings.h"

namespace loom::env {

std::optional<std::string> get(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return std::nullopt;
  }
  return std::string(value);
}

std::optional<int64_t> get_int(const char* name) {
  auto value = get(name);
  if (!value) {
    return std::nullopt;
  }
  auto parsed = strings::parse_int(*value);
  LOOM_CHECK_AS(InputError, parsed.has_value(), "environment variable ", name, "='", *value,
                "' is not an integer");
  return parsed;
}

}  // namespace loom::env
