// training.dataset_mixture / validation.dataset_mixture: "SOURCE:WEIGHT" entries.
#pragma once

#include <string>
#include <vector>

namespace loom::config {

struct MixtureEntry {
  std::string source;
  double weight = 1;
};

// Splits each entry at its last ':' (so paths may hold colons). The source must be non-empty,
// not "synthetic", and not repeated; the weight a finite number > 0. Throws loom::InputError
// naming `key` and the entry.
std::vector<MixtureEntry> parse_dataset_mixture(const std::vector<std::string>& entries,
                                                const std::string& key);

}  // namespace loom::config
