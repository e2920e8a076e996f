// Environment variables set for one test and restored afterwards (the torchrun / SLURM contract
// the runtime reads).
#pragma once

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace loom::testing {

class ScopedEnv {
 public:
  // Unsets every name in `cleared`, then sets `values`; the destructor restores them all.
  explicit ScopedEnv(const std::map<std::string, std::string>& values,
                     const std::vector<std::string>& cleared = {}) {
    for (const auto& name : cleared) {
      save(name);
      ::unsetenv(name.c_str());
    }
    for (const auto& [name, value] : values) {
      save(name);
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void save(const std::string& name) {
    if (saved_.count(name)) return;  // the value before this object touched it
    const char* old = std::getenv(name.c_str());
    saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace loom::testing
