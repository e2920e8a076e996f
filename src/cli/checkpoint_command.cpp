// loom checkpoint inspect DIR [--verify]: what a checkpoint folder holds. DIR is a step folder
// (step-N) or a run's checkpoint folder (every step-N in it, complete or not).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <memory>
#include <regex>

#include "commands.h"
#include "loom/checkpoint/chunks.h"
#include "loom/checkpoint/manager.h"
#include "loom/core/check.h"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

std::string dims(const nlohmann::json& values, const char* separator) {
  std::string text;
  for (const auto& v : values) text += (text.empty() ? "" : separator) + v.dump();
  return text;
}

void print_step(const std::string& folder, bool verify) {
  const bool complete = checkpoint::is_complete_step(folder);
  if (!fs::exists(folder + "/index.json")) {
    std::cout << folder << ": INCOMPLETE (no index.json: a save that never finished)\n";
    return;
  }
  checkpoint::CheckpointReader reader(folder);
  const auto& index = reader.index();
  std::cout << fmt::format("{}: step {}, {}, written by {} rank(s) (dp {}), {}\n", folder,
                           index.value("step", -1),
                           complete ? "complete" : "INCOMPLETE (no COMPLETE marker)",
                           index.value("world_size", 0), index.value("dp_size", 0),
                           index.value("model_only", false) ? "model weights only"
                                                            : "model + optimizer + training state");
  uint64_t bytes = 0;
  for (const auto& [name, size] : index["files"].items()) bytes += size.get<uint64_t>();
  std::cout << fmt::format("  {} tensors in {} file(s), {:.1f} MB\n", index["tensors"].size(),
                           index["files"].size(), bytes / 1e6);
  for (const auto& [fqn, t] : index["tensors"].items()) {
    std::cout << fmt::format("  {:<52} {:<5} [{}]\n", fqn, t["dtype"].get<std::string>(),
                             dims(t["shape"], ", "));
    for (const auto& c : t["chunks"]) {
      std::cout << fmt::format("      at [{}] size [{}] in {} bytes {}-{}\n",
                               dims(c["offsets"], ", "), dims(c["lengths"], ", "),
                               c["file"].get<std::string>(), c["byte_range"][0].dump(),
                               c["byte_range"][1].dump());
    }
    if (verify) reader.read_whole(fqn);  // checks every chunk's CRC-32
  }
  if (verify) std::cout << "  every chunk matches its CRC-32\n";
}

int inspect(const std::string& dir, bool verify) {
  LOOM_CHECK_AS(InputError, fs::is_directory(dir), "checkpoint inspect: '", dir,
                "' is not a folder");
  if (fs::exists(dir + "/index.json") || fs::exists(dir + "/COMPLETE")) {
    print_step(dir, verify);
    return 0;
  }
  static const std::regex pattern("step-([0-9]+)(\\.tmp)?");
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, pattern)) {
      steps.emplace_back(std::stoll(match[1].str()), entry.path().string());
    }
  }
  LOOM_CHECK_AS(InputError, !steps.empty(), "checkpoint inspect: '", dir,
                "' is neither a step folder nor a folder of step-N checkpoints");
  std::sort(steps.begin(), steps.end());
  for (const auto& [step, path] : steps) print_step(path, verify);
  return 0;
}

}  // namespace

void add_checkpoint_command(CLI::App& app, CommandRun& run) {
  CLI::App* command = app.add_subcommand("checkpoint", "Inspect checkpoints");
  command->require_subcommand(1);
  struct State {
    std::string dir;
    bool verify = false;
  };
  auto state = std::make_shared<State>();
  CLI::App* inspect_command = command->add_subcommand(
      "inspect", "List a checkpoint's tensors, shapes, dtypes, chunks and completeness");
  inspect_command->add_option("dir", state->dir, "A step-N folder or a run's checkpoint folder")
      ->required();
  inspect_command->add_flag("--verify", state->verify, "Read every chunk and check its CRC-32");
  inspect_command->callback(
      [state, &run] { run = [state] { return inspect(state->dir, state->verify); }; });
}

}  // namespace loom::cli
