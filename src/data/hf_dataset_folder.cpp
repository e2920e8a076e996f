#include "loom/data/hf_dataset_folder.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"
#include "loom/core/strings.h"

namespace loom::data {

namespace fs = std::filesystem;

bool is_hf_dataset_folder(const std::string& folder) {
  std::error_code error;
  // dataset_info.json too: a save_to_disk folder that lost its state.json is still one, and is
  // refused naming what is missing (read as a plain folder, dataset_info.json was blamed).
  return fs::is_regular_file(fs::path(folder) / "state.json", error) ||
         fs::is_regular_file(fs::path(folder) / "dataset_dict.json", error) ||
         fs::is_regular_file(fs::path(folder) / "dataset_info.json", error);
}

std::vector<std::string> hf_dataset_folder_files(const std::string& folder) {
  const fs::path root(folder);
  std::error_code error;
  if (fs::is_regular_file(root / "dataset_dict.json", error)) {
    const auto dict =
        json::read_file_strict((root / "dataset_dict.json").string(), "dataset_dict.json");
    std::vector<std::string> splits;
    if (dict.contains("splits") && dict["splits"].is_array()) {
      for (const auto& split : dict["splits"]) {
        if (split.is_string()) splits.push_back((root / split.get<std::string>()).string());
      }
    }
    LOOM_THROW(InputError, "dataset path '", folder,
               "' is a Hugging Face DatasetDict (dataset_dict.json); name one of its splits: ",
               strings::join(splits, ", "));
  }
  const std::string state_path = (root / "state.json").string();
  LOOM_CHECK_AS(InputError, fs::is_regular_file(state_path, error), "dataset path '", folder,
                "' is a Hugging Face `datasets` save_to_disk folder (it has dataset_info.json) "
                "without its state.json, which lists the .arrow files in order; save it again, "
                "or name its .arrow files (a glob such as '",
                (root / "data-*.arrow").string(), "')");
  const auto state = json::read_file_strict(state_path, "datasets state.json");
  LOOM_CHECK_AS(InputError,
                state.is_object() && state.contains("_data_files") &&
                    state["_data_files"].is_array() && !state["_data_files"].empty(),
                state_path,
                ": expected a `datasets` save_to_disk state with a non-empty \"_data_files\" list");
  std::vector<std::string> files;
  for (const auto& entry : state["_data_files"]) {
    LOOM_CHECK_AS(InputError,
                  entry.is_object() && entry.contains("filename") && entry["filename"].is_string(),
                  state_path, ": a \"_data_files\" entry has no \"filename\"");
    const std::string name = entry["filename"].get<std::string>();
    // Names only: a state.json must not point outside its folder.
    LOOM_CHECK_AS(
        InputError, files::is_contained_relative_path(name) && strings::ends_with(name, ".arrow"),
        state_path, ": \"_data_files\" names '", name, "', expected an .arrow file in the folder");
    files.push_back((root / name).string());
  }
  return files;
}

}  // namespace loom::data
