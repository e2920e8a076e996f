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
  // Weights of 1e308 each sum to infinity: every share would round to 0 and one source train
  // alone. The shares must stay finite and none may vanish against the sum.
  double total = 0;
  for (const auto& m : mixture) total += m.weight;
  LOOM_CHECK_AS(InputError, std::isfinite(total), key,
                ": the weights add up past the largest number (", total,
                "); use relative weights such as 0.7 and 0.3");
  for (const auto& m : mixture) {
    LOOM_CHECK_AS(InputError, m.weight / total > 0, key, ": the weight of ",
                  strings::quote(m.source), " (", m.weight, ") is 0 next to the sum ", total,
                  "; use relative weights of similar sizes");
  }
  return mixture;
}

}  // namespace loom::config
