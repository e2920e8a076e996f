// A folder written by Hugging Face `datasets`' Dataset.save_to_disk: Arrow IPC files
// data-XXXXX-of-YYYYY.arrow listed in its state.json ("_data_files", in order), beside
// dataset_info.json. A DatasetDict's folder (dataset_dict.json, one sub-folder per split) is
// refused with the splits named: pick one.
#pragma once

#include <string>
#include <vector>

namespace loom::data {

// Whether `folder` holds a save_to_disk dataset (state.json) or dataset dict
// (dataset_dict.json).
bool is_hf_dataset_folder(const std::string& folder);

// The .arrow files of a save_to_disk folder, in the dataset's row order. Throws
// loom::InputError naming the folder and what is missing or malformed.
std::vector<std::string> hf_dataset_folder_files(const std::string& folder);

}  // namespace loom::data
