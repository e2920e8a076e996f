#include "loom/config/dataset_mixture.h"

#include <cmath>
#include <set>

#include "loom/core/check.h"
#include "loom/core/strings.h"

namespace loom::config {

std::vector<MixtureEntry> parse_dataset_mixture(const std::vector<std::string>& entries,
                                                const std::string& key) {
  std::vector<MixtureEntry> mixture;
  std::set<std::string> seen;
  for (const auto& entry : entries) {
    const auto colon = entry.rfind(':');
    LOOM_CHECK_AS(InputError, colon != std::string::npos, key, ": entry ", strings::quote(entry),
                  " must be SOURCE:WEIGHT (for example \"brown:0.7\")");
    const std::string source(strings::trim(std::string_view(entry).substr(0, colon)));
    const auto weight_text = strings::trim(std::string_view(entry).substr(colon + 1));
    LOOM_CHECK_AS(InputError, !source.empty(), key, ": entry ", strings::quote(entry),
                  " has no source before the ':'");
    LOOM_CHECK_AS(InputError, source != "synthetic", key,
                  ": the synthetic stream cannot be mixed with text datasets");
    const auto weight = strings::parse_double(weight_text);
    LOOM_CHECK_AS(InputError, weight.has_value(), key, ": entry ", strings::quote(entry),
                  ": weight ", strings::quote(weight_text), " is not a number");
    LOOM_CHECK_AS(InputError, std::isfinite(*weight) && *weight > 0, key, ": entry ",
                  strings::quote(entry), ": weight must be a positive number, got ",
                  std::string(weight_text));
    LOOM_CHECK_AS(InputError, seen.insert(source).second, key, ": source ", strings::quote(source),
                  " appears twice; give it one weight");
    mixture.push_back({source, *weight});
  }
  return mixture;
}

}  // namespace loom::config
