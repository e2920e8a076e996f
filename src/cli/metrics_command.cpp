// loom metrics watch DUMP_FOLDER [--compare DIR2 ...]: live terminal view of running jobs.
// loom metrics plot DUMP_FOLDER... -o FILE.svg [--x tokens]: loss, lr, tps, memory as an SVG.
// loom metrics summary DUMP_FOLDER [--format json]: last, best and mean of every metric.
#include <sys/ioctl.h>
#include <unistd.h>
#include <cmath>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/clock.h"
#include "loom/core/files.h"
#include "loom/core/signals.h"
#include "loom/metrics/plot.h"
#include "loom/metrics/run_log.h"
#include "loom/metrics/summary.h"
#include "loom/metrics/watch.h"

namespace loom::cli {
namespace {

std::vector<metrics::RunLog> read_runs(const std::vector<std::string>& folders) {
  std::vector<metrics::RunLog> runs;
  for (const auto& folder : folders) runs.push_back(metrics::read_run(folder));
  return runs;
}

// The terminal's width: its window size, else $COLUMNS, else 80.
int terminal_columns(bool tty) {
  struct winsize size {};
  if (tty && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    return size.ws_col;
  }
  if (const char* columns = std::getenv("COLUMNS")) {
    const int n = std::atoi(columns);
    if (n > 0) return n;
  }
  return 80;
}

struct WatchArgs {
  std::string folder;
  std::vector<std::string> compare;
  double interval_s = 2;
  double stall_factor = 5;
  bool once = false;
};

// Redraws until Ctrl-C (SIGINT/SIGTERM), or prints once with --once. Colors and screen clearing
// only on a terminal.
int watch(const WatchArgs& args) {
  signals::install_shutdown_handlers();
  std::vector<std::string> folders{args.folder};
  folders.insert(folders.end(), args.compare.begin(), args.compare.end());
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  metrics::WatchOptions options;
  options.stall_factor = args.stall_factor;
  options.color = tty;
  while (true) {
    options.width = terminal_columns(tty);  // follows a resized window
    const auto runs = read_runs(folders);
    const std::string screen = metrics::render_watch(runs, now_unix(), options);
    std::cout << (tty ? "\033[H\033[2J" : "") << "loom metrics watch (every " << args.interval_s
              << " s; Ctrl-C quits)\n\n"
              << screen << std::flush;
    if (args.once || signals::shutdown_requested()) return 0;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(args.interval_s);
    while (std::chrono::steady_clock::now() < deadline && !signals::shutdown_requested()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (signals::shutdown_requested()) return 0;
  }
}

int plot(const std::vector<std::string>& folders, const std::string& output, bool by_tokens) {
  LOOM_CHECK_AS(InputError, output.size() > 4 && output.substr(output.size() - 4) == ".svg",
                "metrics plot: -o must name an .svg file, got '", output, "'");
  metrics::PlotOptions options;
  options.by_tokens = by_tokens;
  files::write_atomic(output, metrics::plot_svg(read_runs(folders), options));
  std::cout << "wrote " << output << "\n";
  return 0;
}

int summary(const std::vector<std::string>& folders, const std::string& format) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& run : read_runs(folders)) {
    const auto s = metrics::summarize(run);
    if (format == "json") {
      all.push_back(s);
    } else {
      std::cout << metrics::format_summary(s);
    }
  }
  if (format == "json") std::cout << (all.size() == 1 ? all[0] : all).dump(2) << "\n";
  return 0;
}

}  // namespace

void add_metrics_command(CLI::App& app, CommandRun& run) {
  CLI::App* command =
      app.add_subcommand("metrics", "Read a run's metrics: live view, SVG plots, summary");
  command->require_subcommand(1);

  auto w = std::make_shared<WatchArgs>();
  CLI::App* watch_command = command->add_subcommand(
      "watch", "Live view of a running job: latest values, sparklines, ETA, stalled/stopped");
  watch_command->add_option("dump_folder", w->folder, "The run's job.dump_folder")->required();
  watch_command->add_option("--compare", w->compare, "More runs to show beside it");
  watch_command->add_option("--interval", w->interval_s, "Seconds between redraws, 0.05 to 3600")
      ->type_name("SECONDS")
      ->check(finite_range(0.05, 3600.0));
  watch_command
      ->add_option("--stall-factor", w->stall_factor,
                   "Stalled after this many median step intervals without a new step (>= 1)")
      ->type_name("FACTOR")
      ->check(finite_range(1.0, 1e6));
  watch_command->add_flag("--once", w->once, "Print one screen and exit");
  watch_command->callback([w, &run] { run = [w] { return watch(*w); }; });

  struct PlotArgs {
    std::vector<std::string> folders;
    std::string output;
    std::string x = "step";
  };
  auto p = std::make_shared<PlotArgs>();
  CLI::App* plot_command = command->add_subcommand(
      "plot", "Loss (and val_loss), lr, tps and memory of one or more runs as one SVG");
  plot_command->add_option("dump_folders", p->folders, "Runs' job.dump_folder")->required();
  plot_command->add_option("-o,--output", p->output, "The SVG file to write")->required();
  plot_command->add_option("--x", p->x, "x axis: step or tokens")
      ->check(CLI::IsMember({"step", "tokens"}));
  plot_command->callback(
      [p, &run] { run = [p] { return plot(p->folders, p->output, p->x == "tokens"); }; });

  struct SummaryArgs {
    std::vector<std::string> folders;
    std::string format = "text";
  };
  auto s = std::make_shared<SummaryArgs>();
  CLI::App* summary_command = command->add_subcommand(
      "summary", "Last, best, mean, min and max of every metric a run logged");
  summary_command->add_option("dump_folders", s->folders, "Runs' job.dump_folder")->required();
  summary_command->add_option("--format", s->format, "text or json")
      ->check(CLI::IsMember({"text", "json"}));
  summary_command->callback([s, &run] { run = [s] { return summary(s->folders, s->format); }; });
}

}  // namespace loom::cli
