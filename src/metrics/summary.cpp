#include "loom/metrics/summary.h"
#include "loom/core/strings.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::metrics {
namespace {

// +1: higher is better, -1: lower is better, 0: neither.
int direction(const std::string& key) {
  static const char* lower[] = {"loss",          "val_loss",     "grad_norm",    "step_time_s",
                                "data_time_pct", "mem_peak_gib", "data_skipped", "comm_mb",
                                "comm_wait_pct", "pp_bubble_pct"};
  static const char* higher[] = {"tps", "tflops", "mfu_pct"};
  for (const char* k : lower) {
    if (key == k) return -1;
  }
  for (const char* k : higher) {
    if (key == k) return 1;
  }
  return 0;
}

// Steps and times are the axes, not metrics.
bool is_axis(const std::string& key) {
  return key == "step" || key == "wall_time";
}

nlohmann::json stats(const std::vector<std::pair<double, double>>& points, int dir) {
  double sum = 0, lo = std::numeric_limits<double>::infinity(), hi = -lo;
  double lo_step = 0, hi_step = 0;
  for (const auto& [step, v] : points) {
    sum += v;
    if (v < lo) lo = v, lo_step = step;
    if (v > hi) hi = v, hi_step = step;
  }
  nlohmann::json j = {{"last", points.back().second},
                      {"mean", sum / static_cast<double>(points.size())},
                      {"min", lo},
                      {"max", hi}};
  if (dir < 0) j["best"] = lo, j["best_step"] = lo_step;
  if (dir > 0) j["best"] = hi, j["best_step"] = hi_step;
  return j;
}

std::string number(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e6 || a < 1e-3) return fmt::format("{:.3e}", v);
  if (a >= 1000) return fmt::format("{:.0f}", v);
  return fmt::format("{:.4g}", v);
}

}  // namespace

nlohmann::json summarize(const RunLog& run) {
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& key : numeric_keys(run.train)) {
    if (is_axis(key)) continue;
    const auto points = series(run.train, key, false);
    if (!points.empty()) metrics[key] = stats(points, direction(key));
  }
  const auto val = series(run.validation, "val_loss", false);
  if (!val.empty()) metrics["val_loss"] = stats(val, -1);
  nlohmann::json j = {{"run", run.name},
                      {"folder", run.folder},
                      {"logged_steps", run.train.size()},
                      {"metrics", metrics}};
  if (!run.train.empty()) {
    j["first_step"] = run.train.front()["step"];
    j["last_step"] = run.train.back()["step"];
  }
  if (run.status) j["state"] = run.status->value("state", "unknown");
  return j;
}

std::string format_summary(const nlohmann::json& s) {
  std::string out = fmt::format(
      "run {} ({}): {} logged steps", strings::printable(s["run"].get<std::string>()),
      strings::printable(s["folder"].get<std::string>()), s["logged_steps"].get<size_t>());
  if (s.contains("first_step")) {
    out +=
        fmt::format(", steps {}-{}", s["first_step"].get<int64_t>(), s["last_step"].get<int64_t>());
  }
  if (s.contains("state")) out += ", " + s["state"].get<std::string>();
  out += "\n";
  out += fmt::format("  {:<24} {:>11} {:>11} {:>8} {:>11} {:>11} {:>11}\n", "metric", "last",
                     "best", "@step", "mean", "min", "max");
  for (const auto& [key, m] : s["metrics"].items()) {
    const bool has_best = m.contains("best");
    out += fmt::format("  {:<24} {:>11} {:>11} {:>8} {:>11} {:>11} {:>11}\n",
                       strings::printable(key), number(m["last"].get<double>()),
                       has_best ? number(m["best"].get<double>()) : "-",
                       has_best ? fmt::format("{:.0f}", m["best_step"].get<double>()) : "-",
                       number(m["mean"].get<double>()), number(m["min"].get<double>()),
                       number(m["max"].get<double>()));
  }
  return out;
}

}  // namespace loom::metrics
