#include "loom/generate/prompts.h"

#include <fstream>

#include "loom/core/check.h"

namespace loom::generate {

std::vector<Prompt> read_prompts(const std::string& path) {
  std::ifstream in(path);
  LOOM_CHECK_AS(InputError, in.good(), "--prompts: cannot read '", path, "'");
  std::vector<Prompt> prompts;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& error) {
      LOOM_THROW(InputError, where, ": not valid JSON: ", error.what());
    }
    const char* key = j.is_object() && j.contains("prompt") ? "prompt" : "text";
    LOOM_CHECK_AS(InputError, j.is_object() && j.contains(key) && j[key].is_string(), where,
                  ": expected an object with the prompt as a string under \"prompt\" (or "
                  "\"text\"), e.g. {\"prompt\": \"Once upon a time\"}");
    prompts.push_back({j[key].get<std::string>(), j.value("id", nlohmann::json()), where});
  }
  LOOM_CHECK_AS(InputError, !prompts.empty(), "--prompts: '", path, "' holds no prompts");
  return prompts;
}

}  // namespace loom::generate
