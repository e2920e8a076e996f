#include "loom/metrics/watch.h"
#include "loom/core/strings.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <sstream>
#include <utility>
#include <vector>

namespace loom::metrics {
namespace {

std::string duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  // Steps of a fraction of a second (the debug model on CPU) keep their digits.
  if (seconds < 1) return fmt::format("{:.2f}s", seconds);
  if (seconds < 10) return fmt::format("{:.1f}s", seconds);
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// Whether the process the status file names is gone (only knowable on its own host).
bool process_gone(const nlohmann::json& status) {
  if (status.value("host", "") != host_name()) return false;
  const auto pid = static_cast<pid_t>(status.value("pid", int64_t{0}));
  return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
}

double last_value(const std::vector<nlohmann::json>& lines, const char* key) {
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (it->contains(key) && (*it)[key].is_number()) return (*it)[key].get<double>();
  }
  return NAN;
}

std::vector<double> values(const std::vector<nlohmann::json>& lines, const char* key) {
  std::vector<double> out;
  for (const auto& [x, y] : series(lines, key, false)) out.push_back(y);
  return out;
}

// Median wall time between consecutive logged steps, per step.
double median_step_interval(const RunLog& run) {
  std::vector<double> per_step;
  for (size_t i = 1; i < run.train.size(); ++i) {
    const auto& a = run.train[i - 1];
    const auto& b = run.train[i];
    const double steps = b["step"].get<double>() - a["step"].get<double>();
    const double dt = b.value("wall_time", 0.0) - a.value("wall_time", 0.0);
    if (steps > 0 && dt > 0) per_step.push_back(dt / steps);
  }
  if (!per_step.empty()) return median(per_step);
  return run.train.empty() ? 0 : run.train.back().value("step_time_s", 0.0);
}

int64_t total_steps(const RunLog& run) {
  return run.status ? run.status->value("total_steps", int64_t{0}) : 0;
}

// Columns a line takes on a terminal: UTF-8 code points (the sparkline's blocks are one column
// each), without color escapes.
size_t columns(const std::string& text) {
  size_t n = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\033') {
      while (i < text.size() && text[i] != 'm') ++i;
      continue;
    }
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) ++n;
  }
  return n;
}

}  // namespace

std::string wrap_lines(const std::string& text, int width) {
  std::string out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (width <= 0 || static_cast<int>(columns(line)) <= width) {
      out += line + "\n";
      continue;
    }
    // Pieces with the spaces before them: fields (two spaces apart, "memory 0.62 GiB") stay
    // whole; a field too long for a line breaks between its words.
    const size_t indent = std::min(line.find_first_not_of(' '), line.size());
    const size_t room = static_cast<size_t>(width) > indent + 2 ? width - indent - 2 : 1;
    std::vector<std::pair<std::string, std::string>> pieces;
    for (size_t at = indent; at < line.size();) {
      const size_t start = line.find_first_not_of(' ', at);
      if (start == std::string::npos) break;
      const size_t end = std::min(line.find("  ", start), line.size());
      const std::string field = line.substr(start, end - start);
      std::string gap = line.substr(at, start - at);
      if (columns(field) <= room) {
        pieces.emplace_back(gap, field);
      } else {
        std::istringstream words(field);
        for (std::string word; words >> word; gap = " ") pieces.emplace_back(gap, word);
      }
      at = end;
    }
    // Continuation lines are indented two more than the line.
    std::string current = line.substr(0, indent);
    size_t pieces_from = indent;  // where the pieces of `current` begin
    for (const auto& [gap, piece] : pieces) {
      if (current.size() > pieces_from &&
          static_cast<int>(columns(current) + gap.size() + columns(piece)) > width) {
        out += current + "\n";
        current = std::string(indent + 2, ' ');
        pieces_from = current.size();
      }
      current += (current.size() > pieces_from ? gap : "") + piece;
    }
    out += current + "\n";
  }
  return out;
}

std::string sparkline(const std::vector<double>& all, int width) {
  static const char* blocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  std::vector<double> v;
  for (double x : all) {
    if (std::isfinite(x)) v.push_back(x);
  }
  if (v.size() > static_cast<size_t>(width)) v.erase(v.begin(), v.end() - width);
  if (v.empty()) return "";
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  std::string out;
  for (double x : v) {
    const int level = *hi > *lo ? static_cast<int>(std::lround((x - *lo) / (*hi - *lo) * 7)) : 3;
    out += blocks[std::clamp(level, 0, 7)];
  }
  return out;
}

