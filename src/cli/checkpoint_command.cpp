// loom checkpoint inspect DIR [--verify]: what a checkpoint folder holds. DIR is a step folder
// (step-N) or a run's checkpoint folder (every step-N in it, complete or not).
// loom checkpoint export --to hf DIR OUT / import --from hf HF_DIR CHECKPOINT_FOLDER: Hugging
// Face interchange of any registered family (checkpoint/hf.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>

#include "commands.h"
#include "loom/checkpoint/chunks.h"
#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/manager.h"
#include "loom/core/check.h"
#include "loom/core/json.h"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

std::string dims(const nlohmann::json& values, const char* separator) {
  std::string text;
  for (const auto& v : values) text += (text.empty() ? "" : separator) + v.dump();
  return text;
}

// One screen: the model's parameters and what else the step holds, by group and dtype.
void print_summary(const std::string& folder, const nlohmann::json& index) {
  struct Group {
    int64_t tensors = 0, elements = 0;
    std::map<std::string, int64_t> dtypes;
  };
  std::map<std::string, Group> groups;  // "model", "optimizer.exp_avg", ...
  std::string largest;
  int64_t largest_elements = -1;
  for (const auto& [fqn, t] : index["tensors"].items()) {
    int64_t elements = 1;
    for (const auto& d : t["shape"]) elements *= d.get<int64_t>();
    // "model", "optimizer.exp_avg", "optimizer.exp_avg_sq", ...
    const size_t first_dot = fqn.find('.');
    const size_t dot = fqn.rfind("optimizer.", 0) == 0 ? fqn.find('.', first_dot + 1) : first_dot;
    const std::string group = fqn.substr(0, dot);
    auto& g = groups[group];
    ++g.tensors;
    g.elements += elements;
    ++g.dtypes[t["dtype"].get<std::string>()];
    if (group == "model" && elements > largest_elements) {
      largest_elements = elements;
      largest = fqn + " [" + dims(t["shape"], ", ") + "]";
    }
  }
  for (const auto& [name, g] : groups) {
    std::string dtypes;
    for (const auto& [dtype, n] : g.dtypes) dtypes += (dtypes.empty() ? "" : ", ") + dtype;
    std::cout << fmt::format("  {:<22} {:>5} tensors, {:>14} elements ({})\n", name, g.tensors,
                             fmt::format("{:L}", g.elements), dtypes);
  }
  if (!largest.empty()) std::cout << "  largest parameter: " << largest << "\n";
  if (fs::exists(folder + "/train_state.json")) {
    try {
      const auto state =
          json::read_file_strict(folder + "/train_state.json", "train state", uint64_t{1} << 24);
      std::cout << fmt::format("  train state: step {}, {} tokens seen\n", state.value("step", -1),
                               state.value("tokens_seen", int64_t{-1}));
    } catch (const std::exception&) {  // not a regular file, too big, not JSON, wrong types
      std::cout << "  train state: unreadable train_state.json\n";
    }
  }
  std::cout << "  (--tensors lists every tensor with its chunks)\n";
}

void print_step(const std::string& folder, bool verify, bool tensors) {
  const bool complete = checkpoint::is_complete_step(folder);
  if (!fs::exists(folder + "/index.json")) {
    std::cout << folder << ": INCOMPLETE (no index.json: a save that never finished)\n";
    return;
  }
  checkpoint::CheckpointReader reader(folder);
  const auto& index = reader.index();
  // The layout when the writers recorded it; older checkpoints know their data-parallel degree.
  const int world = index.value("world_size", 0);
  const std::string layout = index.contains("layout") && index["layout"].is_string()
                                 ? index["layout"].get<std::string>()
                                 : fmt::format("dp {}", index.value("dp_size", 0));
  std::cout << fmt::format("{}: step {}, {}, written by {} rank{} ({}), {}\n", folder,
                           index.value("step", -1),
                           complete ? "complete" : "INCOMPLETE (no COMPLETE marker)", world,
                           world == 1 ? "" : "s", layout,
                           index.value("model_only", false) ? "model weights only"
                                                            : "model + optimizer + training state");
  uint64_t bytes = 0;
  for (const auto& [name, file] : index["files"].items()) bytes += file["bytes"].get<uint64_t>();
  std::cout << fmt::format("  {} tensors in {} file(s), {:.1f} MB\n", index["tensors"].size(),
                           index["files"].size(), bytes / 1e6);
  if (!tensors) {
    print_summary(folder, index);
    if (verify) {
      for (const auto& [fqn, t] : index["tensors"].items()) reader.read_whole(fqn);
      std::cout << "  every chunk matches its CRC-32\n";
    }
    return;
  }
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

int inspect(const std::string& dir, bool verify, bool tensors) {
  LOOM_CHECK_AS(InputError, fs::is_directory(dir), "checkpoint inspect: '", dir,
                "' is not a folder");
  if (fs::exists(dir + "/index.json") || fs::exists(dir + "/COMPLETE")) {
    print_step(dir, verify, tensors);
    return 0;
  }
  static const std::regex pattern("step-([0-9]{1,18})(\\.tmp)?");
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
  for (const auto& [step, path] : steps) print_step(path, verify, tensors);
  return 0;
}

}  // namespace

