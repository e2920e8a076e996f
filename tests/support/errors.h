// What a piece of code refuses with: the message of the loom::InputError it throws.
#pragma once

#include <functional>
#include <string>

#include "loom/core/check.h"

namespace loom::testing {

// The InputError's message; "<no InputError>" when `body` returns (another exception escapes).
inline std::string input_error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const InputError& error) {
    return error.message();
  }
  return "<no InputError>";
}

}  // namespace loom::testing
