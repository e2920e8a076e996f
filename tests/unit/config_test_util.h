// Shortcuts for config tests: load TOML or JSON text with overrides.
#pragma once

#include <string>
#include <vector>

#include "loom/config/loader.h"

namespace loom::testing {

inline config::LoadedConfig load_toml(const std::string& text,
                                      const std::vector<config::Override>& overrides = {}) {
  return config::load_job_config_text(text, "test.toml", overrides);
}

inline config::LoadedConfig load_json(const std::string& text,
                                      const std::vector<config::Override>& overrides = {}) {
  return config::load_job_config_text(text, "test.json", overrides);
}

// The full error text of a config that must fail to load.
inline std::string load_error(const std::string& text,
                              const std::vector<config::Override>& overrides = {},
                              const std::string& name = "test.toml") {
  try {
    config::load_job_config_text(text, name, overrides);
  } catch (const config::ConfigError& error) {
    return error.message();
  }
  return "<loaded without error>";
}

}  // namespace loom::testing
