// loom debug hang DUMP_FOLDER [--format text|json]: merges the ranks' flight-recorder dumps
// (<dump_folder>/comm_traces/rank_<r>.json) and names the rank(s) and the collective where the
// job diverged (distributed/hang_report.h). With --lighthouse HOST:PORT (fault-tolerant replica
// groups) it also asks the lighthouse which group holds up the quorum.
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>
#include <memory>

#include "commands.h"
#include "loom/distributed/hang_report.h"
#include "loom/distributed/lighthouse.h"

namespace loom::cli {
namespace {

// The lighthouse's open round in words: who it waits for, and since when they were heard from.
std::string describe_lighthouse(const nlohmann::json& status, const std::string& address) {
  std::string text =
      "lighthouse " + address + ": " + status.value("status", "no status yet") + "\n";
  for (const auto& id : status.value("holding_up", nlohmann::json::array())) {
    const std::string key = std::to_string(id.get<int64_t>());
    text += "  replica group " + key + " holds up the quorum: it beats (last heartbeat " +
            std::to_string(status["heartbeat_age_ms"].value(key, int64_t{-1})) +
            " ms ago) but has not asked for its next step (look at that group's ranks)\n";
  }
  for (const auto& [replica, step] : status.value("asked", nlohmann::json::object()).items()) {
    text += "  replica group " + replica + " waits at step " + step.dump() + "\n";
  }
  return text;
}

int debug_hang(const std::string& folder, const std::string& format,
               const std::optional<std::string>& lighthouse) {
  if (lighthouse) {
    const auto status = distributed::read_lighthouse_status(*lighthouse, std::chrono::seconds(10));
    if (format == "json") {
      std::cout << status.dump(2) << "\n";
    } else {
      std::cout << describe_lighthouse(status, *lighthouse);
    }
    if (folder.empty()) return 0;
  }
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
    std::optional<std::string> lighthouse;
  };
  auto state = std::make_shared<State>();
  CLI::App* hang = command->add_subcommand(
      "hang",
      "Merge the ranks' flight-recorder dumps and name the rank(s) and collective where the job "
      "diverged");
  hang->add_option(
      "dump_folder", state->folder,
      "The job's dump folder (or its comm_traces/ folder); optional with --lighthouse");
  hang->add_option("--lighthouse", state->lighthouse,
                   "Fault-tolerant replica groups: ask this lighthouse (HOST:PORT) which group "
                   "holds up the quorum");
  hang->add_option("--format", state->format, "text or json")
      ->check(CLI::IsMember({"text", "json"}));
  hang->callback([state, hang, &run] {
    if (state->folder.empty() && !state->lighthouse) {
      throw CLI::RequiredError("dump_folder (or --lighthouse)");
    }
    run = [state] { return debug_hang(state->folder, state->format, state->lighthouse); };
  });
}

}  // namespace loom::cli