RunState run_state(const RunLog& run, double now, const WatchOptions& options) {
  const std::string state = run.status ? run.status->value("state", "") : "";
  const int64_t step = run.train.empty() ? 0 : run.train.back()["step"].get<int64_t>();
  if (state == "finished") return {"FINISHED", fmt::format("FINISHED at step {}", step)};
  if (state == "stopped") {
    return {"STOPPED", fmt::format("STOPPED by a signal after step {} (resume from its last "
                                   "checkpoint)",
                                   step)};
  }
  if (state == "failed") {
    return {"FAILED", fmt::format("FAILED after step {} (the run's log says why)", step)};
  }
  if (run.train.empty()) return {"WAITING", "WAITING for the first logged step"};
  if (run.status && process_gone(*run.status)) {
    return {"STOPPED", fmt::format("STOPPED: process {} is gone (killed?) after step {}",
                                   run.status->value("pid", int64_t{0}), step)};
  }
  const double since = now - run.train.back().value("wall_time", now);
  const double interval = median_step_interval(run);
  const int64_t log_gap =
      run.train.size() > 1 ? step - run.train[run.train.size() - 2]["step"].get<int64_t>() : 1;
  // Expected time to the next logged line: log_freq steps of the median step time.
  const double expected = interval * static_cast<double>(std::max<int64_t>(log_gap, 1));
  if (expected > 0 && since > options.stall_factor * expected) {
    return {"STALLED",
            fmt::format("STALLED: no new step for {} ({:.0f}x the median {} between logged "
                        "steps); a hang? try `loom debug hang {}` after SIGUSR1 to the launcher",
                        duration(since), since / expected, duration(expected), run.folder)};
  }
  return {"RUNNING", fmt::format("RUNNING: last step {} ago", duration(since))};
}

std::string render_watch(const std::vector<RunLog>& runs, double now, const WatchOptions& options) {
  const bool c = options.color;
  const char* bold = c ? "\033[1m" : "";
  const char* reset = c ? "\033[0m" : "";
  std::string out;
  for (const auto& run : runs) {
    const RunState state = run_state(run, now, options);
    const char* tint = !c                                                    ? ""
                       : state.word == "RUNNING" || state.word == "FINISHED" ? "\033[32m"
                                                                             : "\033[31m";
    const int64_t step = run.train.empty() ? 0 : run.train.back()["step"].get<int64_t>();
    const int64_t total = total_steps(run);
    out += fmt::format("{}{}{}  ({})\n", bold, strings::printable(run.name), reset,
                       strings::printable(run.folder));
    if (total > 0) {
      const double fraction =
          std::clamp(static_cast<double>(step) / static_cast<double>(total), 0.0, 1.0);
      const int filled = static_cast<int>(fraction * 30);
      std::string bar = std::string(static_cast<size_t>(filled), '#') +
                        std::string(static_cast<size_t>(30 - filled), '.');
      const double eta = static_cast<double>(total - step) * median_step_interval(run);
      out += fmt::format("  step {}/{} [{}] {:.1f}%  ETA {}\n", step, total, bar, 100 * fraction,
                         state.word == "RUNNING" ? duration(eta) : "-");
    } else {
      out += fmt::format("  step {}\n", step);
    }
    out += fmt::format("  {}{}{}\n", tint, state.line, reset);
    if (run.train.empty()) continue;
    const int w = options.sparkline_width;
    out += fmt::format("  loss      {:>10.4f}  {}\n", last_value(run.train, "loss"),
                       sparkline(values(run.train, "loss"), w));
    out += fmt::format("  tps       {:>10.0f}  {}\n", last_value(run.train, "tps"),
                       sparkline(values(run.train, "tps"), w));
    if (!run.validation.empty()) {
      out += fmt::format("  val_loss  {:>10.4f}  at step {}  {}\n",
                         last_value(run.validation, "val_loss"),
                         run.validation.back()["step"].get<int64_t>(),
                         sparkline(values(run.validation, "val_loss"), w));
    }
    out += fmt::format(
        "  lr {:.3g}  grad_norm {:.4f}  mfu {:.2f}%  memory {:.2f} GiB  step {:.3f} s  data "
        "{:.1f}%  tokens {:.0f}\n",
        last_value(run.train, "lr"), last_value(run.train, "grad_norm"),
        last_value(run.train, "mfu_pct"), last_value(run.train, "mem_peak_gib"),
        last_value(run.train, "step_time_s"), last_value(run.train, "data_time_pct"),
        last_value(run.train, "tokens_seen"));
    out += "\n";
  }
  // Several runs: the loss of each at the latest step they all reached.
  if (runs.size() > 1) {
    int64_t common = INT64_MAX;
    for (const auto& run : runs) {
      common = std::min<int64_t>(common,
                                 run.train.empty() ? 0 : run.train.back()["step"].get<int64_t>());
    }
    std::string line = fmt::format("compare at step {}:", common);
    for (const auto& run : runs) {
      double loss = NAN;
      for (const auto& l : run.train) {
        // A skipped step's loss may be null (training.skip_nonfinite_steps).
        if (l["step"].get<int64_t>() <= common) {
          loss = l.contains("loss") && l["loss"].is_number() ? l["loss"].get<double>() : NAN;
        }
      }
      line += fmt::format("  {} loss {:.4f}", strings::printable(run.name), loss);
    }
    out += line + "\n";
  }
  return wrap_lines(out, options.width);
}

}  // namespace loom::metrics
