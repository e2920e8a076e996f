// Problems found in a job config, collected so that one message reports all of them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "loom/core/check.h"

namespace loom::config {

// Where a value came from: a file and line, the command line, or the built-in defaults.
struct Origin {
  std::string source;  // file path, "command line" or "defaults"
  int line = 0;        // 0 when the source has no lines (JSON values, the command line)
  int column = 0;

  std::string to_string() const;  // "configs/x.toml:4:1", "command line", ...
};

struct Diagnostic {
  Origin origin;
  std::string key;  // "training.steps", or a section name
  std::string message;
};

// Thrown when a config has problems; what() lists every one of them.
class ConfigError : public InputError {
 public:
  ConfigError(std::vector<Diagnostic> diagnostics, const char* file, int line);
  const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }

 private:
  std::vector<Diagnostic> diagnostics_;
};

class Diagnostics {
 public:
  void add(Origin origin, std::string key, std::string message) {
    items_.push_back({std::move(origin), std::move(key), std::move(message)});
  }
  bool empty() const { return items_.empty(); }
  const std::vector<Diagnostic>& items() const { return items_; }
  // Throws ConfigError when there is at least one problem.
  void throw_if_any() const;

 private:
  std::vector<Diagnostic> items_;
};

// Which source set each key last (dotted name -> origin); keys never set come from defaults.
using Provenance = std::map<std::string, Origin>;

}  // namespace loom::config
