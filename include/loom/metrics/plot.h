// `loom metrics plot`: loss (with val_loss), learning rate, throughput and memory of one or more
// runs against step or tokens, overlaid with a legend, as one self-contained SVG (no scripts,
// fonts or external references: it renders in browsers and in rsvg-convert).
#pragma once

#include <string>
#include <vector>

#include "loom/metrics/run_log.h"

namespace loom::metrics {

struct PlotOptions {
  bool by_tokens = false;  // x axis: tokens_seen instead of step
  std::string title;       // empty: the run names
};

std::string plot_svg(const std::vector<RunLog>& runs, const PlotOptions& options);

}  // namespace loom::metrics
