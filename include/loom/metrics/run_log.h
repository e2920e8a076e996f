// Reading what a run logged (for `loom metrics watch | plot | summary`): metrics.jsonl and
// run_status.json of a dump folder. Works on a live run: a partial last line is skipped.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::metrics {

struct RunLog {
  std::string folder;
  std::string name;                        // the folder's last component
  std::vector<nlohmann::json> train;       // training lines, one per step (a resumed run's
                                           // recomputed steps replace the earlier ones), by step
  std::vector<nlohmann::json> validation;  // lines with val_loss, by step
  std::optional<nlohmann::json> status;    // run_status.json, when the run wrote one
};

// Throws loom::InputError naming the folder when it has no metrics.jsonl.
RunLog read_run(const std::string& folder);

// (x, value) of every line holding `key`; x is the step, or tokens_seen when by_tokens.
std::vector<std::pair<double, double>> series(const std::vector<nlohmann::json>& lines,
                                              const std::string& key, bool by_tokens);

// The numeric keys of the training lines, in the order of the first line (then new ones).
std::vector<std::string> numeric_keys(const std::vector<nlohmann::json>& lines);

double median(std::vector<double> values);

}  // namespace loom::metrics
