#include "loom/generate/prompts.h"

#include "loom/core/check.h"
#include "loom/core/json.h"

namespace loom::generate {

std::vector<Prompt> read_prompts(const std::string& path) {
  std::vector<Prompt> prompts;
  json::for_each_json_line(path, "--prompts", [&](const nlohmann::json& j, const std::string& where,
                                                       int64_t /*line*/) {
    const char* key = j.is_object() && j.contains("prompt") ? "prompt" : "text";
    LOOM_CHECK_AS(InputError, j.is_object() && j.contains(key) && j[key].is_string(), where,
                  ": expected an object with the prompt as a string under \"prompt\" (or "
                  "\"text\"), e.g. {\"prompt\": \"Once upon a time\"}");
    prompts.push_back({j[key].get<std::string>(), j.value("id", nlohmann::json()), where});
  });
  LOOM_CHECK_AS(InputError, !prompts.empty(), "--prompts: '", path, "' holds no prompts");
  return prompts;
}

}  // namespace loom::generate
