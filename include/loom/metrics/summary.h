// `loom metrics summary`: last, best, mean, min and max of every scalar a run logged.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "loom/metrics/run_log.h"

namespace loom::metrics {

// {"run", "folder", "first_step", "last_step", "logged_steps", "state",
//  "metrics": {key: {"last", "best"?, "best_step"?, "mean", "min", "max"}}}. "best" is the min
// of keys where lower is better (loss, val_loss, step_time_s, ...) and the max of those where
// higher is better (tps, tflops, mfu_pct); other keys (lr, tokens_seen, ...) have none.
nlohmann::json summarize(const RunLog& run);

// The same as an aligned text table.
std::string format_summary(const nlohmann::json& summary);

}  // namespace loom::metrics
