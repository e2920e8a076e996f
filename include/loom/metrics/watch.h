// `loom metrics watch`: a live terminal view of one or more runs from their dump folders (no
// service needed): latest values, sparklines of loss and throughput, progress and ETA to
// training.steps, validation loss, and a status line saying whether the run is running,
// finished, stopped, failed or stalled (no new step for stall_factor x the median time between
// logged steps).
#pragma once

#include <string>
#include <vector>

#include "loom/metrics/run_log.h"

namespace loom::metrics {

struct WatchOptions {
  double stall_factor = 5;  // stalled after this many median intervals without a new step
  int sparkline_width = 40;
  bool color = false;
  int width = 80;  // terminal columns: longer lines wrap between words (0: never)
};

// One run's state as the status line says it: RUNNING, STALLED, FINISHED, STOPPED, FAILED or
// WAITING (nothing logged yet), and the line itself.
struct RunState {
  std::string word;
  std::string line;
};
RunState run_state(const RunLog& run, double now, const WatchOptions& options);

// The screen for `runs` at unix time `now` (no cursor control: the caller clears the screen).
std::string render_watch(const std::vector<RunLog>& runs, double now, const WatchOptions& options);

// Each line of `text` wrapped between words to `width` columns (colors and UTF-8 counted as a
// terminal shows them), continuation lines indented two more than the line; a single word
// longer than the width stays whole.
std::string wrap_lines(const std::string& text, int width);

// Unicode block characters for the last `width` values, scaled between their min and max.
std::string sparkline(const std::vector<double>& values, int width);

}  // namespace loom::metrics
