// The job config loader (TOML, or JSON when the input starts with '{'): any input gives a
// config or a loom::Error, never a crash. Seeds: configs/*.toml and their JSON forms.
#include <cstdint>
#include <string>

#include "loom/config/loader.h"
#include "loom/core/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const bool json = text.find_first_not_of(" \t\r\n") != std::string::npos &&
                    text[text.find_first_not_of(" \t\r\n")] == '{';
  try {
    loom::config::load_job_config_text(text, json ? "fuzz.json" : "fuzz.toml", {});
  } catch (const loom::Error&) {
  }
  return 0;
}