void add_checkpoint_command(CLI::App& app, CommandRun& run) {
  CLI::App* command = app.add_subcommand("checkpoint", "Inspect, export and import checkpoints");
  command->require_subcommand(1);
  struct State {
    std::string dir;
    bool verify = false;
    bool tensors = false;
  };
  auto state = std::make_shared<State>();
  CLI::App* inspect_command = command->add_subcommand(
      "inspect",
      "Summarize a checkpoint (completeness, ranks, parameters, optimizer state, train state); "
      "--tensors lists every tensor with its chunks");
  inspect_command->add_option("dir", state->dir, "A step-N folder or a run's checkpoint folder")
      ->required();
  inspect_command->add_flag("--verify", state->verify, "Read every chunk and check its CRC-32");
  inspect_command->add_flag("--tensors", state->tensors,
                            "List every tensor: dtype, shape and each chunk's place");
  inspect_command->callback([state, &run] {
    run = [state] { return inspect(state->dir, state->verify, state->tensors); };
  });

  struct Transfer {
    std::string format = "hf";
    std::string source, target, dtype = "bfloat16";
    double max_shard_gb = 5.0;
    bool overwrite = false;
    std::string tokenizer;
  };
  auto transfer = std::make_shared<Transfer>();
  CLI::App* export_command = command->add_subcommand(
      "export",
      "Write a checkpoint's model and tokenizer as a Hugging Face folder (its family's "
      "transformers class)");
  export_command->add_option("--to", transfer->format, "Target format")
      ->check(CLI::IsMember({"hf"}))
      ->required();
  export_command->add_option("dir", transfer->source, "A step-N folder or a checkpoint folder")
      ->required();
  export_command->add_option("output", transfer->target, "Folder to write")->required();
  export_command->add_option("--dtype", transfer->dtype, "float32, bfloat16 or float16")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
  export_command
      ->add_option("--max-shard-size-gb", transfer->max_shard_gb,
                   "Split model.safetensors into shards of at most this size")
      ->check(finite_range(1e-6, 1e6))
      ->capture_default_str();
  export_command->add_flag("--overwrite", transfer->overwrite,
                           "Replace an earlier export's files in a non-empty output folder");
  export_command->add_option("--tokenizer", transfer->tokenizer,
                             "Tokenizer to ship (tokenizer.json, or brown_bpe); default: the "
                             "one the checkpoint's config.toml names");
  export_command->callback([transfer, &run] {
    run = [transfer] {
      checkpoint::HfExportOptions options;
      options.dtype = transfer->dtype;
      options.max_shard_bytes = static_cast<uint64_t>(transfer->max_shard_gb * 1e9);
      options.overwrite = transfer->overwrite;
      if (!transfer->tokenizer.empty()) options.tokenizer = transfer->tokenizer;
      checkpoint::export_to_hf(transfer->source, transfer->target, options);
      // Without one (a warning said why), the line says so rather than promising it.
      const bool with_tokenizer = std::filesystem::exists(transfer->target + "/tokenizer.json");
      std::cout << "wrote " << transfer->target << " (Hugging Face model folder"
                << (with_tokenizer ? " with its tokenizer" : ", no tokenizer") << ")\n";
      return 0;
    };
  });
  CLI::App* import_command = command->add_subcommand(
      "import", "Turn a Hugging Face folder into a loom checkpoint (step-0, weights only)");
  import_command->add_option("--from", transfer->format, "Source format")
      ->check(CLI::IsMember({"hf"}))
      ->required();
  import_command->add_option("dir", transfer->source, "Folder with config.json and safetensors")
      ->required();
  import_command
      ->add_option("output", transfer->target,
                   "Checkpoint folder to write step-0 into (use as "
                   "checkpoint.initial_load_path)")
      ->required();
  import_command->add_flag("--overwrite", transfer->overwrite,
                           "Replace an existing step-0 in the output folder");
  import_command->callback([transfer, &run] {
    run = [transfer] {
      checkpoint::import_from_hf(transfer->source, transfer->target, {}, nullptr,
                                 transfer->overwrite);
      std::cout << "wrote " << transfer->target << "/step-0\n";
      return 0;
    };
  });
}

}  // namespace loom::cli
