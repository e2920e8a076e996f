// Helpers of the Hugging Face family tests (a folder made by transformers, loaded by loom).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/generate/generator.h"
#include "loom/generate/inference_model.h"
#include "support/process.h"

namespace loom::testing {

inline std::map<std::string, at::Tensor> tensors_of(const std::string& file) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, tensor] : checkpoint::load_safetensors(file).tensors) out[name] = tensor;
  return out;
}

// A Hugging Face folder as loom's inference model on the CPU (byte tokenizer), of `family`.
inline generate::InferenceModel load_hf_folder(const std::string& folder,
                                               const std::string& family) {
  generate::ModelSource source;
  source.checkpoint = folder;
  source.tokenizer = "byte";
  source.device = "cpu";
  auto model = generate::load_inference_model(source);
  EXPECT_EQ(model.spec->name, family);
  EXPECT_EQ(model.format, "huggingface");
  return model;
}

#ifdef LOOM_PYTHON
// The folders tools/`script` writes with the test venv's transformers (one per variant), made
// once per test binary run into a fresh `name` folder.
inline std::vector<std::string> made_by_transformers(const std::string& script,
                                                     const std::string& name,
                                                     const std::vector<std::string>& variants) {
  static std::map<std::string, std::string> made;  // script -> its output folder
  auto it = made.find(script);
  if (it == made.end()) {
    const std::string out = fresh_temp_dir(name);
    const auto result = run_command(std::string("'") + LOOM_PYTHON + "' '" + LOOM_SOURCE_DIR +
                                    "/tools/" + script + "' '" + out + "'");
    if (result.exit_code != 0) throw std::runtime_error(script + " failed:\n" + result.output);
    it = made.emplace(script, out).first;
  }
  std::vector<std::string> folders;
  for (const auto& variant : variants) folders.push_back(it->second + "/" + variant);
  return folders;
}
#endif

// Imports a Hugging Face folder, exports the imported step again in float32, and checks that
// every tensor of the folder comes back bitwise under its name (and nothing else does). Returns
// the export's folder.
inline std::string expect_import_export_bitwise(const std::string& folder,
                                                const std::string& name) {
  const std::string checkpoint = fresh_temp_dir(name + "_ckpt");
  checkpoint::import_from_hf(folder, checkpoint);
  const std::string exported = fresh_temp_dir(name + "_export");
  checkpoint::HfExportOptions options;
  options.overwrite = true;
  options.dtype = "float32";
  checkpoint::export_to_hf(checkpoint + "/step-0", exported, options);
  const auto original = tensors_of(folder + "/model.safetensors");
  const auto back = tensors_of(exported + "/model.safetensors");
  EXPECT_EQ(original.size(), back.size()) << folder;
  for (const auto& [tensor_name, tensor] : original) {
    auto it = back.find(tensor_name);
    if (it == back.end()) {
      ADD_FAILURE() << folder << ": " << tensor_name << " is not in the export";
      continue;
    }
    EXPECT_TRUE(at::equal(tensor, it->second)) << folder << ": " << tensor_name;
  }
  return exported;
}

inline std::vector<int32_t> row_of(const at::Tensor& ids) {
  const at::Tensor row = ids.reshape({-1}).to(at::kInt).contiguous();
  return std::vector<int32_t>(row.data_ptr<int32_t>(), row.data_ptr<int32_t>() + row.numel());
}

// Greedy decoding with loom's cache from a family test's reference: its `prompt`, as many new
// tokens as its `greedy` holds (transformers' generate()), no BOS, no stop at EOS.
inline std::vector<int32_t> greedy_tokens(generate::InferenceModel& model,
                                          const std::map<std::string, at::Tensor>& reference) {
  generate::GenerationOptions options;
  options.max_new_tokens = reference.at("greedy").numel();
  options.stop_at_eos = false;
  options.add_bos = false;
  generate::Generator generator(model, options);
  const auto completions = generator.generate({row_of(reference.at("prompt"))}, 0);
  EXPECT_EQ(completions.size(), 1u);
  return completions.empty() ? std::vector<int32_t>{} : completions[0].tokens;
}

}  // namespace loom::testing
