#include "loom/eval/choice_file.h"

#include <nlohmann/json.hpp>

#include "loom/core/check.h"
#include "loom/core/json.h"

namespace loom::eval {

std::vector<ChoiceItem> read_choice_items(const std::string& path) {
  std::vector<ChoiceItem> items;
  json::for_each_json_line(
      path, "task file", [&](const nlohmann::json& j, const std::string& where, int64_t line) {
        LOOM_CHECK_AS(
            InputError,
            j.is_object() && j.contains("context") && j["context"].is_string() &&
                j.contains("choices") && j["choices"].is_array() && j.contains("answer") &&
                j["answer"].is_number_integer(),
            where,
            ": expected a multiple-choice item {\"context\": string, \"choices\": [string, "
            "...], \"answer\": index}");
        ChoiceItem item;
        item.line = line;
        item.context = j["context"].get<std::string>();
        for (const auto& c : j["choices"]) {
          LOOM_CHECK_AS(InputError, c.is_string() && !c.get<std::string>().empty(), where,
                        ": every choice must be a non-empty string");
          item.choices.push_back(c.get<std::string>());
        }
        LOOM_CHECK_AS(InputError, item.choices.size() >= 2, where, ": needs at least two choices");
        item.answer = j["answer"].get<int64_t>();
        LOOM_CHECK_AS(InputError,
                      item.answer >= 0 && item.answer < static_cast<int64_t>(item.choices.size()),
                      where, ": answer ", item.answer, " is not the index of one of the ",
                      item.choices.size(), " choices");
        items.push_back(std::move(item));
      });
  LOOM_CHECK_AS(InputError, !items.empty(), "task file '", path, "' holds no items");
  return items;
}

}  // namespace loom::eval
