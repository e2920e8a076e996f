// loom debug hang DUMP_FOLDER [--format text|json]: merges the ranks' flight-recorder dumps
// (<dump_folder>/comm_traces/rank_<r>.json) and names the rank(s) and the collective where the
// job diverged (distributed/hang_report.h).
#include <iostream>
#include <memory>

#include "commands.h"
#include "loom/distributed/hang_report.h"

namespace loom::cli {
namespace {

int debug_hang(const std::string& folder, const std::string& format) {
  const auto report = distributed::analyze_hang(distributed::read_flight_dumps(folder));
  if (format == "json") {
    std::cout << distributed::to_json(report).dump(2) << "\n";
  } else {
    std::cout << report.summary;
  }
  return 0;
}

}  // namespace

void add_debug_command(CLI::App& app, CommandRun& run) {
  CLI::App* command = app.add_subcommand("debug", "Post-mortem tools for failed or hung jobs");
  command->require_subcommand(1);
  struct State {
    std::string folder;
    std::string format = "text";
  };
  auto state = std::make_shared<State>();
  CLI::App* hang = command->add_subcommand(
      "hang",
      "Merge the ranks' flight-recorder dumps and name the rank(s) and collective where the job "
      "diverged");
  hang->add_option("dump_folder", state->folder,
                   "The job's dump folder (or its comm_traces/ folder)")
      ->required();
  hang->add_option("--format", state->format, "text or json")
      ->check(CLI::IsMember({"text", "json"}));
  hang->callback(
      [state, &run] { run = [state] { return debug_hang(state->folder, state->format); }; });
}

}  // namespace loom::cli
