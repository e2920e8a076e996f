#include "loom/core/check.h"

#include <cstring>

namespace loom {
namespace {

const char* short_path(const char* file) {
  // Keep the path from the project's own top-level folder on ("src/config/loader.cpp").
  for (const char* marker : {"/src/", "/include/", "/tests/"}) {
    if (const char* found = std::strstr(file, marker)) {
      return found + 1;
    }
  }
  return file;
}

}  // namespace

Error::Error(const std::string& message, const char* file, int line)
    : std::runtime_error(message + " (" + short_path(file) + ":" + std::to_string(line) + ")"),
      message_(message),
      file_(short_path(file)),
      line_(line) {}

}  // namespace loom
