// Prompt files for `loom generate --prompts FILE.jsonl`: one JSON object per line with the
// prompt text under "prompt" (or "text") and an optional "id" echoed in the output. Blank lines
// are skipped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::generate {

struct Prompt {
  std::string text;
  nlohmann::json id;  // null when absent
  std::string where;  // "FILE:LINE", or "--prompt"
};

// Throws InputError naming FILE:LINE for invalid JSON or a line without a string prompt, and
// the file when it cannot be read or holds no prompts.
std::vector<Prompt> read_prompts(const std::string& path);

}  // namespace loom::generate
