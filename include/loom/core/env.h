// Environment variables, read with errors that name the variable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace loom::env {

// The value of a set, non-empty variable.
std::optional<std::string> get(const char* name);

// An integer variable; throws loom::InputError naming it when the value is not an integer.
std::optional<int64_t> get_int(const char* name);

}  // namespace loom::env
