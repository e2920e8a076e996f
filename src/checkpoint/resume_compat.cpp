#include "loom/checkpoint/resume_compat.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "loom/config/dump.h"
#include "loom/config/loader.h"
#include "loom/core/check.h"
#include "loom/core/logging.h"

namespace loom::checkpoint {
namespace {

void flatten(const nlohmann::json& value, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  if (value.is_object()) {
    for (const auto& [key, child] : value.items()) {
      flatten(child, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  out[prefix] = value.dump();
}

// What a changed key means for the part of the checkpoint that depends on it.
struct Dependency {
  const char* key;
  const char* part;  // the exclude_from_loading name of the state that cannot follow
  const char* meaning;
};

constexpr Dependency kDependencies[] = {
    {"model.name", "model", "the saved weights belong to another model"},
    {"model.flavor", "model", "the saved weights have other shapes"},
    {"model.num_mtp_layers", "model",
     "the saved weights hold another number of multi-token prediction modules"},
    {"model.tokenizer_path", "dataloader",
     "the token ids change, so the data loader's position points into another token stream"},
    {"model.hf_assets_path", "dataloader",
     "the tokenizer may change, so the data loader's position may point into another token "
     "stream"},
    {"training.seq_len", "dataloader",
     "the data loader's position counts windows of seq_len + 1 tokens and cannot follow a new "
     "seq_len"},
    {"training.dataset", "dataloader", "the data loader's position is in another dataset"},
    {"training.dataset_path", "dataloader", "the data loader's position is in other files"},
    {"training.dataset_text_field", "dataloader",
     "another field of each record is tokenized, so the data loader's position points into "
     "another token stream"},
    {"training.dataset_mixture", "dataloader", "the data loader's position is in another mixture"},
    {"debug.seed", "dataloader", "the data order is drawn from the seed"},
    {"optimizer.name", "optimizer",
     "the saved optimizer state belongs to another optimizer (its state tensors mean nothing to "
     "this one)"},
};

bool excluded(const config::JobConfig& config, const std::string& part) {
  const auto& list = config.checkpoint.exclude_from_loading;
  return std::find(list.begin(), list.end(), part) != list.end();
}

}  // namespace

std::vector<ConfigChange> config_changes(const config::JobConfig& saved,
                                         const config::JobConfig& current) {
  std::map<std::string, std::string> before, after;
  flatten(nlohmann::json::parse(config::to_json(saved)), "", before);
  flatten(nlohmann::json::parse(config::to_json(current)), "", after);
  std::vector<ConfigChange> changes;
  for (const auto& [key, value] : after) {
    auto it = before.find(key);
    const std::string old = it == before.end() ? "(unset)" : it->second;
    if (old != value) changes.push_back({key, old, value});
  }
  return changes;
}

std::vector<std::string> resume_conflicts(const std::vector<ConfigChange>& changes,
                                          const config::JobConfig& current, bool model_only) {
  std::vector<std::string> conflicts;
  for (const auto& change : changes) {
    // A run saved before its drawn seed was recorded: which seed it drew is unknown, and the data
    // loader's own state says whether its order depends on one.
    if (change.key == "debug.seed" && (change.saved == "null" || change.saved == "(unset)")) {
      continue;
    }
    for (const auto& dependency : kDependencies) {
      if (change.key != dependency.key) continue;
      const std::string part = dependency.part;
      if (excluded(current, part) || (model_only && part != "model")) continue;
      std::string what = change.key + " " + change.saved + " -> " + change.current + ": " +
                         dependency.meaning + "; ";
      if (part == "model") {
        what += "resume with the old value, or start the new model in another job.dump_folder";
      } else if (part == "optimizer") {
        what +=
            "to keep the weights and start the new optimizer's state fresh, set "
            "checkpoint.exclude_from_loading = [\"optimizer\"] (CLI: "
            "--checkpoint.exclude_from_loading optimizer)";
      } else {
        what +=
            "to keep the weights and optimizer but restart the data from its beginning, "
            "set checkpoint.exclude_from_loading = [\"dataloader\"] (CLI: "
            "--checkpoint.exclude_from_loading dataloader)";
      }
      conflicts.push_back(what);
    }
  }
  return conflicts;
}

std::optional<config::JobConfig> check_resume_compatible(const std::string& step_folder,
                                                         const config::JobConfig& current,
                                                         bool model_only) {
  const std::string path = step_folder + "/config.toml";
  if (!std::filesystem::exists(path)) return std::nullopt;  // a Hugging Face import or older
  config::JobConfig saved;
  try {
    saved = config::load_job_config(path, {}).config;
    // Read back, the saved config names its own file; where a config came from is no state.
    saved.job.config_file = current.job.config_file;
  } catch (const Error& e) {
    log::get("checkpoint")
        ->warn("cannot compare with the config saved in {} ({}); resuming anyway", path,
               e.message());
    return std::nullopt;
  }
  const auto changes = config_changes(saved, current);
  const auto conflicts = resume_conflicts(changes, current, model_only);
  if (!conflicts.empty()) {
    std::string text;
    for (const auto& c : conflicts) text += "\n  " + c;
    LOOM_THROW(
        InputError, "cannot resume from ", step_folder,
        ": the config changed in ways the checkpoint cannot follow:", text,
        "\n(the checkpoint is intact: older checkpoints share the change, so none is tried)");
  }
  if (changes.empty()) return saved;
  std::string text;
  for (const auto& c : changes) text += "; " + c.key + " " + c.saved + " -> " + c.current;
  log::get("checkpoint")
      ->info("config changed since {} (the checkpoint's state can follow): {}", step_folder,
             text.substr(2));
  return saved;
}

}  // namespace loom::checkpoint
